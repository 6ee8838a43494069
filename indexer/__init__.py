"""Offline index builds: corpus → teacher embeddings → FAISS bundle, published atomically."""
