"""models.search.fusion: convex and RRF fusion of two hand-made candidate lists, computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from models.bundle.manifest import FusionMethod, FusionSpec
from models.search.fusion import fuse

DENSE = (np.array([0.9, 0.5, 0.1], dtype=np.float32), np.array([7, 3, 5]))
LEXICAL = (np.array([12.0, 2.0], dtype=np.float32), np.array([3, 9]))


def test_convex_weights_the_min_max_normalized_scores() -> None:
    scores, rows = fuse(DENSE, LEXICAL, FusionSpec(method=FusionMethod.CONVEX, alpha=0.5))
    # dense normalized: 7→1, 3→0.5, 5→0; lexical: 3→1, 9→0; a missing document gets 0 there
    assert rows.tolist() == [3, 7, 5, 9]
    assert scores.tolist() == pytest.approx([0.75, 0.5, 0.0, 0.0])
    _, rows = fuse(DENSE, LEXICAL, FusionSpec(alpha=0.5), alpha=1.0)  # the request's weight wins
    assert rows.tolist() == [7, 3, 5, 9]


def test_rrf_sums_reciprocal_ranks() -> None:
    scores, rows = fuse(DENSE, LEXICAL, FusionSpec(method=FusionMethod.RRF, rrf_k=10))
    assert rows.tolist() == [3, 7, 9, 5]
    assert scores.tolist() == pytest.approx([1 / 12 + 1 / 11, 1 / 11, 1 / 12, 1 / 13])


def test_ties_break_by_row_and_empty_lists_fuse() -> None:
    same = (np.array([1.0, 1.0], dtype=np.float32), np.array([8, 2]))
    scores, rows = fuse(same, (np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)), FusionSpec(alpha=0.5))
    assert rows.tolist() == [2, 8] and scores.tolist() == [0.5, 0.5]
    scores, rows = fuse((np.zeros(0), np.zeros(0)), (np.zeros(0), np.zeros(0)), FusionSpec())
    assert len(rows) == 0 and len(scores) == 0
