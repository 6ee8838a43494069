"""Offline index builds: corpus → teacher embeddings → FAISS bundle, published atomically.

The commands at this level (`build`, `check`, `current`, `export`, `follow`, `verify`) and what every writer uses
(`options`, `publish`, `rootlock`, `writer`, `sample`, `pause`); by job: intake/ (reading a corpus or an import),
encoding/ (the teacher, here or on Ray), versions/ (updates, compaction and merges: the next version).
"""
