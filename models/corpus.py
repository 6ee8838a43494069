"""Reading corpora: BEIR JSONL (`_id`, `title`, `text`) or plain `{"id", "text"}` lines.

Every bad line is an InputError naming the file and line, never a silent skip.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from models.errors import InputError


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str

    def passage(self) -> str:
        """The text the encoders see: title and body, as BEIR models are evaluated."""
        return f"{self.title} {self.text}".strip() if self.title else self.text.strip()


def _field(obj: dict, *names: str) -> object:
    for name in names:
        if name in obj:
            return obj[name]
    return None


def parse_line(line: str, where: str) -> Document:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
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
    return Document(id=str(doc_id), title=title.strip(), text=text.strip())


def iter_corpus(path: Path) -> Iterator[Document]:
    """Yield documents in file order; raises InputError on the first bad line or duplicate id."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: corpus file not found")
    seen: dict[str, int] = {}
    with path.open("rb") as fh:  # bytes, so a decoding error is reported on its own line
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason})") from exc
            if not line.strip():
                continue
            doc = parse_line(line, f"{path}:{lineno}")
            if doc.id in seen:
                raise InputError(f"{path}:{lineno}: duplicate id {doc.id!r} (first seen on line {seen[doc.id]})")
            seen[doc.id] = lineno
            yield doc
    if not seen:
        raise InputError(f"{path}: corpus is empty")


def read_corpus(path: Path) -> list[Document]:
    return list(iter_corpus(path))


def corpus_key(docs: list[Document]) -> str:
    """Content hash of the texts the teacher sees, in order: the key of the embedding store."""
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(doc.id.encode())
        digest.update(b"\x00")
        digest.update(doc.passage().encode())
        digest.update(b"\x01")
    return digest.hexdigest()
