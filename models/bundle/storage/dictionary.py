"""A sorted-strings dictionary on disk: distinct strings in order, their UTF-8 bytes concatenated, and int64
offsets where each starts (one more than there are strings, the last the end). A keyword field's values in the
payload index (models.bundle.payload.writer, .npy arrays) and a segment's stems in the lexical postings
(models.bundle.lexical.postings, raw bytes in terms.bin) are laid out so: written from `sorted_dictionary` (keywords) or
`RunDictionary.merge` (stems, coded in runs of bounded memory), and read through `Dictionary`.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

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


RUN_STRINGS = 1 << 19  # distinct strings a RunDictionary holds in memory before it writes them out as a run


class RunDictionary:
    """Codes strings as they are first met, in runs of about `run_strings` distinct ones: when a run is full
    (`end_chunk`), its strings go to a scratch file, sorted, and a new run begins, in which a string met again gets
    a new code. `merge` writes the sorted dictionary of every run's strings and returns each code's rank in it.

    Why: one dict of every distinct string costs about 130–185 bytes a string: 1.4 GB for the 10M stems of a corpus
    whose every document holds a word of its own (docs/lab/2026-11-26-build-memory.md). Runs hold one dict of
    `run_strings` and 4 bytes a code (12 at the merge); a run is written as `sorted_dictionary` lays one out, its
    bytes and their offsets, in two scratch files. The writer reads `codes` directly (a dict lookup per occurrence,
    no call) and codes are `base + codes[s]`."""

    def __init__(self, scratch: Path, run_strings: int = RUN_STRINGS) -> None:
        self.scratch, self.run_strings = scratch, run_strings
        self.codes: dict[str, int] = {}
        self.base = 0  # codes taken by the runs written before this one
        self.runs: list[tuple[Path, np.ndarray]] = []  # each run's bytes file, and its codes' ranks in the run

    def end_chunk(self) -> None:
        """Write the run out if it is full: between two chunks, so that the codes of a chunk share one base."""
        if len(self.codes) >= self.run_strings:
            self._write_run()

    def merge(self, blob: Path, offsets: Path) -> tuple[np.ndarray, int]:
        """Write the sorted distinct strings of every run (UTF-8 bytes concatenated to `blob`, their run_offsets
        to `offsets` as .npy, as `sorted_dictionary` lays them out) and return (code → rank, distinct strings)."""
        if self.codes or not self.runs:
            self._write_run()
        ranks = [np.empty(len(order), dtype=np.int32) for _, order in self.runs]
        sizes = array("q")
        with contextlib.ExitStack() as stack, blob.open("wb") as out:
            runs = [_strings(stack.enter_context(path.open("rb")), np.load(_offsets(path), mmap_mode="r"), r)
                    for r, (path, _) in enumerate(self.runs)]
            previous, rank = None, -1
            for value, run, position in heapq.merge(*runs):  # UTF-8's byte order is the strings' code point order
                if value != previous:
                    rank += 1
                    out.write(value)
                    sizes.append(len(value))
                    previous = value
                ranks[run][position] = rank
        np.save(offsets, run_offsets(np.frombuffer(sizes, dtype=np.int64)))
        code_rank = np.concatenate([ranks[r][order] for r, (_, order) in enumerate(self.runs)])
        return code_rank, rank + 1

    def remove(self) -> None:
        for path, _ in self.runs:
            path.unlink(missing_ok=True)
            _offsets(path).unlink(missing_ok=True)

    def _write_run(self) -> None:
        remap, blob, offsets = sorted_dictionary(self.codes)  # remap: code → its string's rank in the run
        path = self.scratch.with_name(f"{self.scratch.name}.{len(self.runs)}")
        path.write_bytes(blob)
        np.save(_offsets(path), offsets)
        self.runs.append((path, remap.astype(np.int32)))
        self.base += len(self.codes)
        self.codes = {}


def _offsets(run: Path) -> Path:
    return run.with_name(f"{run.name}.offsets.npy")


def _strings(fh: BinaryIO, offsets: np.ndarray, run: int) -> Iterator[tuple[bytes, int, int]]:
    """(string, run, rank) of a run written by `_write_run`, in its (sorted) order, its sizes read ENCODE_STEP at a
    time."""
    for lo in range(0, len(offsets) - 1, ENCODE_STEP):
        for rank, size in enumerate(np.diff(offsets[lo : lo + ENCODE_STEP + 1]).tolist(), lo):
            yield fh.read(size), run, rank
