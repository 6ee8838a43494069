"""Reading corpora: BEIR JSONL (`_id`, `title`, `text`) or plain `{"id", "text"}` lines.

Every bad line is an InputError naming the file and line, never a silent skip.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.errors import InputError

RESERVED_KEYS = frozenset({"_id", "id", "title", "text", "metadata"})


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str
    metadata: str | None = None  # a JSON object, keys sorted (hashable, and equal when the data are)

    def passage(self) -> str:
        """The text the encoders see: title and body, as BEIR models are evaluated (metadata never is)."""
        return f"{self.title} {self.text}".strip() if self.title else self.text.strip()

    def meta(self) -> dict[str, object]:
        return {} if self.metadata is None else dict(json.loads(self.metadata))

    def to_json(self) -> dict[str, object]:
        """The BEIR line that parse_line reads back into this document."""
        out: dict[str, object] = {"_id": self.id, "title": self.title, "text": self.text}
        if self.metadata is not None:
            out["metadata"] = json.loads(self.metadata)
        return out


def _metadata(obj: dict, where: str, extra: bool) -> str | None:
    """A line's `metadata` object, plus (with `extra`) its keys outside id, title and text."""
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise InputError(f"{where}: 'metadata' must be a JSON object")
    merged = dict(meta or {})
    if extra:
        for key, value in obj.items():
            if key not in RESERVED_KEYS:
                merged.setdefault(key, value)
    if not merged:
        return None
    return json.dumps(merged, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _field(obj: dict, *names: str) -> object:
    for name in names:
        if name in obj:
            return obj[name]
    return None


def json_object(line: str, where: str) -> dict[str, Any]:
    """One JSONL line as an object, or an InputError naming `where` (file:line) and what is wrong."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def parse_line(line: str, where: str, extra_metadata: bool = False) -> Document:
    """One corpus line; `extra_metadata` keeps keys outside id, title and text as metadata."""
    obj = json_object(line, where)
    doc_id = _field(obj, "_id", "id")
    if doc_id is None or (isinstance(doc_id, str) and not doc_id.strip()):
        raise InputError(f"{where}: missing document id ('_id' or 'id')")
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool):
        raise InputError(f"{where}: document id must be a string or integer")
    text = obj.get("text")
    if text is None:
        raise InputError(f"{where}: missing 'text'")
    if not isinstance(text, str):
        raise InputError(f"{where}: 'text' must be a string")
    title = obj.get("title") or ""
    if not isinstance(title, str):
        raise InputError(f"{where}: 'title' must be a string")
    if not text.strip():
        raise InputError(f"{where}: empty text for document {doc_id!r}")
    return Document(id=str(doc_id), title=title.strip(), text=text.strip(),
                    metadata=_metadata(obj, where, extra_metadata))


def scan_corpus(path: Path, extra_metadata: bool = False) -> Iterator[tuple[int, int, Document]]:
    """Yield (line number, byte offset of the line, document) in file order, holding nothing.

    Raises InputError on the first bad line. Duplicate ids are the caller's to catch: a
    streaming build lets the docstore's unique index find them (models.bundle.storage.docstore).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: corpus file not found")
    empty = True
    offset = 0
    with path.open("rb") as fh:  # bytes, so a decoding error is reported on its own line
        for lineno, raw in enumerate(fh, start=1):
            start, offset = offset, offset + len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason})") from exc
            if not line.strip():
                continue
            empty = False
            yield lineno, start, parse_line(line, f"{path}:{lineno}", extra_metadata)
    if empty:
        raise InputError(f"{path}: corpus is empty")


def first_line_of(path: Path, doc_id: str) -> int | None:
    """The line where `doc_id` first appears (for error messages; rescans the file)."""
    for lineno, _, doc in scan_corpus(path):
        if doc.id == doc_id:
            return lineno
    return None


def iter_corpus(path: Path) -> Iterator[Document]:
    """Yield documents in file order; raises InputError on the first bad line or duplicate id."""
    seen: dict[str, int] = {}
    for lineno, _, doc in scan_corpus(path):
        if doc.id in seen:
            raise InputError(f"{path}:{lineno}: duplicate id {doc.id!r} (first seen on line {seen[doc.id]})")
        seen[doc.id] = lineno
        yield doc


def read_corpus(path: Path) -> list[Document]:
    return list(iter_corpus(path))


class CorpusHasher:
    """The corpus key, fed one document at a time (a streaming build never holds the corpus)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def update(self, doc: Document) -> None:
        self._digest.update(doc.id.encode())
        self._digest.update(b"\x00")
        self._digest.update(doc.passage().encode())
        self._digest.update(b"\x01")

    def passing(self, docs: Iterable[Document]) -> Iterator[Document]:
        """Each document of `docs`, once the key counts it: a stream hashed on its way to a writer."""
        for doc in docs:
            self.update(doc)
            yield doc

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def corpus_key(docs: Iterable[Document]) -> str:
    """Content hash of the texts the teacher sees, in order: the key of the embedding store."""
    hasher = CorpusHasher()
    for doc in docs:
        hasher.update(doc)
    return hasher.hexdigest()
