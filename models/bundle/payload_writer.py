"""Building a bundle's payload index: each typed metadata field as sorted columns under payload/.

Two passes over the docstore's metadata (never its texts): the first counts the JSON kinds of every key, to
infer the type of each key not declared (models.bundle.fields); the second gathers each indexed field's (value, row)
pairs, sorts them by value and writes numpy arrays that models.bundle.payload memory-maps:

- keyword and keyword-list: the distinct values in order (`dict`: their UTF-8 bytes, `dict_offsets`), and each
  value's rows ascending, one posting list after another (`rows`, delimited by `offsets`);
- integer, float, boolean, datetime: the values in order (`values`; datetimes as µs since the epoch) and the
  row of each (`rows`);
- every field: the rows without a value (`absent`), for `exists` and the complement of a wide match.

A condition on a field is then a few contiguous slices of `rows`, found by binary search: nothing is parsed
per row per request (docs/decisions.md#a-payload-index-of-sorted-columns).
"""

from __future__ import annotations

import json
import logging
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.bundle.dictionary import run_offsets, sorted_dictionary
from models.bundle.docstore import DocStore
from models.bundle.fields import FieldType, PayloadField, PayloadInfo, Tally, describe_kinds, infer, typed
from models.bundle.manifest import PAYLOAD_SUBDIRECTORY
from models.errors import InputError

log = logging.getLogger(__name__)

PAYLOAD_DIR = PAYLOAD_SUBDIRECTORY
READ_CHUNK = 10_000
MAX_INFERRED = 256  # undeclared keys indexed at most (the most common first); the rest read the docstore
KEYWORD_PARTS = ("dict", "dict_offsets", "offsets", "rows", "absent")
VALUE_PARTS = ("values", "rows", "absent")
KEYWORD_TYPES = frozenset({FieldType.KEYWORD, FieldType.KEYWORD_LIST})
_VALUE_CODES = {FieldType.INTEGER: "q", FieldType.DATETIME: "q", FieldType.FLOAT: "d", FieldType.BOOLEAN: "b"}


def part_name(position: int, part: str) -> str:
    """The bundle-relative name of one array of the field at `position` in the schema."""
    return f"{PAYLOAD_DIR}/{position}.{part}.npy"


def field_parts(kind: FieldType) -> tuple[str, ...]:
    return KEYWORD_PARTS if kind in KEYWORD_TYPES else VALUE_PARTS


def payload_files(info: PayloadInfo) -> list[str]:
    """Every file of the payload index `info` describes (each is listed, and checksummed, in the manifest)."""
    return [part_name(i, part) for i, f in enumerate(info.fields) for part in field_parts(f.type)]


def row_dtype(count: int) -> type[np.signedinteger]:
    return np.int32 if count < 2**31 else np.int64


def _metadata(docs: DocStore, count: int):
    for start in range(0, count, READ_CHUNK):
        for row, raw in enumerate(docs.metadata_range(start, min(start + READ_CHUNK, count)), start):
            yield row, ({} if raw is None else json.loads(raw))


