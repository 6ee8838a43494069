"""Grouping rows by a code on disk: what lets a build lay out postings in bounded memory.

A lexical segment's postings and a keyword field's rows are runs of rows grouped by a code (a stem, a value), rows
ascending within a run. Gathering every (code, row) pair in RAM and sorting them cost 20–40 bytes a pair: 5 GB at
10M documents. Here the pairs go to a scratch file in row order as they are read (a counting pass keeps only a
count per code), then a second pass scatters them, a step at a time, straight into the memory-mapped output
arrays at each code's next free place: a counting sort, stable, so rows stay ascending within a run and the
files are byte for byte those of the in-memory sort. RAM holds one step and a cursor per code; the output's
pages are dropped from this process after each step (they stay in the page cache, written back by the kernel).

Below SPILL_AFTER records nothing goes to disk and the outputs are plain arrays saved whole: a small build (an
update's segment, a test's corpus) writes the very files, and opens them as often, as it always did.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from models.bundle.storage.dictionary import run_offsets

STEP_RECORDS = 1 << 20  # records scattered at a time (1M: tens of MB of working set)
WINDOW_ITEMS = 1 << 23  # output items written between two releases of its pages (8M: 32 MB of int32)
SPILL_AFTER = 1 << 22  # records (or output items) held in RAM before they go to disk


def new_array(path: Path, dtype: np.dtype | type, count: int) -> np.ndarray:
    """An output of `count` items for `path`: above SPILL_AFTER a C-ordered .npy memory-mapped for writing (its
    header is what `np.save` writes), else an array in RAM; `save_array` finishes either."""
    if count <= SPILL_AFTER:
        return np.zeros(count, dtype=dtype)
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=(count,))


def save_array(path: Path, array: np.ndarray) -> None:
    """Finish an array of `new_array`: flush the mapped file, or save the one in RAM (the same bytes either way)."""
    if isinstance(array, np.memmap):
        array.flush()
    else:
        np.save(path, array)


def release(array: np.ndarray) -> None:
    """Drop a memory-mapped array's pages from this process (a shared mapping: the data stay in the page cache and
    reach the file), so a pass over a large output keeps its resident set bounded."""
    mapped = getattr(array, "_mmap", None)
    if isinstance(mapped, mmap.mmap) and len(array):
        mapped.madvise(mmap.MADV_DONTNEED)


class Records:
    """Structured records kept in the order appended: in RAM up to SPILL_AFTER of them, past that in a scratch
    file at `path` (created only then), read back STEP_RECORDS at a time."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.total = 0
        self.spilled = False
        self._fh: BinaryIO | None = None
        self._held: list[np.ndarray] = []

    def append(self, records: np.ndarray) -> None:
        self._held.append(records)
        self.total += len(records)
        if self.total > SPILL_AFTER:
            if self._fh is None:
                self._fh, self.spilled = self.path.open("wb"), True
            for held in self._held:
                held.tofile(self._fh)
            self._held = []

    def in_ram(self) -> np.ndarray | None:
        """All the records when none went to disk, else None."""
        if self.spilled:
            return None
        return np.concatenate(self._held) if self._held else np.zeros(0, dtype=self.dtype)

    def steps(self) -> Iterator[np.ndarray]:
        """The records in append order, STEP_RECORDS at a time."""
        held = self.in_ram()
        if held is not None:
            for start in range(0, len(held), STEP_RECORDS):
                yield held[start : start + STEP_RECORDS]
            return
        self.close()
        with self.path.open("rb") as fh:
            while len(step := np.fromfile(fh, dtype=self.dtype, count=STEP_RECORDS)):
                yield step

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def remove(self) -> None:
        self.close()
        self._held = []
        if self.spilled:
            self.path.unlink(missing_ok=True)


class CodeSpill:
    """(code, row, columns…) records appended in row order; `scatter` lays them out grouped by code."""

    def __init__(self, path: Path, row: np.dtype | type, columns: Mapping[str, np.dtype | type] | None = None) -> None:
        self.records = Records(path, np.dtype([("code", np.int32), ("row", np.dtype(row)),
                                               *((k, np.dtype(v)) for k, v in (columns or {}).items())]))
        self.counts = np.zeros(0, dtype=np.int64)

    @property
    def total(self) -> int:
        return self.records.total

    def append(self, codes: np.ndarray, rows: np.ndarray, **columns: np.ndarray) -> None:
        """Records of rows not before any appended so far (ties by code in any order: `scatter` keeps it)."""
        records = np.empty(len(codes), dtype=self.records.dtype)
        records["code"], records["row"] = codes, rows
        for name, values in columns.items():
            records[name] = values
        self.records.append(records)
        if len(codes):
            seen = np.bincount(codes)
            if len(seen) > len(self.counts):
                self.counts = np.concatenate([self.counts, np.zeros(len(seen) - len(self.counts), dtype=np.int64)])
            self.counts[: len(seen)] += seen

    def scatter(self, remap: np.ndarray, outputs: Mapping[str, np.ndarray], groups: int | None = None) -> np.ndarray:
        """Write every record's `row` and columns into `outputs` (`new_array`s `total` long; keys: "row" and the
        column names wanted), grouped by `remap[code]` ascending, in append order within a group; returns the
        groups' offsets (run_offsets of their sizes). `groups`: how many there are (default len(remap)); several
        codes may share a group (a RunDictionary's codes of one string in different runs)."""
        sizes = np.zeros(len(remap) if groups is None else groups, dtype=np.int64)
        np.add.at(sizes, remap[: len(self.counts)], self.counts)
        offsets = run_offsets(sizes)
        cursor = offsets[:-1].copy()
        for step in self.records.steps():
            group = remap[step["code"]]
            order = np.argsort(group, kind="stable")
            group = group[order]
            starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
            runs = np.diff(np.r_[starts, len(group)])
            within = np.arange(len(group)) - np.repeat(starts, runs)
            at = cursor[group] + within  # ascending: groups in order, each at its cursor
            for name, out in outputs.items():
                values = step[name][order]
                # a window of the output at a time, its pages dropped after it: a step's postings spread over the
                # whole output (one run per stem), which would otherwise stay resident until the step ends
                edges = np.searchsorted(at, np.arange(WINDOW_ITEMS, len(out), WINDOW_ITEMS))
                for lo, hi in itertools.pairwise([0, *edges.tolist(), len(at)]):
                    if hi > lo:
                        out[at[lo:hi]] = values[lo:hi]
                        release(out)
            cursor[group[starts]] += runs  # each group once in `starts`
        return offsets

    def remove(self) -> None:
        self.records.remove()
