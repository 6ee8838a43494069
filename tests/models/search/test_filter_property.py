"""Property: filtered search equals a brute-force filtered search, over random corpora, filters and k.

Each example writes a real bundle (FAISS, SQLite docstore with metadata, bm25s, the payload index) and searches it
through models.search, the service's search path, with each of the planner's plans forced in turn (the exact pass
over the allowed rows, and FAISS with an ID selector); the reference is numpy over the same vectors and the
filter's Python semantics (Filter.matches, typed for the bundle's payload fields), independent of the columns and
of the SQL the docstore runs. Keys with values of one type are indexed (`n`, `tags` declared as a keyword-list,
`when` as a datetime, the others when the draw gives them one type); keys of mixed types fall back to the SQL.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.writer import write_bundle
from models.bundle import Bundle
from models.corpus import Document
from models.fields import declared_fields
from models.index_spec import Quantization
from models.manifest import EmbeddingSource
from models.registry import load_card, resolve
from models.search import Mode, SearchOptions, parse_filter, search
from models.search.planner import Planner
from models.search.query import allowed_rows

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


@pytest.mark.usefixtures("tandem_home")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=documents, flt=filters, k=st.integers(1, 50), seed=st.integers(0, 2**16),
       query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
def test_filtered_search_equals_brute_force(corpus, flt, k, seed, query) -> None:
    rng = np.random.default_rng(seed)
    docs = [Document(id=f"d{i}", title="", text=" ".join(words),
                     metadata=json.dumps(meta, sort_keys=True) if meta else None)
            for i, (words, meta) in enumerate(corpus)]
    vectors = rng.standard_normal((len(docs), 768)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = rng.standard_normal(768).astype(np.float32)
    q /= np.linalg.norm(q)
    parsed = parse_filter(flt, frozenset(FIELDS))
    as_json = [i for i, (_, meta) in enumerate(corpus) if parsed.matches(meta)]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = _write(Path(tmp) / "b", docs, vectors)
        try:
            assert bundle.payload is not None
            types = bundle.payload.info.types()
            assert types["tags"] == "keyword-list" and types["when"] == "datetime"
            assert types.get("n") in (None, "integer")
            allowed = [i for i, (_, meta) in enumerate(corpus) if parsed.matches(meta, types)]
            assert allowed_rows(bundle, parsed).rows.tolist() == allowed  # payload index ≡ Python, typed
            assert bundle.docs.rows_where(parsed.sql, parsed.params).tolist() == as_json  # SQL ≡ Python, untyped
            text = " ".join(query)
            bm25 = bundle.lexical.scores(text) if bundle.lexical is not None else None
            assert bm25 is not None
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
        finally:
            bundle.close()
