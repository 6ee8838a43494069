"""models.bundle.storage.docstore: documents written in row order are read back by row, range and id; a repeated id is
refused naming both places, keeping nothing of its batch; a store without metadata reads as one."""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
from pathlib import Path

import pytest

from models.bundle.storage.docstore import DocStore, DocstoreWriter, DuplicateId, write_docstore
from models.corpus import Document

DOCS = [Document(id=f"d{i}", title=f"t{i}", text=f"text {i}", metadata=None if i == 1 else f'{{"n": {i}}}')
        for i in range(5)]


def test_written_documents_read_back_by_row_range_and_id(tmp_path: Path) -> None:
    assert write_docstore(tmp_path / "docs.sqlite", DOCS, chunk=2) == 5
    store = DocStore(tmp_path / "docs.sqlite")
    try:
        assert store.count() == 5 and store.ids() == [d.id for d in DOCS]
        assert store.get([3, 0]) == [DOCS[3], DOCS[0]] and store.get([]) == []
        assert store.range(1, 3) == DOCS[1:3]
        assert store.metadata_range(0, 2) == ['{"n": 0}', None]
        assert store.rows_of(["d4", "nope", "d2"]) == {"d4": 4, "d2": 2}
        assert store.metadata_fields() == ["n"]
        assert store.rows_where("json_extract(metadata, '$.n') >= ?", [3]).tolist() == [3, 4]
    finally:
        store.close()


def test_a_repeated_id_is_refused_and_its_batch_kept_out(tmp_path: Path) -> None:
    writer = DocstoreWriter(tmp_path / "docs.sqlite")
    try:
        writer.add(DOCS[:2])
        with pytest.raises(DuplicateId, match="duplicate id 'd1'") as earlier:
            writer.add([DOCS[2], DOCS[1]])
        assert (earlier.value.row, earlier.value.position) == (1, 1)
        with pytest.raises(DuplicateId) as within:
            writer.add([DOCS[3], DOCS[4], DOCS[3]])
        assert (within.value.doc_id, within.value.row, within.value.position) == ("d3", 2, 2)
        assert writer.count == 2 and writer.ids_at([1, 0]) == ["d0", "d1"]
        assert writer.rows_of(["d2"]) == {}
    finally:
        writer.close()


def test_a_store_without_a_metadata_column_serves_documents_without_it(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "old.sqlite")
    con.execute("CREATE TABLE docs (row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT, text TEXT)")
    con.execute("INSERT INTO docs VALUES (0, 'a', NULL, 'body')")
    con.commit()
    con.close()
    store = DocStore(tmp_path / "old.sqlite")
    try:
        assert not store.has_metadata and store.get([0]) == [Document(id="a", title="", text="body")]
        assert store.metadata_fields() == [] and store.metadata_range(0, 5) == [None]
        assert store.rows_where("1", []).tolist() == []
    finally:
        store.close()


def test_a_store_that_cannot_be_created_raises_an_os_error_naming_it(tmp_path: Path) -> None:
    """Under a file size limit smaller than SQLite's first page, creating the schema fails: the CLI turns an
    OSError into a one-line error with the path, where a bare sqlite3 error was a traceback."""
    path = tmp_path / "docs.sqlite"
    pid = os.fork()
    if pid == 0:  # the child: the limit is per process
        code = 1
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
            DocstoreWriter(path)
        except OSError as exc:
            code = 0 if exc.filename == str(path) and "cannot write the docstore" in str(exc) else 4
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, status
    (tmp_path / "a file").write_text("")  # a parent that is not a folder: the connect itself fails
    under_a_file = tmp_path / "a file" / "docs.sqlite"
    with pytest.raises(OSError, match="cannot write the docstore") as raised:
        DocstoreWriter(under_a_file)
    assert raised.value.filename == str(under_a_file)
