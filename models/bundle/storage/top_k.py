"""The k best of scored rows, best first and ties by row: how every engine ranks (BM25 postings, FAISS rescoring).

One definition, so the lexical and vector engines order equal scores the same way without importing each other.
"""

from __future__ import annotations

import numpy as np


def top_k(scores: np.ndarray, rows: np.ndarray, k: int, positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The k best (scores, rows), best first, ties by row; `positive` drops scores ≤ 0."""
    if positive:
        keep = scores > 0
        scores, rows = scores[keep], rows[keep]
    if len(scores) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]  # the k-th best; ties at it all stay
        keep = scores >= kth
        scores, rows = scores[keep], rows[keep]
    order = np.lexsort((rows, -scores))[:k]
    return scores[order], rows[order]
