"""The bundle's document store: FAISS row id → (id, title, text, metadata), in SQLite.

SQLite gives random access without loading the corpus into memory, and is in the stdlib. The
metadata column (a JSON object per row, or NULL) is new: older bundles lack it, and the reader
serves them without metadata. Filters are SQL over it (models.search.filters), so they never load rows.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from models.corpus import Document

DOCSTORE_FILE = "docs.sqlite"
_LOOKUP_CHUNK = 10_000  # ids per IN (...) query, under SQLite's bound-parameter cap


_SCHEMA = ("CREATE TABLE docs (row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT, text TEXT, "
           "metadata TEXT)")
_INSERT = "INSERT INTO docs (row, id, title, text, metadata) VALUES (?, ?, ?, ?, ?)"


class DuplicateId(Exception):
    """A document id already in the store; `row` is the row of the earlier one."""

    def __init__(self, doc_id: str, row: int, position: int) -> None:
        super().__init__(f"duplicate id {doc_id!r}")
        self.doc_id, self.row, self.position = doc_id, row, position


class DocstoreWriter:
    """Appends documents in row order; the id column's unique index catches duplicates on disk.

    That is how a streaming build checks ids without holding them: SQLite's B-tree and a few MB
    of page cache instead of a dict of every id.
    """

    def __init__(self, path: Path) -> None:
        """Raises OSError when the store cannot be created (a full disk or a file size limit fails the schema's
        first page, before any document is added)."""
        self.path = Path(path)
        try:
            self._con = sqlite3.connect(path)
            self._con.execute(_SCHEMA)
        except sqlite3.OperationalError as exc:
            raise _cannot_write(exc, self.path) from exc
        self.count = 0

    def add(self, docs: Sequence[Document]) -> None:
        """Append `docs` as the next rows; raise DuplicateId (nothing of this call kept) on a repeated id, and
        OSError when SQLite cannot write (a full disk, a quota or file size limit: SQLite only says "disk I/O")."""
        rows = [(self.count + i, d.id, d.title, d.text, d.metadata) for i, d in enumerate(docs)]
        try:
            with self._con:
                self._con.executemany(_INSERT, rows)
        except sqlite3.IntegrityError:
            self._raise_duplicate(docs)
            raise
        except sqlite3.OperationalError as exc:
            raise _cannot_write(exc, self.path) from exc
        self.count += len(docs)

    def _raise_duplicate(self, docs: Sequence[Document]) -> None:
        first: dict[str, int] = {}
        for i, doc in enumerate(docs):
            found = self._con.execute("SELECT row FROM docs WHERE id = ?", (doc.id,)).fetchone()
            if found is not None:
                raise DuplicateId(doc.id, int(found[0]), i)
            if doc.id in first:
                raise DuplicateId(doc.id, self.count + first[doc.id], i)
            first[doc.id] = i

    def rows_of(self, ids: Sequence[str]) -> dict[str, int]:
        """Row of each id that is in the store (for imports keyed by id)."""
        return _rows_of(self._con, ids)

    def ids_at(self, rows: Sequence[int]) -> list[str]:
        marks = ",".join("?" * len(rows))
        return [r[0] for r in self._con.execute(f"SELECT id FROM docs WHERE row IN ({marks}) ORDER BY row",
                                                [int(r) for r in rows])]

    def close(self) -> None:
        self._con.close()


def _cannot_write(exc: sqlite3.OperationalError, path: Path) -> OSError:
    """SQLite says only "disk I/O error" or "unable to open database file"; the CLI names the file from this."""
    return OSError(errno.EIO, f"cannot write the docstore ({exc}: a full disk, or a quota or file size limit?)",
                   str(path))


def _rows_of(con: sqlite3.Connection, ids: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for start in range(0, len(ids), _LOOKUP_CHUNK):
        part = list(ids[start : start + _LOOKUP_CHUNK])
        marks = ",".join("?" * len(part))
        out.update(con.execute(f"SELECT id, row FROM docs WHERE id IN ({marks})", part).fetchall())
    return out


def write_docstore(path: Path, docs: Iterable[Document], chunk: int = 10_000) -> int:
    """Write documents in chunks (never all in memory); returns the count. Raises DuplicateId."""
    writer = DocstoreWriter(path)
    try:
        batch: list[Document] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) >= chunk:
                writer.add(batch)
                batch = []
        if batch:
            writer.add(batch)
        return writer.count
    finally:
        writer.close()


class DocStore:
    """Read-only, thread-safe lookups by FAISS row."""

    def __init__(self, path: Path) -> None:
        # Percent-encoded, so a `#`, `?` or `%` in the path cannot end it early and drop `mode=ro` (SQLite
        # would then open, or create, another file read-write).
        self._uri = f"{Path(path).absolute().as_uri()}?mode=ro"
        self._con = sqlite3.connect(self._uri, uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        # a filter's scan of the metadata (rows_where) runs on a connection of its own, so that it never holds the
        # lock every document fetch takes. Opened now, not at the first scan: a segment a reloaded version shares
        # keeps the path of the version that first loaded it, which may be pruned by then (the open file stays
        # readable, a new open of its path fails)
        self._scan_con = sqlite3.connect(self._uri, uri=True, check_same_thread=False)
        self._scan_lock = threading.Lock()
        self.scans = 0  # scans run so far (tests count them)
        columns = {r[1] for r in self._con.execute("PRAGMA table_info(docs)")}
        self.has_metadata = "metadata" in columns
        self._cols = "id, title, text, " + ("metadata" if self.has_metadata else "NULL")

    def count(self) -> int:
        with self._lock:
            return int(self._con.execute("SELECT COUNT(*) FROM docs").fetchone()[0])

    def get(self, rows: Sequence[int]) -> list[Document]:
        """The documents at these row numbers, in the order asked."""
        if not rows:
            return []
        marks = ",".join("?" * len(rows))
        with self._lock:
            found = {
                r: Document(id=i, title=t or "", text=x or "", metadata=m)
                for r, i, t, x, m in self._con.execute(
                    f"SELECT row, {self._cols} FROM docs WHERE row IN ({marks})", [int(r) for r in rows]
                )
            }
        return [found[int(r)] for r in rows]

    def range(self, start: int, end: int) -> list[Document]:
        """Documents of rows [start, end), in row order: how large bundles are read in chunks."""
        with self._lock:
            return [Document(id=i, title=t or "", text=x or "", metadata=m) for i, t, x, m in self._con.execute(
                f"SELECT {self._cols} FROM docs WHERE row >= ? AND row < ? ORDER BY row", (start, end))]

    def metadata_range(self, start: int, end: int) -> list[str | None]:
        """The metadata JSON of rows [start, end), in row order (None: none), without the texts."""
        if not self.has_metadata:
            return [None] * max(0, min(end, self.count()) - start)
        with self._lock:
            return [m for (m,) in self._con.execute(
                "SELECT metadata FROM docs WHERE row >= ? AND row < ? ORDER BY row", (start, end))]

    def rows_where(self, sql: str, params: Sequence[object]) -> np.ndarray:
        """Rows (ascending int64) whose metadata satisfies a compiled filter (models.search.filters)."""
        if not self.has_metadata:
            return np.zeros(0, dtype=np.int64)
        with self._scan_lock:
            self.scans += 1
            found = self._scan_con.execute(f"SELECT row FROM docs WHERE {sql} ORDER BY row", list(params)).fetchall()
        return np.fromiter((r[0] for r in found), dtype=np.int64, count=len(found))

    def metadata_fields(self) -> list[str]:
        """Every metadata key present in the store, sorted (the fields a filter may name)."""
        if not self.has_metadata:
            return []
        with self._lock:
            return [r[0] for r in self._con.execute(
                "SELECT DISTINCT j.key FROM docs, json_each(docs.metadata) AS j WHERE docs.metadata IS NOT NULL "
                "ORDER BY j.key")]

    def rows_of(self, ids: Sequence[str]) -> dict[str, int]:
        """Row of each id that is in the store (an update finds what it replaces or deletes)."""
        with self._lock:
            return _rows_of(self._con, ids)

    def ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._con.execute("SELECT id FROM docs ORDER BY row")]

    def close(self) -> None:
        self._con.close()
        with self._scan_lock:
            self._scan_con.close()
