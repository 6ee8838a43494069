"""The server process: `tandem serve` (`main`), uvicorn's configuration (`server`), several processes (`workers`),
file descriptors, the heap kept off full collections, and structured logs."""
