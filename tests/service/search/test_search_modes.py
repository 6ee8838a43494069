"""POST /search modes, filters and request options end to end: bundles with metadata, uvicorn, ONNX student.

The tiny models (tests/fixtures/tiny_service.py) serve what does not depend on relevance (filters, lexical, options,
manifests, updates, reloads); the real ones only where an answer is judged (hybrid and dense rankings, min_score)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from indexer.versions.update import UpdateRequest, update
from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.version import Bundle
from models.search import Mode, SearchOptions, parse_filter, search
from models.search.query import matching_rows
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import DOCS
from tests.fixtures.metadata import META
from tests.fixtures.server import LiveServer, serve_app


def _as_old(bundle: Path, out: Path) -> Path:
    """A copy of `bundle` as the code before lexical search wrote it: no lexical/ or payload/, no new manifest
    fields, no metadata column."""
    shutil.copytree(bundle, out)
    shutil.rmtree(out / "lexical")
    shutil.rmtree(out / "payload")
    manifest = json.loads((out / BUNDLE_MANIFEST).read_text())
    for key in ("lexical", "fusion", "metadata_fields", "payload"):
        manifest.pop(key, None)
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith(("lexical/", "payload/"))}
    con = sqlite3.connect(out / "docs.sqlite")
    with con:
        con.execute("ALTER TABLE docs DROP COLUMN metadata")
    con.close()
    from models.hashing import sha256_file

    manifest["files"]["docs.sqlite"] = sha256_file(out / "docs.sqlite")
    (out / BUNDLE_MANIFEST).write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def mini_old_bundle(mini_meta_bundle: Path, bundles_dir: Path) -> Path:
    """The tiny models' metadata bundle, as old code wrote it: for what a lexical stage does, not for relevance."""
    return _as_old(mini_meta_bundle, bundles_dir / "mini-old")


def _search(server: LiveServer, **body: object) -> list[dict]:
    response = server.client.post("/search", json=body)
    assert response.status_code == 200, response.text
    return list(response.json()["results"])


def test_manifest_lists_the_lexical_index_and_metadata_fields(mini_meta_bundle: Path) -> None:
    manifest = json.loads((mini_meta_bundle / BUNDLE_MANIFEST).read_text())
    assert manifest["lexical"]["engine"] == "postings" and manifest["lexical"]["stemmer"] == "english"
    assert manifest["fusion"]["method"] in ("rrf", "convex")
    assert set(manifest["metadata_fields"]) == {"year", "topic", "published", "open", "doi", "source"}
    assert any(name.startswith("lexical/") for name in manifest["files"])


def test_lexical_mode_finds_a_rare_word(mini_meta_server: LiveServer) -> None:
    response = mini_meta_server.client.post("/search", json={"query": "Odoacer", "mode": "lexical", "top_k": 3})
    assert response.status_code == 200
    body = response.json()
    assert [h["id"] for h in body["results"]] == ["rome"]  # only one document has the word
    assert set(body["timing_ms"]) == {"queue", "encode", "search", "lexical", "filter"}


def test_hybrid_modes(meta_server: LiveServer) -> None:
    dense = _search(meta_server, query="volcanic eruption lava", top_k=5)
    for fusion in ("rrf", "convex"):
        hybrid = _search(meta_server, query="volcanic eruption lava", top_k=5, mode="hybrid", fusion=fusion)
        assert hybrid[0]["id"] == "volcano"
        scores = [h["score"] for h in hybrid]
        assert scores == sorted(scores, reverse=True)
    # alpha 1: all the weight on the dense side, whose ranking leads (lexical-only hits score 0 and trail).
    only_dense = _search(meta_server, query="volcanic eruption lava", top_k=3, mode="hybrid", fusion="convex",
                         alpha=1.0)
    assert [h["id"] for h in only_dense] == [h["id"] for h in dense[:3]]


FILTERS = [
    ({"field": "topic", "eq": "earth"}, lambda m: m["topic"] == "earth"),
    ({"field": "topic", "in": ["code", "games"]}, lambda m: m["topic"] in ("code", "games")),
    ({"field": "year", "gte": 2005, "lt": 2010}, lambda m: 2005 <= m["year"] < 2010),
    ({"field": "published", "gte": "2020-06-01"}, lambda m: m["published"] >= "2020-06-01"),
    ({"field": "doi", "exists": True}, lambda m: "doi" in m),
    ({"field": "open", "eq": True}, lambda m: m["open"] is True),
    ({"or": [{"field": "topic", "eq": "food"}, {"not": {"field": "year", "lt": 2018}}]},
     lambda m: m["topic"] == "food" or m["year"] >= 2018),
    ({"and": [{"field": "open", "eq": False}, {"field": "doi", "exists": False}]},
     lambda m: not m["open"] and "doi" not in m),
]


