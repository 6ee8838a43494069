"""Every request and response type of the HTTP API, one module per API (the OpenAPI document is built from them)."""
