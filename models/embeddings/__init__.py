"""The embedding store: the teacher's full-dim vectors of a corpus, kept once, shared by builds, updates, training.

`store` (the store and its keys), `shard_log` (the resumable log of shards a build has written).
"""
