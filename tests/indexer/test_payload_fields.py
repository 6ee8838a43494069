"""Payload fields through the indexer: `--field` declarations checked line by line, the schema an update keeps,
and the payload files a manifest lists and `tandem index verify` checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.verify import verify
from indexer.versions.update import UpdateRequest, update
from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.payload.fields import FieldType
from models.bundle.version import Bundle, read_bundle_manifest
from models.errors import ContractMismatch, InputError
from models.search import parse_filter
from models.search.query import documents, matching_rows
from tests.fixtures.corpus import DOCS


def _corpus(path: Path, metas: list[dict[str, object]]) -> Path:
    with path.open("w") as fh:
        for (doc_id, title, text), meta in zip(DOCS, metas, strict=False):
            fh.write(json.dumps({"_id": doc_id, "title": title, "text": text, **meta}) + "\n")
    return path


def test_a_declared_field_refuses_a_value_of_another_type_naming_the_line(tandem_home: Path, tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", [{"year": 2001}, {"year": None}, {"year": "2003"}])
    with pytest.raises(InputError, match=r"corpus\.jsonl:3: field 'year' is declared integer: expected a whole "
                                         r"number.*got '2003'"):
        build(BuildRequest(corpus=corpus, out=tmp_path / "b", metadata_extra=True, fields=("year:integer",)))
    assert not (tmp_path / "b").exists()  # nothing published
    with pytest.raises(InputError, match=r"unknown type 'number'"):
        build(BuildRequest(corpus=corpus, out=tmp_path / "b", fields=("year:number",)))


def test_an_update_keeps_the_schema_and_rebuilds_the_columns(meta_bundle: Path, tmp_path: Path) -> None:
    base = read_bundle_manifest(meta_bundle)
    assert base.payload is not None
    assert base.payload.types() == {"year": FieldType.INTEGER, "topic": FieldType.KEYWORD,
                                    "published": FieldType.KEYWORD, "open": FieldType.BOOLEAN,
                                    "doi": FieldType.KEYWORD, "source": FieldType.KEYWORD}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"_id": "kite", "text": "Kites.", "metadata": {"year": 2030}}) + "\n"
                   + json.dumps({"_id": "sled", "text": "Sleds.", "metadata": {"year": "2031"}}) + "\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:2: field 'year' is inferred \(at the bundle's build\) as "
                                         r"integer"):
        update(UpdateRequest(changes=bad, base=meta_bundle, out=tmp_path / "never"))
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"_id": "kite", "text": "Kites fly.", "metadata": {"year": 2030, "wind": ["n", "e"]}})
                    + "\n" + json.dumps({"_id": "rome", "delete": True}) + "\n")
    manifest = update(UpdateRequest(changes=good, base=meta_bundle, out=tmp_path / "v2"))
    assert manifest.payload is not None
    assert manifest.payload.types() == {**base.payload.types(), "wind": FieldType.KEYWORD_LIST}  # a new key: typed
    bundle = Bundle(tmp_path / "v2")
    try:
        for flt, expected in [({"field": "year", "gte": 2030}, ["kite"]), ({"field": "wind", "eq": "e"}, ["kite"]),
                              ({"field": "topic", "exists": True}, sorted(d for d, _, _ in DOCS if d != "rome"))]:
            rows = matching_rows(bundle, parse_filter(flt, bundle.filter_fields))
            assert sorted(d.id for d in documents(bundle, rows)) == expected
    finally:
        bundle.close()


def test_the_manifest_lists_the_payload_files_and_verify_checks_them(meta_bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(meta_bundle, copy)
    manifest = json.loads((copy / BUNDLE_MANIFEST).read_text())
    payload_files = sorted(name for name in manifest["files"] if name.startswith("payload/"))
    assert payload_files and all((copy / name).is_file() for name in payload_files)
    assert "6 payload fields" in verify(copy)[0]
    rows_file = next(name for name in payload_files if name.endswith(".rows.npy"))
    rows = np.load(copy / rows_file)
    np.save(copy / rows_file, rows[::-1])
    with pytest.raises(ContractMismatch, match="checksum mismatch"):
        verify(copy)
    unlisted = dict(manifest, files={k: v for k, v in manifest["files"].items() if k != rows_file})
    (copy / BUNDLE_MANIFEST).write_text(json.dumps(unlisted))
    with pytest.raises(ContractMismatch, match="does not list payload/"):
        Bundle(copy)
