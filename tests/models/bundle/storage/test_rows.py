"""models.bundle.storage.rows: a row mask and what a search derives from it once."""

from __future__ import annotations

import numpy as np

from models.bundle.storage.rows import Allowed, row_mask


def test_row_mask_marks_the_rows() -> None:
    assert row_mask(np.array([0, 3]), 5).tolist() == [True, False, False, True, False]
    assert not row_mask(np.array([], dtype=np.int64), 3).any()


def test_allowed_counts_lists_and_packs_the_rows() -> None:
    allowed = Allowed(row_mask(np.array([1, 8, 9]), 10))
    assert allowed.count == 3 and allowed.share == 0.3
    assert allowed.rows.tolist() == [1, 8, 9]
    assert allowed.bitmap.tolist() == [0b00000010, 0b00000011]  # bit (row & 7) of byte (row >> 3)
    assert Allowed(np.zeros(0, dtype=bool)).share == 0.0
