"""The bundle's document store: FAISS row id → (id, title, text), in SQLite.

SQLite gives random access without loading the corpus into memory, and is in the stdlib.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from models.corpus import Document

DOCSTORE_FILE = "docs.sqlite"


def write_docstore(path: Path, docs: Iterable[Document]) -> None:
    con = sqlite3.connect(path)
    try:
        con.execute("CREATE TABLE docs (row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT, text TEXT)")
        con.executemany(
            "INSERT INTO docs (row, id, title, text) VALUES (?, ?, ?, ?)",
            ((row, d.id, d.title, d.text) for row, d in enumerate(docs)),
        )
        con.commit()
    finally:
        con.close()


class DocStore:
    """Read-only, thread-safe lookups by FAISS row."""

    def __init__(self, path: Path) -> None:
        # Percent-encoded, so a `#`, `?` or `%` in the path cannot end it early and drop `mode=ro` (SQLite
        # would then open, or create, another file read-write).
        uri = f"{Path(path).absolute().as_uri()}?mode=ro"
        self._con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        self._lock = threading.Lock()

    def count(self) -> int:
        with self._lock:
            return int(self._con.execute("SELECT COUNT(*) FROM docs").fetchone()[0])

    def get(self, rows: Sequence[int]) -> list[Document]:
        if not rows:
            return []
        marks = ",".join("?" * len(rows))
        with self._lock:
            found = {
                r: Document(id=i, title=t or "", text=x or "")
                for r, i, t, x in self._con.execute(
                    f"SELECT row, id, title, text FROM docs WHERE row IN ({marks})", [int(r) for r in rows]
                )
            }
        return [found[int(r)] for r in rows]

    def ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._con.execute("SELECT id FROM docs ORDER BY row")]

    def close(self) -> None:
        self._con.close()
