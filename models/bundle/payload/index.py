"""A bundle's payload index: its typed columns memory-mapped from payload/, and a filter evaluated on them into a
row mask (one bool per row of the bundle).

A condition is a few contiguous slices of a column's `rows` (models.bundle.payload.writer lays them out), found by
binary search: equality and `in` on keywords take their values' posting lists, a range the run of sorted values
between its bounds. The slices are scattered into the mask, or, when they hold most rows, what they leave out is
cleared from a full mask instead; or, when even that would scatter a large share of the rows, the mask is a
comparison of each row's rank with the slices' bounds (a scattered row costs about eight compared ones: random
writes against a sequential pass; docs/lab/2026-11-27-rank-mask.md). `and`, `or` and `not` are numpy's boolean
operations. A condition on a key the index leaves out (its values have no single type: `PayloadInfo.unindexed`)
asks `fallback`, the docstore's SQL for that condition; a key the segment's schema lacks altogether (a field a later
segment added) is absent from every row, answered without reading anything.
Nothing is parsed per row per request, and RAM holds no column: the arrays are pages of the bundle's files. A
field's files are opened when the segment loads and mapped the first time a filter names the field
(models.bundle.payload.parts): a segment's fields cost a filter nothing until it uses them, and each is loaded once,
checked whole before any filter sees it, however many threads name it at once.

The semantics are the JSON path's (models.search.filters), with the two the types add: a keyword-list matches when
any element does, a datetime compares instants.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.bundle.payload.fields import FieldType, PayloadField, PayloadInfo, to_micros, typed
from models.bundle.payload.parts import map_part, open_part, read_header
from models.bundle.payload.writer import KEYWORD_TYPES, field_parts, part_name
from models.bundle.storage.dictionary import Dictionary

log = logging.getLogger(__name__)

Leaf = tuple[Any, ...]
Fallback = Callable[[Leaf], np.ndarray]  # a condition on an unindexed key → its row mask
_INT64 = (-(2**63), 2**63 - 1)
_LOWER = {"gte": "left", "gt": "right"}  # a lower bound's side in searchsorted / bisect
_UPPER = {"lte": "right", "lt": "left"}
SCATTER_COST = 8  # a row scattered into a mask costs about as much as this many rows compared (measured, E5)


def parts_agree(field: PayloadField, sizes: Mapping[str, int | None], rows_end: Callable[[], int], count: int
                ) -> bool:
    """Whether a field's parts agree in size as the writer lays them out: each one-dimensional (`sizes`: the part's
    length, None for another shape); for a keyword type as many offsets as dictionary offsets (one more than its
    values), the last (`rows_end`, read only when the rest agree) at the rows' end; else a value per row; and ranks,
    where written, one per row of the segment. Asked of the parts' headers when a segment loads (`_Field`) and of
    the mapped arrays when a column is (`Column`): the files may have changed in between."""
    size = {part: n for part, n in sizes.items() if n is not None}
    if len(size) < len(sizes):
        return False
    if field.type in KEYWORD_TYPES:
        ok = size["offsets"] == size["dict_offsets"] > 0 and rows_end() == size["rows"]
    else:
        ok = size["values"] == size["rows"]
    return ok and size.get("ranks", count) == count


class Column:
    """One field: its rows sorted by value, the rows without one and, for keyword types, the values' dictionary."""

    def __init__(self, field: PayloadField, arrays: Mapping[str, np.ndarray], count: int) -> None:
        """The column of `arrays` (each of the field's parts, models.bundle.payload.writer's), their sizes checked
        against each other."""
        self.field, self.count, self.type = field, count, field.type
        self.rows, self.absent = arrays["rows"], arrays["absent"]
        self.ranks: np.ndarray | None = arrays.get("ranks")  # None: a bundle written before ranks, a keyword list
        self.keyword = field.type in KEYWORD_TYPES
        self.repeats = field.type is FieldType.KEYWORD_LIST  # a row may sit in several posting lists
        if self.keyword:
            self.dictionary = Dictionary(arrays["dict"], arrays["dict_offsets"])
            self.offsets = arrays["offsets"]
        else:
            self.values = arrays["values"]
        sizes = {part: len(a) if a.ndim == 1 else None for part, a in arrays.items()}
        if not parts_agree(field, sizes, lambda: int(self.offsets[-1]), count):
            raise ValueError(f"payload field {field.name!r}: its arrays do not match each other")

    def check(self) -> None:
        """Every invariant the search relies on, reading every byte (`tandem index verify`)."""
        rows = np.asarray(self.rows)
        bad = len(rows) and (rows.min() < 0 or rows.max() >= self.count)
        bad = bad or (len(self.absent) and (self.absent.min() < 0 or self.absent.max() >= self.count))
        if self.keyword:
            offsets = np.asarray(self.offsets)
            bad = bad or offsets[0] != 0 or bool(np.any(np.diff(offsets) < 0))
            values = list(self.dictionary)
            bad = bad or any(a >= b for a, b in itertools.pairwise(values))
        else:
            bad = bad or bool(np.any(np.diff(self.values) < 0))
        if not self.repeats:
            bad = bad or len(rows) + len(self.absent) != self.count
        if self.ranks is not None and not bad:  # the inverse of `rows`, len(rows) where a row has no value
            expected = np.full(self.count, len(rows), dtype=self.ranks.dtype)
            expected[rows] = np.arange(len(rows))
            bad = not np.array_equal(expected, self.ranks)
        if bad:
            raise ValueError(f"payload field {self.field.name!r}: its arrays are inconsistent")

    # --- a condition → slices of `rows` -----------------------------------------------------------------------

    def _key(self, value: object) -> Any:
        """The stored key equal to a filter's value, or None when no stored value can equal it."""
        if self.keyword:
            return self.dictionary.find(value) if isinstance(value, str) else None
        try:  # as the column stores it: a value it could not store equals none of its values
            stored = typed(self.type, value)
        except ValueError:
            return None
        return int(stored) if isinstance(stored, bool) else stored  # a boolean column stores 0 and 1

    def _span(self, key: Any) -> tuple[int, int]:
        if self.keyword:
            return int(self.offsets[key]), int(self.offsets[key + 1])
        return self._position(key, "left"), self._position(key, "right")

    def _position(self, bound: Any, side: str) -> int:
        """Where `bound` falls in the sorted values: before equal ones ('left') or after them ('right')."""
        if self.keyword:
            code = (bisect.bisect_left if side == "left" else bisect.bisect_right)(self.dictionary, bound)
            return int(self.offsets[code])
        if self.type is FieldType.INTEGER:
            if isinstance(bound, float):  # x ≥ 2.5 ⇔ x ≥ 3; x ≤ 2.5 ⇔ x ≤ 2 (the sides of the same cut)
                bound = math.ceil(bound) if side == "left" else math.floor(bound)
            if bound > _INT64[1]:
                return len(self.values)
            if bound < _INT64[0]:
                return 0
            return int(np.searchsorted(self.values, np.int64(bound), side=side))  # type: ignore[call-overload]
        # the bound in the column's own dtype: another would make numpy convert the whole column first
        return int(np.searchsorted(self.values, self.values.dtype.type(bound), side=side))  # type: ignore[call-overload]

    def _range(self, kind: str, bounds: Sequence[tuple[str, Any]]) -> list[tuple[int, int]]:
        wanted = "date" if self.keyword or self.type is FieldType.DATETIME else "number"
        if kind != wanted or self.type is FieldType.BOOLEAN:
            return []
        if self.type is FieldType.DATETIME:
            bounds = [(op, to_micros(v)) for op, v in bounds]
            if any(v is None for _, v in bounds):
                return []
        lo, hi = 0, len(self.rows)
        for op, value in bounds:
            if op in _LOWER:
                lo = max(lo, self._position(value, _LOWER[op]))
            else:
                hi = min(hi, self._position(value, _UPPER[op]))
        return [(lo, hi)] if lo < hi else []

    def spans(self, leaf: Leaf) -> list[tuple[int, int]]:
        """The slices of `rows` a condition (eq, in or range) selects, sorted and apart."""
        op = leaf[0]
        if op == "range":
            return self._range(leaf[2], leaf[3])
        values = [leaf[2]] if op == "eq" else list(leaf[2])
        keys = {key for key in (self._key(v) for v in values) if key is not None}
        found = sorted(self._span(key) for key in keys)
        return [(a, b) for a, b in found if a < b]

    def mask(self, leaf: Leaf) -> np.ndarray:
        """The rows a condition on this field holds for."""
        if leaf[0] == "exists":
            mask = np.full(self.count, leaf[2], dtype=bool)
            mask[self.absent] = not leaf[2]
            return mask
        spans = _joined(self.spans(leaf))
        plan = self._plan(spans)
        if plan == "ranks":
            return self._compared(spans)
        if plan == "clear":
            mask = np.ones(self.count, dtype=bool)
            mask[self.absent] = False
            start = 0
            for a, b in spans:
                mask[_indices(self.rows[start:a])] = False
                start = b
            mask[_indices(self.rows[start:])] = False
            return mask
        mask = np.zeros(self.count, dtype=bool)
        for a, b in spans:
            mask[_indices(self.rows[a:b])] = True
        return mask

    def mask_plan(self, leaf: Leaf) -> str:
        """How `mask` writes a condition's mask (eq, in or range): 'scatter' its rows, 'clear' the others from a
        full mask, or compare the rows' 'ranks'."""
        return self._plan(_joined(self.spans(leaf)))

    def _plan(self, spans: list[tuple[int, int]]) -> str:
        selected = sum(b - a for a, b in spans)
        clear = not self.repeats and 2 * selected > len(self.rows)  # most rows match: clear the others
        scattered = len(self.rows) - selected + len(self.absent) if clear else selected
        passes = sum(1 if a == 0 or b == len(self.rows) else 2 for a, b in spans)  # a one-sided span: one compare
        if self.ranks is not None and SCATTER_COST * scattered > self.count * passes:
            return "ranks"
        return "clear" if clear else "scatter"

    def _compared(self, spans: list[tuple[int, int]]) -> np.ndarray:
        """The mask of `spans` from the rows' ranks: a sequential pass or two over them per span, however many rows
        the spans hold (a row without a value ranks len(rows), past every span)."""
        assert self.ranks is not None
        mask = np.empty(self.count, dtype=bool)
        part = np.empty(self.count, dtype=bool) if len(spans) > 1 else mask
        for i, (a, b) in enumerate(spans):
            into = mask if i == 0 else part
            if a == 0:
                np.less(self.ranks, b, out=into)
            else:
                np.greater_equal(self.ranks, a, out=into)
                if b < len(self.rows):
                    np.logical_and(into, np.less(self.ranks, b), out=into)
            if i:
                np.logical_or(mask, part, out=mask)
        if not spans:
            mask[:] = False
        if spans and spans[-1][1] == len(self.rows):
            mask[self.absent] = False  # ranked len(rows): not below the last span's end
        return mask


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, apart spans with the touching ones joined (`in` on neighbouring values)."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _indices(rows: np.ndarray) -> np.ndarray:
    """Rows as numpy's own index type: indexing with int32 converts them on the way, slower (measured 1.7×)."""
    return np.asarray(rows, dtype=np.intp)


