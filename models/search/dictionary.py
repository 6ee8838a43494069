"""A sorted-strings dictionary on disk: distinct strings in order, their UTF-8 bytes concatenated, and int64
offsets where each starts (one more than there are strings, the last the end). A keyword field's values in the
payload index (models.search.payload_writer, .npy arrays) and a segment's stems in the lexical postings
(models.search.lexical, raw bytes in terms.bin) are laid out so; both are read through `Dictionary`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np


class Dictionary(Sequence[str]):
    """The sorted strings, decoded from the mapped bytes only when a search reads them: RAM holds none of them."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self.data, self.offsets = data, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return bytes(self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]).decode()

    def find(self, value: str) -> int | None:
        i = bisect.bisect_left(self, value)
        return i if i < len(self) and self[i] == value else None
