"""Fusing a dense and a lexical candidate list into one ranking.

- rrf: Σ 1 / (rrf_k + rank) over the lists a document is in; scale-free, needs no weight.
- convex: alpha · dense + (1 − alpha) · lexical, each min-max normalized over its own candidates
  (a document missing from a list gets 0 there). Cosines and BM25 scores live on unrelated scales;
  normalizing per query puts both on [0, 1].

Ties are broken by row, so a fused ranking is deterministic.

DEFAULT_FUSION is what a new bundle records as its `mode: hybrid` default, so `tandem eval` and the
service agree. Chosen on SciFact's *train* queries only (809 queries; never the test split), asymmetric
(a `quick` student's queries + BM25), by bench/quality/choose_fusion.py
(docs/decisions.md#fusion-default-convex-alpha-04):
convex 0.3 / 0.4 / 0.5 gave nDCG@10 0.7243 / 0.7306 / 0.7260, RRF 0.6980, BM25 alone 0.6964. Convex
beat RRF on every set measured (issue 26: also a held-out BEIR set, 111.9% against 106.5%), and the
best weight there was 0.3 to 0.5; 0.4, the train optimum, sits in the flat middle of that range.
"""

from __future__ import annotations

import numpy as np

from models.bundle.manifest import FusionMethod, FusionSpec

Candidates = tuple[np.ndarray, np.ndarray]  # (scores, rows), best first

DEFAULT_FUSION = FusionSpec(method=FusionMethod.CONVEX, alpha=0.4, rrf_k=60, depth=100)


def _minmax(scores: np.ndarray) -> np.ndarray:
    if len(scores) == 0:
        return scores.astype(np.float64)
    low, high = float(scores.min()), float(scores.max())
    if high <= low:
        return np.ones(len(scores), dtype=np.float64)
    return (scores.astype(np.float64) - low) / (high - low)


def fuse(dense: Candidates, lexical: Candidates, spec: FusionSpec, alpha: float | None = None) -> Candidates:
    """One ranking (scores, rows) of the union of both lists, best first."""
    d_scores, d_rows = dense
    l_scores, l_rows = lexical
    if spec.method is FusionMethod.RRF:
        d_part = 1.0 / (spec.rrf_k + 1.0 + np.arange(len(d_rows)))
        l_part = 1.0 / (spec.rrf_k + 1.0 + np.arange(len(l_rows)))
    else:
        weight = spec.alpha if alpha is None else alpha
        d_part = weight * _minmax(d_scores)
        l_part = (1.0 - weight) * _minmax(l_scores)
    rows = np.concatenate([np.asarray(d_rows, dtype=np.int64), np.asarray(l_rows, dtype=np.int64)])
    parts = np.concatenate([d_part, l_part])
    unique, inverse = np.unique(rows, return_inverse=True)
    totals = np.zeros(len(unique), dtype=np.float64)
    np.add.at(totals, inverse, parts)
    order = np.lexsort((unique, -totals))
    return totals[order].astype(np.float32), unique[order]
