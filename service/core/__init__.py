"""The serving core: admission and micro-batching, the searcher and its encoder, loading, leases and hot reload.

No HTTP in here: service.http imports the core, never the reverse.
"""