class _Field:
    """One field of the index: its parts' descriptors until its column is loaded, then the column. The lock makes
    the first filters that need the column load it once between them, while filters on other fields go on."""

    def __init__(self, directory: Path, position: int, field: PayloadField, count: int) -> None:
        self.field, self.directory, self.count = field, directory, count
        self.lock = threading.Lock()
        self.column: Column | None = None  # set once, to a column checked whole: never seen half-loaded
        self.descriptors: dict[str, int] = {}
        try:
            for part in field_parts(field.type, field.ranks):
                self.descriptors[part] = open_part(directory / part_name(position, part))
            self._check_sizes()
        except BaseException:
            self.close()
            raise

    def _check_sizes(self) -> None:
        """parts_agree, from the parts' headers (and the last offset's bytes): a field whose parts disagree refuses
        its segment's load, as when the parts were mapped at opening, never a filter."""
        headers = {part: read_header(fd) for part, fd in self.descriptors.items()}
        sizes = {part: shape[0] if len(shape) == 1 else None for part, (shape, *_) in headers.items()}

        def rows_end() -> int:  # offsets[-1]: its bytes in the header's dtype (byte order included)
            (n,), _, dtype, start = headers["offsets"]  # one-dimensional and not empty: parts_agree asks only then
            at = start + (n - 1) * dtype.itemsize
            return int(np.frombuffer(os.pread(self.descriptors["offsets"], dtype.itemsize, at), dtype)[0])

        if not parts_agree(self.field, sizes, rows_end, self.count):
            raise ValueError(f"payload field {self.field.name!r}: its arrays do not match each other")

    def load(self) -> Column:
        column = self.column
        if column is not None:
            return column
        with self.lock:
            if self.column is None:
                if not self.descriptors:
                    raise ValueError(f"payload field {self.field.name!r}: its index is closed")
                try:
                    arrays = {part: map_part(fd) for part, fd in self.descriptors.items()}
                    self.column = Column(self.field, arrays, self.count)
                except (ValueError, OSError) as exc:  # the error names the field; the log, the segment too
                    log.error("%s: payload field %r is unreadable: %s", self.directory, self.field.name, exc)
                    raise
                self.close()  # each map holds its own descriptor
            return self.column

    def close(self) -> None:
        for fd in self.descriptors.values():
            os.close(fd)
        self.descriptors.clear()


