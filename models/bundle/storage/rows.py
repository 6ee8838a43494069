"""Row masks over one segment: the rows a search may return (a filter's, ANDed with the segment's live rows).

`Allowed` computes what the searches derive from a mask once per search, shared by every query and mode: its count,
its rows in order, and FAISS's bitmap of it. The bundle keeps each segment's live rows as one; the planner
(models.search.planner) decides from its count how a filtered search runs.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np


def row_mask(rows: np.ndarray, size: int) -> np.ndarray:
    """The bool mask of `size` rows that is True at `rows` (a new array the caller owns)."""
    mask = np.zeros(size, dtype=bool)
    mask[rows] = True
    return mask


class Allowed:
    """The rows of one bundle a search may return, as a bool mask (one per row); the rest derived once."""

    def __init__(self, mask: np.ndarray) -> None:
        self.mask = mask
        self.count = int(np.count_nonzero(mask))

    @property
    def share(self) -> float:
        return self.count / max(1, len(self.mask))

    @cached_property
    def rows(self) -> np.ndarray:
        """The allowed rows, ascending (int64)."""
        return np.flatnonzero(self.mask)

    @cached_property
    def bitmap(self) -> np.ndarray:
        """FAISS's IDSelectorBitmap layout: bit (row & 7) of byte (row >> 3)."""
        return np.packbits(self.mask, bitorder="little")
