"""Query vectors already encoded, kept for the next time the same query comes: a bounded LRU, one per service.

Why: the student's encode is most of a dense query's cost (docs/lab/2026-11-26-encode-floor.md), and real
traffic repeats queries (a search box's popular queries, a client retrying, pagination asking again). A hit
costs a dict lookup instead of an encode. Keys are (the partition of the API key whose request filled the entry,
the student's identity, the query as the student's tokenizer normalizes it), so two spellings the student cannot
tell apart share an entry, a student replaced on disk or served by another collection never answers for another, and
one key's questions are never hits for another: a hit is observable (`timing_ms.encode`, the latency), so a shared
entry would tell key A that key B asked the same question (issue 55). Each scoped key is its own partition (its
id), each legacy key too (its digest), and an API without keys one partition for everyone. Entries are float32
vectors of the teacher's width (3 KB at 768-d), so TANDEM_QUERY_CACHE entries bound the memory, shared by every
partition (LRU across them: one key's traffic can evict another's entries, which only costs the other an encode).
A cached vector is the one the query got when it was first encoded: with TANDEM_BATCH_MAX_QUERIES above 1 that may
have been among batchmates (cosine ≥ 0.99 to alone), as an encode would be anyway.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import numpy as np

CacheKey = tuple[Hashable, Hashable, str]  # (the key's partition, the student's identity, the normalized query)
Lookup = Callable[[int, int], None]  # told the hits and misses of each lookup (the metrics' counter)


class QueryCache:
    """Thread-safe LRU of (vector, tokens) per key; at most `size` entries (size ≥ 1)."""

    def __init__(self, size: int, on_lookup: Lookup | None = None) -> None:
        if size < 1:
            raise ValueError(f"query cache size {size}: at least 1 (0 means no cache, which makes none)")
        self.size = size
        self.on_lookup = on_lookup
        self._lock = threading.Lock()
        self._entries: OrderedDict[CacheKey, tuple[np.ndarray, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, keys: Sequence[CacheKey]) -> list[tuple[np.ndarray, int] | None]:
        """Each key's entry (vector, tokens) or None; hits become the most recently used."""
        found: list[tuple[np.ndarray, int] | None] = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                found.append(entry)
        if self.on_lookup is not None:
            hits = sum(entry is not None for entry in found)
            self.on_lookup(hits, len(found) - hits)
        return found

    def put_many(self, keys: Sequence[CacheKey], vectors: np.ndarray, tokens: Sequence[int]) -> None:
        """Keep each key's row (copied and read-only: answers share it), dropping the least recently used beyond
        `size`."""
        with self._lock:
            for key, row, count in zip(keys, vectors, tokens, strict=True):
                vector = np.array(row, dtype=np.float32)
                vector.setflags(write=False)
                self._entries[key] = (vector, int(count))
                self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
