"""One payload field's sorted columns, gathered in row order and laid out on disk in bounded memory.

models.bundle.payload.writer reads the docstore's metadata a chunk at a time and hands each field its (row, value)
pairs here. Holding every pair in RAM and sorting them cost 40 bytes and more per document per field (600 MB for
three fields at 10M documents); instead the pairs go to scratch files beside the output as they come:

- a keyword field: (value code, row) records into a `CodeSpill`, laid out by the value's rank in sorted order
  (a counting sort: rows ascending within a value);
- an integer, float, boolean or datetime field: (value, row) records, then, once the range is known, a counting
  sort into 65,536 buckets of that range (order-preserving), each bucket sorted in RAM by a stable sort (a
  bucket of one value, however large, is already in order and is not sorted);
- the rows without a value: appended to a raw file, then copied behind their .npy header;
- each row's rank (position in the sorted rows), but for a keyword list: the sorted rows scattered back by position.

The arrays are those the in-memory sort wrote, byte for byte (tests/models/bundle/payload/test_payload.py).
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np

from models.bundle.payload.fields import FieldType, PayloadField, typed
from models.bundle.storage.dictionary import sorted_dictionary
from models.bundle.storage.spill import STEP_RECORDS, CodeSpill, Records, new_array, release, save_array

KEYWORD_TYPES = frozenset({FieldType.KEYWORD, FieldType.KEYWORD_LIST})
VALUE_DTYPES = {FieldType.INTEGER: np.int64, FieldType.DATETIME: np.int64, FieldType.FLOAT: np.float64,
                FieldType.BOOLEAN: np.int8}
BUCKETS = 1 << 16


def row_dtype(count: int) -> type[np.signedinteger]:
    return np.int32 if count < 2**31 else np.int64


class FieldColumns:
    """One field's (value, row) pairs as they are read (`add`, then `flush` after each chunk of rows), written
    sorted by `write`; past SPILL_AFTER pairs they wait in scratch files in `scratch` (models.bundle.storage.spill)."""

    def __init__(self, field: PayloadField, scratch: Path, position: int, count: int) -> None:
        self.field, self.count = field, count
        self.keyword = field.type in KEYWORD_TYPES
        self.ranked = field.type is not FieldType.KEYWORD_LIST  # each row once in `rows`: it has a rank
        self.rows_type = np.dtype(row_dtype(count))
        self.codes: dict[str, int] = {}  # keyword types: value → code in order of first appearance
        self._keys: list[object] = []
        self._rows: list[int] = []
        self._absent: list[int] = []
        base = Path(scratch) / f".{position}"
        self.absent = Records(base.with_suffix(".absent"), self.rows_type)
        self._spill = CodeSpill(base.with_suffix(".spill"), self.rows_type) if self.keyword else None
        self.pairs = Records(base.with_suffix(".pairs"), np.dtype([("value", VALUE_DTYPES.get(field.type, np.int64)),
                                                                   ("row", self.rows_type)]))
        self._lo, self._hi = np.inf, -np.inf

    def add(self, row: int, value: object) -> None:
        if value is None:
            self._absent.append(row)
            return
        try:
            stored = typed(self.field.type, value)
        except ValueError as exc:  # write_payload names the document
            raise ValueError(f"field {self.field.name!r} is {self.field.origin} {self.field.type.value}: {exc}, got "
                             f"{value!r:.60}") from None
        if not self.keyword:
            self._keys.append(stored)
            self._rows.append(row)
            return
        values: list[str] = stored if isinstance(stored, list) else [str(stored)]
        for text in dict.fromkeys(values):  # none for an empty list; ["a", "a"]: one posting
            self._keys.append(self.codes.setdefault(text, len(self.codes)))
            self._rows.append(row)

    def flush(self) -> None:
        """Hand the pairs gathered since the last flush to their records."""
        self.absent.append(np.asarray(self._absent, dtype=self.rows_type))
        rows = np.asarray(self._rows, dtype=self.rows_type)
        if self._spill is not None:
            self._spill.append(np.asarray(self._keys, dtype=np.int64), rows)
        elif len(rows):
            pairs = np.empty(len(rows), dtype=self.pairs.dtype)
            pairs["value"], pairs["row"] = self._keys, rows
            self.pairs.append(pairs)
            self._lo = min(self._lo, float(pairs["value"].min()))
            self._hi = max(self._hi, float(pairs["value"].max()))
        self._keys, self._rows, self._absent = [], [], []

    def write(self, directory: Path, names: dict[str, str]) -> PayloadField:
        """Sort by value and write each part to `directory / names[part]`; returns the field with its counts."""
        self.flush()
        self._write_absent(directory / names["absent"])
        if self._spill is not None:
            remap, blob, blob_offsets = sorted_dictionary(self.codes)
            rows = new_array(directory / names["rows"], self.rows_type, self._spill.total)
            offsets = self._spill.scatter(remap, {"row": rows})
            np.save(directory / names["dict"], np.frombuffer(blob, dtype=np.uint8))
            np.save(directory / names["dict_offsets"], blob_offsets)
            np.save(directory / names["offsets"], offsets)
            save_array(directory / names["rows"], rows)
            distinct = len(remap)
        else:
            distinct = self._write_values(directory / names["values"], directory / names["rows"])
        if self.ranked:
            self._write_ranks(directory / names["ranks"], np.load(directory / names["rows"], mmap_mode="r"))
        # a row holding [] has a value (it exists) but no posting
        return self.field.model_copy(update={"documents": self.count - self.absent.total, "values": distinct,
                                             "ranks": self.ranked})

    def _write_ranks(self, path: Path, rows: np.ndarray) -> None:
        """Each row's position in `rows`, len(rows) for a row without a value: the inverse of the sort, scattered
        STEP_RECORDS positions at a time into an array of `new_array`'s."""
        ranks = new_array(path, self.rows_type, self.count)
        ranks[:] = len(rows)
        for start in range(0, len(rows), STEP_RECORDS):
            stop = min(start + STEP_RECORDS, len(rows))
            ranks[np.asarray(rows[start:stop], dtype=np.intp)] = np.arange(start, stop, dtype=self.rows_type)
            release(ranks)
        save_array(path, ranks)

    def _write_absent(self, path: Path) -> None:
        held = self.absent.in_ram()
        if held is not None:
            np.save(path, held)
            return
        out = new_array(path, self.rows_type, self.absent.total)  # past SPILL_AFTER: a mapped .npy
        assert isinstance(out, np.memmap)
        offset = out.offset
        del out
        self.absent.close()
        with path.open("r+b") as dst, self.absent.path.open("rb") as src:
            dst.seek(offset)
            shutil.copyfileobj(src, dst)

    def _write_values(self, values_path: Path, rows_path: Path) -> int:
        """Values ascending, rows ascending within a value; returns the number of distinct values."""
        held = self.pairs.in_ram()
        if held is not None:  # a stable sort in RAM (rows were appended ascending)
            order = np.argsort(held["value"], kind="stable")
            values, rows = held["value"][order], held["row"][order]
            np.save(values_path, values)
            np.save(rows_path, rows)
            return int(np.count_nonzero(np.diff(values))) + 1 if len(values) else 0
        values = new_array(values_path, self.pairs.dtype["value"], self.pairs.total)
        rows = new_array(rows_path, self.rows_type, self.pairs.total)
        spill = CodeSpill(self.pairs.path.with_suffix(".buckets"), self.rows_type, {"value": values.dtype})
        try:
            width = self._hi - self._lo
            for step in self.pairs.steps():
                # monotone in the value (float64 rounding never reverses an order), so buckets keep it
                scaled = (step["value"].astype(np.float64) - self._lo) / width if width > 0 else np.zeros(len(step))
                bucket = np.minimum((scaled * BUCKETS).astype(np.int64), BUCKETS - 1)
                spill.append(bucket, step["row"], value=step["value"])
            offsets = spill.scatter(np.arange(BUCKETS), {"row": rows, "value": values})
        finally:
            spill.remove()
        distinct = since_release = 0
        for lo, hi in itertools.pairwise(offsets):
            if hi == lo:
                continue
            v = np.asarray(values[lo:hi])
            if (v != v[0]).any():  # a value is always in one bucket: a bucket of one value is in row order already
                order = np.argsort(v, kind="stable")
                v = v[order]
                values[lo:hi], rows[lo:hi] = v, np.asarray(rows[lo:hi])[order]
            distinct += int(np.count_nonzero(np.diff(v))) + 1
            since_release += hi - lo
            if since_release >= STEP_RECORDS:
                release(values)
                release(rows)
                since_release = 0
        save_array(values_path, values)
        save_array(rows_path, rows)
        return distinct

    def remove(self) -> None:
        """Delete the scratch files (after `write`, or when the build fails)."""
        self.absent.remove()
        self.pairs.remove()
        if self._spill is not None:
            self._spill.remove()
