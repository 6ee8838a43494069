"""Which queries a segment's sample asks: pseudo-queries of its documents, one per sampled document.

Documents are drawn at random, seeded by the segment's name (so a segment's sample is the same whoever writes it),
and each gives one of the pseudo-queries the distillation trains on (models.pseudo_queries: its title, a sentence
or a span): the sample asks the student what it was taught to answer, about documents it may never have seen.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

from models.corpus import Document
from models.pseudo_queries import pseudo_queries

DEFAULT_SAMPLE = 128  # queries per segment: ±0.05 on a share at 95% (measured: docs/lab/2026-11-26-agreement.md)
QUERIES_PER_DOC = 3  # as the default preset: the title, then sentences and spans; one of them is kept


def seed_of(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def draw_rows(count: int, size: int, name: str) -> list[int]:
    """Up to `size` distinct rows of a segment of `count`, ascending, seeded by its name."""
    rng = random.Random(seed_of(name))
    return sorted(rng.sample(range(count), min(size, count)))


def draw_queries(rows: Sequence[int], read: Callable[[list[int]], list[Document]], name: str,
                 live: Callable[[int], bool] = lambda row: True) -> tuple[list[str], list[str]]:
    """One pseudo-query for each live document of `rows` (read by `read`) that yields one: (queries, source ids)."""
    rng = random.Random(seed_of(name) + 1)
    picked = [r for r in rows if live(r)]
    queries: list[str] = []
    sources: list[str] = []
    for doc in read(picked):
        options = pseudo_queries(doc, QUERIES_PER_DOC, rng)
        if options:
            queries.append(rng.choice(options))
            sources.append(doc.id)
    return queries, sources
