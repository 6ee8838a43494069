"""Reading the changes of `tandem index update`: upserts and deletes by document id.

`--changes FILE.jsonl`: each line is a document in the corpus formats (BEIR `_id/title/text`
or `id/text`), added or replacing the document with that id, or `{"_id": ID, "delete": true}`.
A line's keys outside id, title and text become metadata exactly when the base bundle was built
with `--metadata-extra` (its manifest's `corpus.metadata_extra`), so an updated document keeps them,
and a value of a payload field must have the field's type (the base's schema is kept).
`--delete-ids FILE`: one id per line (blank lines and `#` comments skipped).
An id may appear once across both files; every bad line is an InputError naming file:line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.bundle.payload.fields import PayloadField, check_metadata
from models.corpus import Document, parse_line
from models.errors import InputError


@dataclass(frozen=True)
class Changes:
    upserts: list[Document]
    deletes: dict[str, str]  # id → "file:line", to name the line in later errors

    @property
    def empty(self) -> bool:
        return not self.upserts and not self.deletes


def _lines(path: Path) -> list[tuple[str, str]]:
    """(where, line) for each non-blank line, decoding per line so a bad byte names its line."""
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    out = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason})") from exc
            if line.strip():
                out.append((f"{path}:{lineno}", line))
    return out


def _delete_id(obj: dict, where: str) -> str:
    if obj["delete"] is not True:
        raise InputError(f"{where}: 'delete' must be true (omit it to add or replace a document)")
    doc_id = obj.get("_id", obj.get("id"))
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int) or not str(doc_id).strip():
        raise InputError(f"{where}: a delete needs a document id ('_id' or 'id', a string or integer)")
    extra = set(obj) - {"_id", "id", "delete"}
    if extra:
        raise InputError(f"{where}: a delete line carries only the id and 'delete', not {sorted(extra)}")
    return str(doc_id)


def read_changes(changes: Path | None, delete_ids: Path | None, extra_metadata: bool = False,
                 fields: Sequence[PayloadField] = ()) -> Changes:
    """Upserts and deletes; `extra_metadata` parses document lines as the base bundle's corpus was parsed, and
    each value of one of `fields` (the base's payload schema) must have its type."""
    seen: dict[str, str] = {}

    def claim(doc_id: str, where: str) -> None:
        if doc_id in seen:
            raise InputError(f"{where}: id {doc_id!r} already changed at {seen[doc_id]}")
        seen[doc_id] = where

    upserts: list[Document] = []
    deletes: dict[str, str] = {}
    if changes is not None:
        for where, line in _lines(Path(changes)):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = None  # parse_line reports it with the column
            if isinstance(obj, dict) and "delete" in obj:
                doc_id = _delete_id(obj, where)
                claim(doc_id, where)
                deletes[doc_id] = where
                continue
            doc = parse_line(line, where, extra_metadata)
            if fields and doc.metadata is not None:
                check_metadata(doc.meta(), fields, where)
            claim(doc.id, where)
            upserts.append(doc)
    if delete_ids is not None:
        for where, line in _lines(Path(delete_ids)):
            doc_id = line.strip()
            if doc_id.startswith("#"):
                continue
            claim(doc_id, where)
            deletes[doc_id] = where
    if changes is None and delete_ids is None:
        raise InputError("nothing to do: give --changes FILE.jsonl and/or --delete-ids FILE")
    return Changes(upserts=upserts, deletes=deletes)