class _Gathered:
    """One field's (value, row) pairs as they are read, in compact arrays (no Python object per row)."""

    def __init__(self, field: PayloadField) -> None:
        self.field = field
        self.keyword = field.type in KEYWORD_TYPES
        self.codes: dict[str, int] = {}  # keyword types: value → code in order of first appearance
        self.keys = array("q" if self.keyword else _VALUE_CODES[field.type])
        self.rows = array("q")
        self.absent = array("q")

    def add(self, row: int, value: object) -> None:
        if value is None:
            self.absent.append(row)
            return
        try:
            stored = typed(self.field.type, value)
        except ValueError as exc:  # write_payload names the document
            raise ValueError(f"field {self.field.name!r} is {self.field.origin} {self.field.type.value}: {exc}, got "
                             f"{value!r:.60}") from None
        if not self.keyword:
            self.keys.append(stored)  # type: ignore[arg-type]
            self.rows.append(row)
            return
        values: list[str] = stored if isinstance(stored, list) else [str(stored)]
        for text in values:  # none for an empty list: a value, but no element to match
            self.keys.append(self.codes.setdefault(text, len(self.codes)))
            self.rows.append(row)

    def write(self, directory: Path, position: int, count: int) -> PayloadField:
        """Sort by value and save the arrays; returns the field with its counts."""
        keys = np.frombuffer(self.keys, dtype=np.dtype(self.keys.typecode)) if self.keys else np.zeros(
            0, dtype=np.dtype(self.keys.typecode))
        rows = np.frombuffer(self.rows, dtype=np.int64) if self.rows else np.zeros(0, dtype=np.int64)
        arrays: dict[str, np.ndarray] = {"absent": np.asarray(self.absent, dtype=row_dtype(count))}
        if self.keyword:
            remap, blob, blob_offsets = sorted_dictionary(self.codes)
            keys = remap[keys] if len(keys) else keys
            order = np.lexsort((rows, keys))
            keys, rows = keys[order], rows[order]
            if self.field.type is FieldType.KEYWORD_LIST and len(keys):  # ["a", "a"]: one posting
                first = np.r_[True, (keys[1:] != keys[:-1]) | (rows[1:] != rows[:-1])]
                keys, rows = keys[first], rows[first]
            arrays["dict"], arrays["dict_offsets"] = np.frombuffer(blob, dtype=np.uint8), blob_offsets
            arrays["offsets"] = run_offsets(np.bincount(keys, minlength=len(remap)))
            distinct = len(remap)
        else:
            order = np.argsort(keys, kind="stable")  # rows ascending within a value
            keys, rows = keys[order], rows[order]
            arrays["values"] = keys.astype(np.int8) if self.field.type is FieldType.BOOLEAN else keys
            distinct = int(np.count_nonzero(np.diff(keys))) + 1 if len(keys) else 0
        arrays["rows"] = rows.astype(row_dtype(count))
        for part in field_parts(self.field.type):
            np.save(directory / Path(part_name(position, part)).name, arrays[part])
        # a row holding [] has a value (it exists) but no posting
        return self.field.model_copy(update={"documents": count - len(self.absent), "values": distinct})


def _schema(tally: Tally, fixed: Sequence[PayloadField], unindexed_before: Sequence[str] = ()) -> tuple[
        list[PayloadField], list[str]]:
    """The fields to index (the fixed ones, then the keys whose type infers, most common first) and the keys left
    to the docstore (`unindexed_before` stays there), each reported in the log."""
    known = {f.name for f in fixed}
    inferred: list[PayloadField] = []
    unindexed: list[str] = []
    for name in sorted(tally.kinds, key=lambda n: (-sum(tally.kinds[n].values()), n)):
        if name in known:
            continue
        if name in unindexed_before:  # a later segment filters on it as the version's first did: by the docstore
            unindexed.append(name)
            continue
        kind = infer(tally, name)
        if kind is None or len(inferred) >= MAX_INFERRED:
            unindexed.append(name)
            why = describe_kinds(tally.kinds[name]) if kind is None else f"more than {MAX_INFERRED} keys"
            log.warning("metadata key %r is not indexed (%s): filters on it read the docstore; declare "
                        "--field %s:TYPE to index it", name, why, name)
            continue
        inferred.append(PayloadField(name=name, type=kind))
        hint = ""
        if kind is FieldType.KEYWORD and tally.dates.get(name):
            hint = f"; its values read as ISO dates: --field {name}:datetime would compare them as instants"
        log.info("payload field %r: %s, inferred from %s%s", name, kind.value, describe_kinds(tally.kinds[name]),
                 hint)
    return [*fixed, *sorted(inferred, key=lambda f: f.name)], sorted(unindexed)


def write_payload(staging: Path, docs: DocStore, count: int, fixed: Sequence[PayloadField] = (),
                  unindexed: Sequence[str] = ()) -> tuple[PayloadInfo, list[str]]:
    """Index rows [0, count) of `docs` into staging/payload/: the `fixed` fields (declared at build, or kept
    from the base of an update) with their types, every other key as inferred but the `unindexed` ones (a
    version's, which its later segments leave to the docstore too). Returns the schema and the files."""
    tally = Tally()
    for _, meta in _metadata(docs, count):
        tally.add(meta)
    fields, unindexed = _schema(tally, fixed, unindexed)
    gathered = [_Gathered(f) for f in fields]
    for row, meta in _metadata(docs, count):
        for g in gathered:
            try:
                g.add(row, meta.get(g.field.name))
            except ValueError as exc:  # the build and the update check their lines first: this is a last guard
                raise InputError(f"document {docs.get([row])[0].id!r} (row {row}): {exc}") from None
    out = staging / PAYLOAD_DIR
    out.mkdir(exist_ok=True)
    written = [g.write(out, i, count) for i, g in enumerate(gathered)]
    for f in written:
        log.info("payload field %r (%s, %s): %d documents, %d distinct values", f.name, f.type.value,
                 "declared" if f.declared else "inferred", f.documents, f.values)
    info = PayloadInfo(fields=written, unindexed=unindexed)
    return info, payload_files(info)
