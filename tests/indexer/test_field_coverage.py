"""A declared field must match what the corpus holds: a key the lines carry at top level, which is metadata only
with --metadata-extra, is refused at ingest naming the key, the line and the flag (a field declared that way used
to index 0 documents, silently). No model: the docstore is written and the check runs before any encoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexer.intake.ingest import ingest_corpus
from models.bundle.payload.fields import declared_fields
from models.bundle.storage.docstore import DocstoreWriter
from models.errors import InputError


def _corpus(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps({"_id": str(i), "text": f"text {i}", **line}) + "\n"
                            for i, line in enumerate(lines)))
    return path


def _ingest(corpus: Path, tmp_path: Path, extra: bool, *fields: str) -> int:
    writer = DocstoreWriter(tmp_path / f"docs-{extra}.sqlite")
    try:
        return ingest_corpus(corpus, writer, extra_metadata=extra, fields=declared_fields(fields)).count
    finally:
        writer.close()


def test_a_declared_field_only_at_top_level_names_metadata_extra(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", [{"metadata": {"tag": "a"}}, {"year": 2001}, {"year": 2002}])
    with pytest.raises(InputError, match=r"corpus\.jsonl:2: --field year is declared but no document's metadata "
                                         r"holds 'year'.*top-level key.*--metadata-extra"):
        _ingest(corpus, tmp_path, False, "year:integer", "tag:keyword")
    assert _ingest(corpus, tmp_path, True, "year:integer", "tag:keyword") == 3  # with the flag, it is metadata


def test_a_declared_field_no_line_carries_is_only_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", [{"metadata": {"tag": "a"}}, {}])
    assert _ingest(corpus, tmp_path, False, "later:integer") == 2  # a field declared for documents to come
    assert "--field later: no document" in caplog.text
