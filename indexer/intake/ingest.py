"""Reading a corpus into a staging docstore in one streaming pass.

The pass writes docs.sqlite (its unique id index finds duplicate ids on disk), computes the
corpus key that names the embedding-store entry, and notes the byte offset of every
OFFSET_STRIDE-th document so that the Ray engine's actors can parse a shard's own slice of the file.
Memory holds one chunk of documents, whatever the corpus size.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from models.bundle.payload.fields import PayloadField, check_metadata
from models.bundle.storage.docstore import DocStore, DocstoreWriter, DuplicateId
from models.corpus import RESERVED_KEYS, CorpusHasher, Document, first_line_of, json_object, scan_corpus
from models.errors import InputError

log = logging.getLogger(__name__)

CHUNK = 10_000
OFFSET_STRIDE = 64


@dataclass
class IngestedCorpus:
    path: Path
    count: int
    key: str
    offsets: list[int] = field(default_factory=list)  # byte offset of rows 0, OFFSET_STRIDE, 2·OFFSET_STRIDE, …


def ingest_corpus(path: Path, docstore: DocstoreWriter, extra_metadata: bool = False,
                  fields: Sequence[PayloadField] = ()) -> IngestedCorpus:
    """Stream `path` into `docstore`; raise InputError naming file and line on a bad line, a duplicate id or a
    value of another type than its declared field's (`fields`, models.bundle.payload.fields).

    `extra_metadata` keeps a line's keys outside id, title and text as metadata (models.corpus)."""
    hasher = CorpusHasher()
    offsets: list[int] = []
    batch: list[Document] = []
    lines: list[int] = []

    def flush() -> None:
        try:
            docstore.add(batch)
        except DuplicateId as dup:
            first = first_line_of(path, dup.doc_id)
            raise InputError(f"{path}:{lines[dup.position]}: duplicate id {dup.doc_id!r} "
                             f"(first seen on line {first})") from None
        batch.clear()
        lines.clear()

    count = 0
    carried = dict.fromkeys((f.name for f in fields), 0)  # documents holding each declared field
    for lineno, offset, doc in scan_corpus(path, extra_metadata):
        if count % OFFSET_STRIDE == 0:
            offsets.append(offset)
        if fields and doc.metadata is not None:
            meta = doc.meta()
            check_metadata(meta, fields, f"{path}:{lineno}")
            for name in carried:
                carried[name] += meta.get(name) is not None
        hasher.update(doc)
        batch.append(doc)
        lines.append(lineno)
        count += 1
        if len(batch) >= CHUNK:
            flush()
    if batch:
        flush()
    for name in (name for name, held in carried.items() if not held):
        _check_empty_field(path, name, extra_metadata)
    return IngestedCorpus(path=Path(path), count=count, key=hasher.hexdigest(), offsets=offsets)


def _check_empty_field(path: Path, name: str, extra_metadata: bool) -> None:
    """A declared field no document holds: an InputError when the lines carry it at top level, which is metadata
    only with --metadata-extra (the field would index nothing, silently); else a warning."""
    line = None if extra_metadata or name in RESERVED_KEYS else _top_level_line(path, name)
    if line is not None:
        raise InputError(f"{path}:{line}: --field {name} is declared but no document's metadata holds {name!r}; "
                         f"the lines carry {name!r} as a top-level key, which is metadata only with "
                         "--metadata-extra: pass --metadata-extra, or move it into each line's 'metadata' object")
    log.warning("--field %s: no document of %s holds it (the field is declared, and empty)", name, path)


def _top_level_line(path: Path, name: str) -> int | None:
    """The first line whose object holds `name` (not null) at top level, outside `metadata`; None if none does."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.decode("utf-8")  # scan_corpus has read every line already: each decodes and parses
            if line.strip() and json_object(line, f"{path}:{lineno}").get(name) is not None:
                return lineno
    return None


class Passages(Sequence[str]):
    """The texts the teacher sees, read from a docstore by row range: a lazy sequence for the encoders."""

    def __init__(self, docs: DocStore, count: int) -> None:
        self.docs, self.size = docs, count

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, item):
        if isinstance(item, slice):
            start, stop, step = item.indices(self.size)
            if step != 1:
                raise ValueError("Passages slices must be contiguous")
            return [d.passage() for d in self.docs.range(start, stop)]
        if not 0 <= item < self.size:
            raise IndexError(item)
        return self.docs.range(item, item + 1)[0].passage()