def _close(fields: list[_Field]) -> None:
    for f in fields:
        with f.lock:
            f.close()


class PayloadIndex:
    """The payload index of a bundle of `count` rows: each field's parts opened, and mapped into its column the first
    time a filter names the field (models.bundle.payload.parts)."""

    def __init__(self, directory: Path, info: PayloadInfo, count: int) -> None:
        self.info, self.count = info, count
        fields: list[_Field] = []
        try:
            for i, f in enumerate(info.fields):
                fields.append(_Field(Path(directory), i, f, count))
        except BaseException:
            _close(fields)
            raise
        self._fields = {f.field.name: f for f in fields}
        self._closer = weakref.finalize(self, _close, fields)  # the descriptors of fields never loaded
        self.unindexed = frozenset(info.unindexed)
        self._looked_up = 0  # filter values looked up in the columns since loading (tests bound work by it)
        self._looked_up_lock = threading.Lock()

    def column(self, name: str) -> Column | None:
        """The field's column, loaded now if no filter needed it before; None for a key the index does not hold."""
        field = self._fields.get(name)
        return None if field is None else field.load()

    @property
    def loaded(self) -> frozenset[str]:
        """The fields whose columns are loaded: those filters have named so far."""
        return frozenset(name for name, f in self._fields.items() if f.column is not None)

    def close(self) -> None:
        """Close the parts of the columns not loaded (a loaded column's maps close with their last reference)."""
        self._closer()

    @property
    def values_looked_up(self) -> int:
        """Values of eq and in conditions looked up in this index's columns so far."""
        with self._looked_up_lock:
            return self._looked_up

    def evaluate(self, tree: tuple[Any, ...], fallback: Fallback) -> np.ndarray:
        """The row mask of a parsed filter (models.search.filters' tree): a new array the caller owns."""
        op = tree[0]
        if op == "not":
            mask = self.evaluate(tree[1], fallback)
            return np.logical_not(mask, out=mask)
        if op in ("and", "or"):
            parts = iter(tree[1])
            mask = self.evaluate(next(parts), fallback)
            combine = np.logical_and if op == "and" else np.logical_or
            for part in parts:
                combine(mask, self.evaluate(part, fallback), out=mask)
            return mask
        column = self.column(tree[1])
        if column is not None:
            if op in ("eq", "in"):
                with self._looked_up_lock:
                    self._looked_up += 1 if op == "eq" else len(tree[2])
            return column.mask(tree)
        if tree[1] in self.unindexed:
            return fallback(tree)
        # no row of this segment holds the key: it exists nowhere and equals nothing
        return np.full(self.count, op == "exists" and not tree[2], dtype=bool)

    def check(self) -> None:
        """Every column's invariants (`tandem index verify`): each is loaded to be read whole."""
        for field in self._fields.values():
            field.load().check()
