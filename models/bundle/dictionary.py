"""A sorted-strings dictionary on disk: distinct strings in order, their UTF-8 bytes concatenated, and int64
offsets where each starts (one more than there are strings, the last the end). A keyword field's values in the
payload index (models.bundle.payload_writer, .npy arrays) and a segment's stems in the lexical postings
(models.bundle.lexical, raw bytes in terms.bin) are laid out so: both are written from `sorted_dictionary` and
read through `Dictionary`.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import numpy as np

ENCODE_STEP = 1 << 16  # strings encoded at a time by sorted_dictionary


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


def sorted_dictionary(codes: Mapping[str, int]) -> tuple[np.ndarray, bytes, np.ndarray]:
    """Strings coded 0..n-1 in any order (as they were first met) → (`remap`: code → its string's rank in sorted
    order, the sorted strings' UTF-8 bytes, their offsets): what a writer stores, whatever its file format.

    The strings are encoded ENCODE_STEP at a time: a list of every encoded string at once (a bytes object and a
    pointer each, about 50 bytes a string) was part of the spike at the end of the 10M lexical build."""
    ordered = sorted(codes)
    remap = np.empty(len(ordered), dtype=np.int64)
    sizes = np.empty(len(ordered), dtype=np.int64)
    blob = bytearray()
    for lo in range(0, len(ordered), ENCODE_STEP):
        part = ordered[lo : lo + ENCODE_STEP]
        remap[np.fromiter((codes[s] for s in part), dtype=np.int64, count=len(part))] = \
            np.arange(lo, lo + len(part))
        encoded = [s.encode() for s in part]
        sizes[lo : lo + len(part)] = np.fromiter(map(len, encoded), dtype=np.int64, count=len(part))
        blob += b"".join(encoded)
    return remap, bytes(blob), run_offsets(sizes)


def run_offsets(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """int64 [len(sizes) + 1]: where each of consecutive runs of these sizes starts, then where the last ends
    (the dictionary's strings in its bytes; a posting list in its rows, sized by np.bincount of the codes)."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)
    return offsets