@pytest.mark.parametrize(("flt", "check"), FILTERS)
@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_filters_restrict_before_ranking(mini_meta_server: LiveServer, flt: dict, check, mode: str) -> None:
    matching = {doc_id for doc_id, meta in META.items() if check(meta)}
    hits = _search(mini_meta_server, query="what is this about", top_k=20, mode=mode, filter=flt,
                   fields=["id", "metadata"])
    assert {h["id"] for h in hits} <= matching
    assert all(check(h["metadata"]) for h in hits)
    if mode != "lexical":  # dense and hybrid fill top_k with every match (lexical only with words in common)
        assert {h["id"] for h in hits} == matching


def test_a_bundle_without_a_payload_index_filters_as_before(mini_meta_bundle: Path, bundles_dir: Path) -> None:
    """A manifest from before payload fields: the same rows, from the docstore's SQL."""
    out = bundles_dir / "mini-meta-no-payload"
    shutil.copytree(mini_meta_bundle, out)
    manifest = json.loads((out / BUNDLE_MANIFEST).read_text())
    del manifest["payload"]
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith("payload/")}
    (out / BUNDLE_MANIFEST).write_text(json.dumps(manifest))
    shutil.rmtree(out / "payload")
    old, new = Bundle(out), Bundle(mini_meta_bundle)
    try:
        assert old.segments[0].payload is None and new.segments[0].payload is not None
        for flt, _ in FILTERS:
            parsed = parse_filter(flt, old.filter_fields)
            assert matching_rows(old, parsed).tolist() == matching_rows(new, parsed).tolist()
            found = search(old, None, ["what is this about"], SearchOptions(top_k=20, mode=Mode.LEXICAL,
                                                                              filter=parsed), 4)
            assert {h.doc.id for h in found.hits[0]} <= {d for d, meta in META.items() if parsed.matches(meta)}
    finally:
        old.close()
        new.close()


def test_get_index_lists_the_modes_and_the_filter_fields(mini_meta_server: LiveServer) -> None:
    body = mini_meta_server.client.get("/index").json()
    assert body["modes"] == ["dense", "lexical", "hybrid"] and body["count"] == len(DOCS)
    assert {f["name"]: f["type"] for f in body["fields"]} == {
        "year": "integer", "topic": "keyword", "published": "keyword", "open": "boolean", "doi": "keyword",
        "source": "keyword"}
    assert not any(f["declared"] for f in body["fields"])


@pytest.mark.parametrize(("flt", "field"), [
    ({"field": "colour", "eq": "red"}, "filter.field"),
    ({"field": "year", "gt": "soon"}, "filter.gt"),
    ({"field": "year", "like": 3}, "filter.like"),
    ({"and": [{"field": "year", "eq": 2001}, {"field": "nope", "exists": True}]}, "filter.and.1.field"),
    ({"and": []}, "filter.and"),
    ({"not": 3}, "filter.not"),
    ({"field": "topic", "in": []}, "filter.in"),
])
def test_bad_filters_are_422s_naming_the_field(mini_meta_server: LiveServer, flt: dict, field: str) -> None:
    response = mini_meta_server.client.post("/search", json={"query": "x", "filter": flt})
    assert response.status_code == 422, response.text
    assert field in [d["field"] for d in response.json()["details"]]


def test_offset_pages_through_the_ranking(mini_meta_server: LiveServer) -> None:
    for mode in ("dense", "hybrid"):
        full = [h["id"] for h in _search(mini_meta_server, query="energy from the sun", top_k=9, mode=mode)]
        pages = [[h["id"] for h in _search(mini_meta_server, query="energy from the sun", top_k=3, offset=o, mode=mode)]
                 for o in (0, 3, 6)]
        assert [doc for page in pages for doc in page] == full


def test_min_score_and_fields(meta_server: LiveServer) -> None:
    hits = _search(meta_server, query="bread dough yeast", top_k=20, min_score=0.3)
    assert hits and all(h["score"] >= 0.3 for h in hits) and len(hits) < len(DOCS)
    slim = _search(meta_server, query="bread dough yeast", top_k=2, fields=["id", "score"])
    assert [set(h) for h in slim] == [{"id", "score"}] * 2
    rich = _search(meta_server, query="bread dough yeast", top_k=1, fields=["id", "metadata"])
    assert rich == [{"id": "bake", "metadata": {**META["bake"], "source": "fixture"}}]


