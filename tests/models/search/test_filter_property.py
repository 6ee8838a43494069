"""Property: filtered search equals a brute-force filtered search, over random corpora, filters and k.

Each example writes a real bundle (FAISS, SQLite docstore with metadata, BM25 postings, the payload index) and
searches it through models.search, the service's search path, with each of the planner's plans forced in turn
(the exact pass over the allowed rows, and FAISS with an ID selector); the reference is numpy over the same
vectors and the filter's Python semantics (Filter.matches, typed for the bundle's payload fields), independent of
the columns and of the SQL the docstore runs. Keys with values of one type are indexed (`n`, `tags` declared as a
keyword-list, `when` as a datetime, the others when the draw gives them one type); keys of mixed types fall back
to the SQL. A second property does the same over versions of three segments with deleted and replaced rows,
against one bundle of the same live documents.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.writer import write_bundle
from models.bundle.manifest import EmbeddingSource
from models.bundle.payload.fields import FieldType, declared_fields
from models.bundle.vectors.index_spec import Quantization
from models.bundle.version import Bundle
from models.corpus import Document
from models.encoders.registry import load_card, resolve
from models.search import Mode, SearchOptions, parse_filter, search
from models.search import documents as documents_at
from models.search.planner import Planner
from models.search.query import matching_rows

FIELDS = ("year", "tag", "score", "flag", "day", "n", "tags", "when")
DECLARED = declared_fields(["tags:keyword-list", "when:datetime"])
WORDS = ["tide", "moon", "bread", "yeast", "lava", "chess", "code", "bee", "sun", "salt"]
DAYS = ["2019-12-31", "2020-01-01", "2020-06-15", "2021-03-01"]
# Instants written several ways: the last four are all 2020-01-01T12:00Z, or midnight of that day.
WHENS = ["2019-12-31", "2020-01-01", "2020-01-01T00:00:00", "2020-01-01T12:00:00Z", "2020-01-01T13:00:00+01:00",
         "2020-01-01T12:00:00", "2019-12-31T23:00:00-01:00", "2020-06-15T08:30:00"]
LABELS = ["a", "b", "c"]

values = {
    "year": st.one_of(st.integers(1990, 2030), st.just("2001")),  # a string year is no number
    "tag": st.one_of(st.sampled_from(LABELS), st.just(1)),
    "score": st.floats(-5, 5, allow_nan=False, allow_infinity=False),
    "flag": st.one_of(st.booleans(), st.just(0)),  # 0 is not false
    "day": st.sampled_from(DAYS),
    "n": st.integers(-3, 3),
    "tags": st.one_of(st.lists(st.sampled_from(LABELS), max_size=3), st.sampled_from(LABELS)),
    "when": st.sampled_from(WHENS),
}
metadata = st.fixed_dictionaries({}, optional={k: v for k, v in values.items()})
documents = st.lists(st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6), metadata),
                     min_size=1, max_size=40)

leaf = st.one_of(
    st.builds(lambda f, v: {"field": f, "eq": v}, st.sampled_from(FIELDS),
              st.one_of(st.integers(1990, 2030), st.integers(-3, 3), st.sampled_from(["a", "b", "2001", *DAYS, *WHENS]),
                        st.booleans(), st.floats(-3, 3, allow_nan=False))),
    st.builds(lambda f, v: {"field": f, "in": v}, st.sampled_from(["tag", "tags", "when", "n"]),
              st.lists(st.sampled_from(["a", "b", "c", 1, 2, *WHENS]), min_size=1)),
    st.builds(lambda lo, hi: {"field": "year", "gte": lo, "lt": hi}, st.integers(1990, 2030), st.integers(1990, 2031)),
    st.builds(lambda f, lo: {"field": f, "gt": lo}, st.sampled_from(["score", "n"]), st.floats(-5, 5, allow_nan=False)),
    st.builds(lambda f, op, d: {"field": f, op: d}, st.sampled_from(["day", "when", "tags", "n"]),
              st.sampled_from(["gt", "gte", "lt", "lte"]), st.sampled_from(DAYS + WHENS)),
    st.builds(lambda f, e: {"field": f, "exists": e}, st.sampled_from(FIELDS), st.booleans()),
)
filters = st.recursive(leaf, lambda inner: st.one_of(
    st.builds(lambda xs: {"and": xs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda xs: {"or": xs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda x: {"not": x}, inner),
), max_leaves=6)


def _write(directory: Path, docs: list[Document], vectors: np.ndarray) -> Bundle:
    card = load_card(resolve("teacher"))
    directory.mkdir()
    write_bundle(directory, docs, vectors, dim=768, quantization=Quantization.FLOAT, card=card,
                 source=EmbeddingSource(kind="imported"), started=time.perf_counter(), fields=DECLARED)
    return Bundle(directory)


def _drawn(corpus: list[tuple[list[str], dict]], seed: int) -> tuple[list[Document], np.ndarray, np.ndarray]:
    """The drawn documents, a random unit vector for each, and a random unit query."""
    rng = np.random.default_rng(seed)
    docs = [Document(id=f"d{i}", title="", text=" ".join(words),
                     metadata=json.dumps(meta, sort_keys=True) if meta else None)
            for i, (words, meta) in enumerate(corpus)]
    vectors = rng.standard_normal((len(docs), 768)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = rng.standard_normal(768).astype(np.float32)
    return docs, vectors, q / np.linalg.norm(q)


ASKS = 3  # filters searched over each drawn bundle
# Each example's bundles on the tmpfs /dev/shm where there is one: writing a bundle commits SQLite (fsync) and
# its cleanup removes hundreds of files and folders, which a disk makes most of a small example's cost.
EXAMPLES_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@pytest.mark.usefixtures("tandem_home")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=documents, seed=st.integers(0, 2**16), asks=st.lists(
    st.tuples(filters, st.integers(1, 50), st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)),
    min_size=ASKS, max_size=ASKS))
def test_filtered_search_equals_brute_force(corpus, seed, asks) -> None:
    """Several filters (with their k and query) over each drawn bundle: writing the bundle is most of an example's
    cost, so a bundle answers ASKS of them rather than one."""
    docs, vectors, q = _drawn(corpus, seed)
    with tempfile.TemporaryDirectory(dir=EXAMPLES_DIR) as tmp:
        bundle = _write(Path(tmp) / "b", docs, vectors)
        try:
            assert bundle.manifest.payload is not None
            types = bundle.manifest.payload.types()
            assert types["tags"] == "keyword-list" and types["when"] == "datetime"
            assert types.get("n") in (None, "integer")
            for flt, k, query in asks:
                _filtered_search_equals_brute_force(bundle, corpus, types, vectors, q, flt, k, query)
        finally:
            bundle.close()


def _filtered_search_equals_brute_force(bundle: Bundle, corpus: list[tuple[list[str], dict]],
                                        types: dict[str, FieldType], vectors: np.ndarray, q: np.ndarray, flt: dict,
                                        k: int, query: list[str]) -> None:
    parsed = parse_filter(flt, frozenset(FIELDS))
    as_json = [i for i, (_, meta) in enumerate(corpus) if parsed.matches(meta)]
    allowed = [i for i, (_, meta) in enumerate(corpus) if parsed.matches(meta, types)]
    assert matching_rows(bundle, parsed).tolist() == allowed  # payload index ≡ Python, typed
    docs_sql = bundle.segments[0].docs.rows_where(*parsed.sql())
    assert docs_sql.tolist() == as_json  # SQL ≡ Python, untyped
    text = " ".join(query)
    assert bundle.lexical is not None
    bm25 = np.zeros(len(corpus), dtype=np.float32)
    [(hit_scores, hit_rows)] = bundle.lexical.search(text, len(corpus), [None])
    bm25[hit_rows] = hit_scores
    for plan in (Planner(exact_share=1.0), Planner(exact_share=0.0)):  # the exact pass, then FAISS's selector

        def run(mode: Mode, plan: Planner = plan) -> list[tuple[int, float]]:
            found = search(bundle, q[None, :], [text], SearchOptions(top_k=k, mode=mode, filter=parsed), 4,
                           plan)
            return [(h.row, h.score) for h in found.hits[0]]

        dense = run(Mode.DENSE)
        reference = np.sort(vectors[allowed] @ q)[::-1][:k]
        assert len(dense) == min(k, len(allowed))  # top_k fills whenever k documents match
        assert {r for r, _ in dense} <= set(allowed)
        np.testing.assert_allclose([s for _, s in dense], reference, atol=1e-4)

        lexical_ref = np.sort(bm25[allowed][bm25[allowed] > 0])[::-1][:k]
        lexical = run(Mode.LEXICAL)
        assert {r for r, _ in lexical} <= set(allowed)
        np.testing.assert_allclose([s for _, s in lexical], lexical_ref, rtol=1e-5)

        hybrid = run(Mode.HYBRID)
        assert len(hybrid) == min(k, len(allowed)) and {r for r, _ in hybrid} <= set(allowed)


# --- segmented versions -------------------------------------------------------------------------------------------
# Keys of one type each, so that the documents an update adds fit the base's inferred schema (as `tandem index
# update` requires of them).
typed_values = {"year": st.integers(1990, 2030), "tag": st.sampled_from(LABELS), "n": st.integers(-3, 3),
                "score": st.floats(-5, 5, allow_nan=False, allow_infinity=False), "flag": st.booleans(),
                "day": st.sampled_from(DAYS), "tags": st.lists(st.sampled_from(LABELS), max_size=3),
                "when": st.sampled_from(WHENS)}
typed_documents = st.lists(st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
                                     st.fixed_dictionaries({}, optional=typed_values)), min_size=3, max_size=40)


def _segmented(directory: Path, docs: list[Document], vectors: dict[str, np.ndarray],
               data: st.DataObject) -> list[str]:
    """A base of the first third of `docs` and two updates, each adding documents and deleting some, the second
    also changing the metadata of some (their vectors kept); returns the live ids in version row order."""
    from indexer.versions.changes import Changes
    from indexer.versions.segments import apply_changes, link_version
    from indexer.writer import write_version_manifest
    from models.bundle.manifest import SegmentInfo
    from models.bundle.vectors.space import Space
    from models.bundle.version import read_bundle_manifest

    def given_vectors(fresh: list[Document], reused: list[Document],
                      rows: list[tuple[SegmentInfo, int]]) -> tuple[np.ndarray, EmbeddingSource, int]:
        return np.stack([vectors[d.id] for d in fresh + reused]), EmbeddingSource(kind="imported"), 0

    cut = sorted(data.draw(st.sets(st.integers(1, len(docs) - 1), min_size=2, max_size=2)))
    base, first, second = docs[: cut[0]], docs[cut[0] : cut[1]], docs[cut[1] :]
    _write(directory / "v1", base, np.stack([vectors[d.id] for d in base]))
    live = [d.id for d in base]
    previous = directory / "v1"
    for name, added in (("v2", first), ("v3", second)):
        gone = data.draw(st.sets(st.sampled_from(live), max_size=len(live) - 1)) if len(live) > 1 else set()
        kept = [i for i in live if i not in gone]
        changed = data.draw(st.sets(st.sampled_from(kept), max_size=2)) if name == "v3" and kept else set()
        by_id = {d.id: d for d in docs}
        retagged = [Document(id=i, title="", text=by_id[i].text, metadata=json.dumps({"tag": "c", "n": 2}))
                    for i in sorted(changed)]
        manifest = read_bundle_manifest(previous)
        staging = directory / name
        staging.mkdir()
        link_version(previous, manifest, staging)
        deletes = {i: f"test:{i}" for i in sorted(gone)}
        applied = apply_changes(staging, manifest, Changes(upserts=[*added, *retagged], deletes=deletes), name=name,
                                space=Space.of(previous, manifest), vectors=given_vectors)
        write_version_manifest(staging, applied.manifest.model_copy(update={"version": name}))
        for doc in retagged:
            by_id[doc.id] = doc
        live = [i for i in kept if i not in changed] + [d.id for d in added] + [d.id for d in retagged]
        docs[:] = [by_id.get(d.id, d) for d in docs]
        previous = staging
    return live


@pytest.mark.usefixtures("tandem_home")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=typed_documents, seed=st.integers(0, 2**16), data=st.data(), asks=st.lists(
    st.tuples(filters, st.integers(1, 30), st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)),
    min_size=ASKS, max_size=ASKS))
def test_a_segmented_version_searches_as_a_fresh_build_of_its_live_documents(corpus, seed, data, asks) -> None:
    """Three segments with deleted and replaced rows, against one bundle of the same live documents, on both plans:
    the same hits, in every mode, with every filter; and the dense hits are the brute force over the allowed live
    documents. ASKS filters (with their k and query) over each pair of versions drawn, as above."""
    docs, matrix, q = _drawn(corpus, seed)
    vectors = {d.id: v for d, v in zip(docs, matrix, strict=True)}
    with tempfile.TemporaryDirectory(dir=EXAMPLES_DIR) as tmp:
        live = _segmented(Path(tmp), docs, vectors, data)
        by_id = {d.id: d for d in docs}
        whole = _write(Path(tmp) / "fresh", [by_id[i] for i in live], np.stack([vectors[i] for i in live]))
        segmented = Bundle(Path(tmp) / "v3")
        try:
            assert segmented.ids() == whole.ids() == live
            assert segmented.manifest.payload is not None
            types = segmented.manifest.payload.types()
            for flt, k, query in asks:
                parsed = parse_filter(flt, frozenset(FIELDS))
                text = " ".join(query)
                allowed = [i for i in live if parsed.matches(by_id[i].meta(), types)]
                assert [live[r] for r in matching_rows(whole, parsed)] == allowed
                got_rows = matching_rows(segmented, parsed)
                assert sorted(d.id for d in documents_at(segmented, got_rows)) == sorted(allowed)
                for plan in (Planner(exact_share=1.0), Planner(exact_share=0.0)):
                    for mode in Mode:
                        options = SearchOptions(top_k=k, mode=mode, filter=parsed)
                        a = search(segmented, q[None, :], [text], options, 4, plan).hits[0]
                        b = search(whole, q[None, :], [text], options, 4, plan).hits[0]
                        assert [h.doc.id for h in a] == [h.doc.id for h in b], (mode, plan)
                        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-6, atol=1e-6)
                        if mode is Mode.DENSE:
                            reference = np.sort(np.array([vectors[i] @ q for i in allowed]))[::-1][:k]
                            np.testing.assert_allclose([h.score for h in a], reference, atol=1e-4)
        finally:
            segmented.close()
            whole.close()


@pytest.mark.usefixtures("tandem_home")
def test_a_key_the_first_segment_left_to_the_docstore_stays_there_in_later_ones(tmp_path: Path) -> None:
    """`year` holds numbers and strings in the base, so the base filters on it through the docstore; an update whose
    documents hold numbers only must not index it (it would filter by types the base does not use)."""
    from indexer.versions.changes import Changes
    from indexer.versions.segments import apply_changes, link_version
    from indexer.writer import write_version_manifest
    from models.bundle.vectors.space import Space
    from models.bundle.version import read_bundle_manifest

    base = [Document(id=f"b{i}", title="", text="tide moon", metadata=json.dumps({"year": y}))
            for i, y in enumerate([2001, "2001", 1999])]
    added = [Document(id=f"a{i}", title="", text="bread", metadata=json.dumps({"year": y}))
             for i, y in enumerate([2001, 2020])]
    vectors = {d.id: v for d, v in zip(base + added, _drawn([([], {})] * 5, 0)[1], strict=True)}
    _write(tmp_path / "v1", base, np.stack([vectors[d.id] for d in base]))
    manifest = read_bundle_manifest(tmp_path / "v1")
    assert manifest.payload is not None and manifest.payload.unindexed == ["year"]
    (tmp_path / "v2").mkdir()
    link_version(tmp_path / "v1", manifest, tmp_path / "v2")
    applied = apply_changes(
        tmp_path / "v2", manifest, Changes(upserts=added, deletes={}), name="v2", space=Space.of(tmp_path / "v1",
                                                                                                  manifest),
        vectors=lambda fresh, reused, rows: (np.stack([vectors[d.id] for d in fresh + reused]),
                                             EmbeddingSource(kind="imported"), 0))
    write_version_manifest(tmp_path / "v2", applied.manifest.model_copy(update={"version": "v2"}))
    segmented = Bundle(tmp_path / "v2")
    try:
        assert segmented.manifest.payload is not None and "year" in segmented.manifest.payload.unindexed
        assert all(f.name != "year" for s in segmented.manifest.parts for f in (s.payload.fields if s.payload else []))
        flt = parse_filter({"field": "year", "eq": 2001}, segmented.filter_fields)
        found = search(segmented, None, ["tide bread"], SearchOptions(top_k=10, mode=Mode.LEXICAL, filter=flt), 4)
        assert sorted(h.doc.id for h in found.hits[0]) == ["a0", "b0"]  # the number, not the string
    finally:
        segmented.close()
