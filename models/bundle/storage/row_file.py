"""Rows of a 2-d .npy array read with `os.preadv`: indexable by an array of rows, as its memory map is.

Why: a read through the map leaves pages of the file mapped into the reader, and on a kernel that caches files in
large folios (6.18 here) each row read maps its whole folio: 378 MB for one query's 640 int8 rows of a 10M version
(docs/lab/2026-11-26-scale-10m-3.md). A writer's agreement sample searches the version it builds inside the build's
memory bound, so it reads the rows it rescores by copying them (a syscall a row), and maps nothing; the first stage
it maps (instead of holding a 10M IVF's 1 GB of codes in the heap), and drops the pages each query read.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from pathlib import Path

import numpy as np


class PreadRows:
    """`shape` rows of `dtype` stored from byte `offset` of `path` (a .npy's data), read a row at a time."""

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        if len(shape) != 2:
            raise ValueError(f"{path}: rows of a 2-d array, not of shape {shape}")
        self.path, self.offset, self.shape, self.dtype = path, offset, shape, np.dtype(dtype)
        self.row_bytes = shape[1] * self.dtype.itemsize
        self.fd = os.open(path, os.O_RDONLY)

    @classmethod
    def of(cls, mapped: np.memmap) -> PreadRows:
        """The rows of a memory-mapped .npy (np.load(mmap_mode='r')), read from its file instead."""
        if mapped.filename is None:
            raise ValueError("an array without a file has no rows to read")
        return cls(Path(mapped.filename), mapped.offset, mapped.shape, mapped.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"{self.path}: rows outside 0..{self.shape[0] - 1}")
        out = np.empty((len(rows), self.shape[1]), dtype=self.dtype)
        view, size = out.data.cast("B"), self.row_bytes
        for i, row in enumerate(rows.tolist()):
            if os.preadv(self.fd, [view[i * size : (i + 1) * size]], self.offset + row * size) != size:
                raise OSError(f"{self.path}: short read of row {row}")
        return out

    def close(self) -> None:
        os.close(self.fd)


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """The (start, end) addresses of this process's mappings of `path`, from /proc/self/maps (empty off Linux).

    A caller that keeps the mapping (a FAISS index mapped once at its load, for as long as the index lives) finds
    them once and drops their pages with `drop_ranges` as often as it needs: in a process that loaded torch the
    maps run to thousands of lines, and a writer's agreement sample dropped pages per segment per batch of queries,
    parsing them each time."""
    maps = Path("/proc/self/maps")
    if not maps.is_file():
        return []
    real, ranges = os.path.realpath(path), []
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == real:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def drop_ranges(path: Path, ranges: list[tuple[int, int]]) -> None:
    """Drop this process's pages of `ranges`, mappings of `path` (`mapped_ranges`) still mapped: MADV_DONTNEED on
    read-only mappings, so the data stay in the page cache and come back on the next read. For a mapping numpy does
    not own, FAISS's of a first stage loaded with IO_FLAG_MMAP_IFC."""
    for start, end in ranges:
        if _libc().madvise(start, end - start, mmap.MADV_DONTNEED) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise of {path}'s mapping: {os.strerror(err)}")


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc
