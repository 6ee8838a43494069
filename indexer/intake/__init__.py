"""What a build reads in: a corpus streamed into a staging docstore, or teacher embeddings computed elsewhere.

`ingest` (the corpus), `imported` (an import of embeddings) and `import_ids` (its `--ids` file, streamed).
"""
