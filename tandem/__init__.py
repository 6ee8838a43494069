"""The `tandem` command line: one entry point over models, indexer and service."""
