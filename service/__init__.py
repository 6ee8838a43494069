"""The online half of tandem: a FastAPI service that encodes queries with the student and searches a bundle.

`http/` (the app, routes, schemas, middleware, auth) over `core/` (the searcher, batching, the loader and its
reloads); `runtime/` (the process: `tandem serve`, uvicorn's configuration, workers, descriptors, heap, logs);
at the top what several of them read: settings, metrics, redaction, the collections' config and its reload.
"""
