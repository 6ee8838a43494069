"""Grouping rows by a code on disk: what lets a build lay out postings in bounded memory.

A lexical segment's postings and a keyword field's rows are runs of rows grouped by a code (a stem, a value), rows
ascending within a run. Gathering every (code, row) pair in RAM and sorting them cost 20–40 bytes a pair: 5 GB at
10M documents. Here the pairs go to a scratch file in row order as they are read (a counting pass keeps only a
count per code), then a second pass scatters them, a step at a time, straight into the memory-mapped output
arrays at each code's next free place: a counting sort, stable, so rows stay ascending within a run and the
files are byte for byte those of the in-memory sort. RAM holds one step and a cursor per code; the output's
pages are dropped from this process after each step (they stay in the page cache, written back by the kernel).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from models.bundle.dictionary import run_offsets

STEP_RECORDS = 1 << 21  # pairs scattered at a time (2M: tens of MB of working set)


def new_array(path: Path, dtype: np.dtype | type, count: int) -> np.ndarray:
    """A C-ordered .npy of `count` items at `path`, memory-mapped for writing; its header is what `np.save`
    writes, so the finished file equals `np.save` of the same values."""
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=(count,))


def release(array: np.ndarray) -> None:
    """Drop a memory-mapped array's pages from this process (a shared mapping: the data stay in the page cache and
    reach the file), so a pass over a large output keeps its resident set bounded."""
    mapped = getattr(array, "_mmap", None)
    if isinstance(mapped, mmap.mmap) and len(array):
        mapped.madvise(mmap.MADV_DONTNEED)


class CodeSpill:
    """(code, row, columns…) records appended in row order; `scatter` lays them out grouped by code."""

    def __init__(self, path: Path, row: np.dtype | type, columns: Mapping[str, np.dtype | type] | None = None) -> None:
        self.path = Path(path)
        self.dtype = np.dtype([("code", np.int32), ("row", np.dtype(row)),
                               *((k, np.dtype(v)) for k, v in (columns or {}).items())])
        self._fh: BinaryIO | None = self.path.open("wb")
        self.counts = np.zeros(0, dtype=np.int64)
        self.total = 0

    def append(self, codes: np.ndarray, rows: np.ndarray, **columns: np.ndarray) -> None:
        """Records of rows not before any appended so far (ties by code in any order: `scatter` keeps it)."""
        assert self._fh is not None
        records = np.empty(len(codes), dtype=self.dtype)
        records["code"], records["row"] = codes, rows
        for name, values in columns.items():
            records[name] = values
        records.tofile(self._fh)
        if len(codes):
            seen = np.bincount(codes)
            if len(seen) > len(self.counts):
                self.counts = np.concatenate([self.counts, np.zeros(len(seen) - len(self.counts), dtype=np.int64)])
            self.counts[: len(seen)] += seen
        self.total += len(codes)

    def scatter(self, remap: np.ndarray, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Write every record's `row` and columns into `outputs` (memory-mapped, `total` long; keys: "row" and the
        column names wanted), grouped by `remap[code]` ascending, in append order within a group; returns the
        groups' offsets (run_offsets of their sizes)."""
        self.close()
        sizes = np.zeros(len(remap), dtype=np.int64)
        sizes[remap[: len(self.counts)]] = self.counts
        offsets = run_offsets(sizes)
        cursor = offsets[:-1].copy()
        with self.path.open("rb") as fh:
            while True:
                step = np.fromfile(fh, dtype=self.dtype, count=STEP_RECORDS)
                if not len(step):
                    break
                group = remap[step["code"]]
                order = np.argsort(group, kind="stable")
                group = group[order]
                starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
                runs = np.diff(np.r_[starts, len(group)])
                within = np.arange(len(group)) - np.repeat(starts, runs)
                at = cursor[group] + within
                for name, out in outputs.items():
                    out[at] = step[name][order]
                cursor[group[starts]] += runs  # each group once in `starts`
                for out in outputs.values():
                    release(out)
        return offsets

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def remove(self) -> None:
        self.close()
        if self.path.exists():
            os.unlink(self.path)