@pytest.mark.parametrize(("body", "field"), [
    ({"mode": "sparse"}, "mode"), ({"alpha": 1.5}, "alpha"), ({"offset": -1}, "offset"),
    ({"fields": ["id", "body"]}, "fields.1"), ({"fusion": "max"}, "fusion"), ({"min_score": "high"}, "min_score"),
])
def test_bad_options_are_422s(mini_meta_server: LiveServer, body: dict, field: str) -> None:
    response = mini_meta_server.client.post("/search", json={"query": "x", **body})
    assert response.status_code == 422, response.text
    assert field in [d["field"] for d in response.json()["details"]]


def test_bundle_without_a_lexical_index_still_serves_dense(mini_old_bundle: Path, mini_student: Path,
                                                           mini_meta_server: LiveServer) -> None:
    """Its dense answers are those of the same bundle with a lexical index (the same vectors, the same student)."""
    with serve_app(create_app(ServiceSettings(index=mini_old_bundle, student=mini_student, port=0))) as server:
        ranked = _search(server, query="volcanic eruption", top_k=5, fields=["id", "score"])
        assert len(ranked) == 5
        assert ranked == _search(mini_meta_server, query="volcanic eruption", top_k=5, fields=["id", "score"])
        for mode in ("lexical", "hybrid"):
            response = server.client.post("/search", json={"query": "volcano", "mode": mode})
            assert response.status_code == 422
            assert response.json()["details"][0]["field"] == "mode"
            assert "no lexical index" in response.json()["message"] or "has none" in response.json()["message"]
        response = server.client.post("/search", json={"query": "x", "filter": {"field": "year", "eq": 1}})
        assert response.status_code == 422 and response.json()["details"][0]["field"] == "filter.field"


def test_update_keeps_the_lexical_index_in_step(mini_meta_bundle: Path, mini_teacher: Path, tmp_path: Path) -> None:
    changes = tmp_path / "changes.jsonl"
    changes.write_text(
        json.dumps({"_id": "kite", "title": "Kitesurfing", "text": "Zanzibar lagoons suit kitesurfing beginners.",
                    "metadata": {"year": 2030, "topic": "sport"}}) + "\n"
        + json.dumps({"_id": "rome", "delete": True}) + "\n")
    out = tmp_path / "updated"
    manifest = update(UpdateRequest(changes=changes, base=mini_meta_bundle, out=out, teacher=mini_teacher))
    assert manifest.lexical is not None and "year" in manifest.metadata_fields
    bundle = Bundle(out)
    try:
        found = search(bundle, None, ["Zanzibar kitesurfing", "Odoacer"], SearchOptions(top_k=3,
                         mode=Mode.LEXICAL), 4)
        assert [h.doc.id for h in found.hits[0]] == ["kite"]
        assert found.hits[1] == []  # the deleted document's words are gone with it
        assert found.hits[0][0].doc.meta() == {"year": 2030, "topic": "sport"}
    finally:
        bundle.close()


@pytest.mark.parametrize(("flt", "field"), [
    ({"field": "year", "eq": 2**70}, "filter.eq"), ({"field": "year", "gt": 2**70}, "filter.gt"),
    ({"field": "topic", "in": ["a", [1]]}, "filter.in"), ({"field": "year", "gte": 1, "eq": 2}, "filter"),
])
def test_values_a_filter_cannot_hold_are_422s(mini_meta_server: LiveServer, flt: dict, field: str) -> None:
    response = mini_meta_server.client.post("/search", json={"query": "x", "filter": flt})
    assert response.status_code == 422, response.text
    assert field in [d["field"] for d in response.json()["details"]]


def test_hot_reload_brings_the_lexical_stage_with_the_bundle(mini_old_bundle: Path, mini_meta_bundle: Path,
                                                            mini_student: Path, tmp_path: Path) -> None:
    """Serving an old bundle, lexical is a 422; after a hot reload to a bundle with BM25 it answers, and a
    rollback takes it away again: the lexical stage belongs to the bundle in service."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(mini_old_bundle, root / "old")
    shutil.copytree(mini_meta_bundle, root / "new")
    auth = {"Authorization": "Bearer reload-token"}
    settings = ServiceSettings(index=root / "old", student=mini_student, port=0, admin_token="reload-token",
                               watch_interval_s=0)
    with serve_app(create_app(settings)) as server:
        body = {"query": "Odoacer", "mode": "lexical", "top_k": 3}
        assert server.client.post("/search", json=body).status_code == 422
        response = server.client.post("/admin/reload", json={"path": str(root / "new")}, headers=auth)
        assert response.status_code == 200, response.text
        answer = server.client.post("/search", json=body)
        assert answer.status_code == 200 and [h["id"] for h in answer.json()["results"]] == ["rome"]
        assert answer.json()["index"]["version"] == "new"
        assert server.client.post("/admin/rollback", headers=auth).status_code == 200
        assert server.client.post("/search", json=body).status_code == 422
