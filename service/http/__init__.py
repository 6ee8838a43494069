"""The HTTP layer: the app factory, routes, schemas, middleware, errors, OpenAPI and auth, over service.core."""
