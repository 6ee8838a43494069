"""Building a bundle's payload index: each typed metadata field as sorted columns under payload/.

Two passes over the docstore's metadata (never its texts): the first counts the JSON kinds of every key, to
infer the type of each key not declared (models.bundle.payload.fields); the second gathers each indexed field's (value,
row) pairs, sorted by value on disk in bounded memory (models.bundle.payload.columns), into numpy arrays that
models.bundle.payload.index memory-maps:

- keyword and keyword-list: the distinct values in order (`dict`: their UTF-8 bytes, `dict_offsets`), and each
  value's rows ascending, one posting list after another (`rows`, delimited by `offsets`);
- integer, float, boolean, datetime: the values in order (`values`; datetimes as µs since the epoch) and the
  row of each (`rows`);
- every field: the rows without a value (`absent`), for `exists` and the complement of a wide match;
- every field but a keyword list: each row's position in `rows` (`ranks`; a row without a value: len(rows)), so a
  condition that selects a large share of the rows is a comparison over them instead of a scatter of its rows.

A condition on a field is then a few contiguous slices of `rows`, found by binary search: nothing is parsed
per row per request (docs/decisions.md#a-payload-index-of-sorted-columns).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from models.bundle.payload.columns import KEYWORD_TYPES, FieldColumns
from models.bundle.payload.fields import (
    PAYLOAD_SUBDIRECTORY,
    FieldType,
    PayloadField,
    PayloadInfo,
    Tally,
    describe_kinds,
    infer,
)
from models.bundle.storage.docstore import DocStore
from models.errors import InputError

log = logging.getLogger(__name__)

PAYLOAD_DIR = PAYLOAD_SUBDIRECTORY
READ_CHUNK = 10_000
MAX_INFERRED = 256  # undeclared keys indexed at most (the most common first); the rest read the docstore
KEYWORD_PARTS = ("dict", "dict_offsets", "offsets", "rows", "absent")
VALUE_PARTS = ("values", "rows", "absent")


def part_name(position: int, part: str) -> str:
    """The bundle-relative name of one array of the field at `position` in the schema."""
    return f"{PAYLOAD_DIR}/{position}.{part}.npy"


def field_parts(kind: FieldType, ranks: bool) -> tuple[str, ...]:
    """A field's arrays: its type's, and `ranks` where it has them (PayloadField.ranks)."""
    parts = KEYWORD_PARTS if kind in KEYWORD_TYPES else VALUE_PARTS
    return (*parts, "ranks") if ranks else parts


def payload_files(info: PayloadInfo) -> list[str]:
    """Every file of the payload index `info` describes (each is listed, and checksummed, in the manifest)."""
    return [part_name(i, part) for i, f in enumerate(info.fields) for part in field_parts(f.type, f.ranks)]


def _metadata(docs: DocStore, count: int):
    for start in range(0, count, READ_CHUNK):
        for row, raw in enumerate(docs.metadata_range(start, min(start + READ_CHUNK, count)), start):
            yield row, ({} if raw is None else json.loads(raw))


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
    out = staging / PAYLOAD_DIR
    out.mkdir(exist_ok=True)
    gathered = [FieldColumns(f, out, i, count) for i, f in enumerate(fields)]
    try:
        for row, meta in _metadata(docs, count):
            for g in gathered:
                try:
                    g.add(row, meta.get(g.field.name))
                except ValueError as exc:  # the build and the update check their lines first: this is a last guard
                    raise InputError(f"document {docs.get([row])[0].id!r} (row {row}): {exc}") from None
            if row % READ_CHUNK == READ_CHUNK - 1:
                for g in gathered:
                    g.flush()
        written = [g.write(out, {part: Path(part_name(i, part)).name for part in field_parts(g.field.type, g.ranked)})
                   for i, g in enumerate(gathered)]
    finally:
        for g in gathered:
            g.remove()
    for f in written:
        log.info("payload field %r (%s, %s): %d documents, %d distinct values", f.name, f.type.value,
                 "declared" if f.declared else "inferred", f.documents, f.values)
    info = PayloadInfo(fields=written, unindexed=unindexed)
    return info, payload_files(info)
