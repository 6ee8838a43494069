"""The planner of filtered dense search: when it scores the allowed rows exactly and how far an index search
over-fetches, and, on real binary bundles of each index type, that both plans return only allowed rows and
fill the page; the exact plan ranks the allowed rows as a flat binary index does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import faiss
import numpy as np
import pytest

from indexer.writer import write_bundle
from models.bundle.manifest import EmbeddingSource
from models.bundle.storage.rows import Allowed
from models.bundle.vectors.index_spec import IndexType, Quantization, resolve_spec
from models.bundle.vectors.quantize import int8_decode
from models.bundle.version import Bundle
from models.corpus import Document
from models.encoders.registry import load_card, resolve
from models.search import SearchOptions, parse_filter, search
from models.search.planner import EXACT_ROWS, EXACT_SHARE, IVF_EXACT_ROWS, MAX_EF_SEARCH, Planner

N = 3000


def _allowed(share: float, n: int = 100_000) -> Allowed:
    mask = np.zeros(n, dtype=bool)
    mask[: int(share * n)] = True
    return Allowed(mask)


def test_the_plan_follows_the_share_of_rows_allowed() -> None:
    planner = Planner()
    for kind in (IndexType.FLAT, IndexType.HNSW):
        assert planner.exact(kind, _allowed(EXACT_SHARE[kind]))
        assert not planner.exact(kind, _allowed(min(1.0, EXACT_SHARE[kind] * 2)))
        assert planner.exact(kind, _allowed(EXACT_ROWS / 10**7, 10**7))  # a few rows of a large bundle
    assert not Planner(exact_share=0.0).exact(IndexType.FLAT, _allowed(0.00001))  # forced: the index search
    assert Planner(exact_share=1.0).exact(IndexType.HNSW, _allowed(1.0))  # forced: the exact pass


def test_an_ivf_takes_the_exact_plan_by_rows_whatever_the_share() -> None:
    planner = Planner()
    for n in (10**5, 10**6, 10**7):
        mask = np.zeros(n, dtype=bool)
        mask[:IVF_EXACT_ROWS] = True
        assert planner.exact(IndexType.IVF, Allowed(mask))
        mask[IVF_EXACT_ROWS] = True
        assert not planner.exact(IndexType.IVF, Allowed(mask))
    assert planner.exact(IndexType.IVF, _allowed(0.3, 10**5))  # 30,000 rows: a large share of a small bundle
    assert not planner.exact(IndexType.IVF, _allowed(1 / 35, 10**7))  # 285,714 rows: a small share of a large one
    assert not planner.exact(IndexType.FLAT, _allowed(0.3, 10**5))  # flat keeps its share


def test_hnsw_and_ivf_over_fetch_as_rows_are_filtered_out() -> None:
    assert Planner.ef_search(64, 40, _allowed(1.0)) == 64
    assert Planner.ef_search(64, 40, _allowed(0.5)) == 128
    assert Planner.ef_search(64, 200, _allowed(0.5)) == 400
    assert Planner.ef_search(64, 40, _allowed(0.001)) == MAX_EF_SEARCH
    assert Planner.ef_search(64, 2000, _allowed(0.5)) == 2000  # never fewer candidates than results
    assert Planner.fetch(640, 10**6, _allowed(0.25)) == 2560
    assert Planner.fetch(640, 10**5, _allowed(0.001)) == 10**5  # never more than the index holds


def test_the_bitmap_is_faiss_s_layout() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 16)).astype(np.float32)
    index = faiss.IndexFlatIP(16)
    index.add(x)
    allowed = Allowed(rng.random(1000) < 0.1)
    selector = faiss.IDSelectorBitmap(1000, faiss.swig_ptr(allowed.bitmap))
    _, rows = index.search(x[:5], 1000, params=faiss.SearchParameters(sel=selector))
    assert all(sorted(r[r >= 0].tolist()) == allowed.rows.tolist() for r in rows)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(7)
    centers = rng.standard_normal((30, 768)).astype(np.float32)
    x = centers[rng.integers(0, 30, N)] + rng.standard_normal((N, 768)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module", params=["flat", "hnsw", "ivf"])
def binary_bundle(request: pytest.FixtureRequest, tandem_home: Path, vectors: np.ndarray,
                  tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    docs = [Document(id=f"d{i}", title="", text=f"text {i}", metadata=json.dumps({"bucket": i % 100}))
            for i in range(N)]
    out = tmp_path_factory.mktemp("planner") / request.param
    out.mkdir()
    spec = resolve_spec(request.param, Quantization.BINARY, N)
    write_bundle(out, docs, vectors, dim=256, quantization=Quantization.BINARY, card=load_card(resolve("teacher")),
                 source=EmbeddingSource(kind="imported"), started=time.perf_counter(), index=spec)
    bundle = Bundle(out)
    yield bundle
    bundle.close()


@pytest.mark.parametrize("buckets", [1, 10, 60, 97])
def test_both_plans_return_allowed_rows_and_fill_the_page(binary_bundle: Bundle, vectors: np.ndarray,
                                                          buckets: int) -> None:
    flt = parse_filter({"field": "bucket", "lt": buckets}, binary_bundle.filter_fields)
    allowed = {i for i in range(N) if i % 100 < buckets}
    queries = vectors[:8] + 0.3 * np.random.default_rng(1).standard_normal((8, 768)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for plan in (Planner(exact_share=1.0), Planner(exact_share=0.0)):
        found = search(binary_bundle, queries, ["q"] * 8, SearchOptions(top_k=10, filter=flt), 4, plan)
        for hits in found.hits:
            assert len(hits) == 10 and {h.row for h in hits} <= allowed
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_the_exact_plan_rescoring_every_allowed_row_is_exact(binary_bundle: Bundle, vectors: np.ndarray) -> None:
    """With an oversample that rescores every allowed row, the exact plan is the int8 brute force over them."""
    flt = parse_filter({"field": "bucket", "eq": 3}, binary_bundle.filter_fields)
    rows = np.arange(3, N, 100)
    index = binary_bundle.segments[0].vectors
    assert index.space.calibration is not None and index.rescore_codes is not None
    stored = int8_decode(np.asarray(index.rescore_codes[rows]), index.space.calibration)
    query = vectors[3]
    found = search(binary_bundle, query[None], ["q"], SearchOptions(top_k=5, filter=flt), 10, Planner(1.0))
    expected = rows[np.argsort(-(stored @ query[:256]), kind="stable")[:5]]
    assert [h.row for h in found.hits[0]] == expected.tolist()


def test_ivf_plans_agree_where_both_rescore_every_allowed_row(tandem_home: Path, vectors: np.ndarray,
                                                               tmp_path: Path) -> None:
    """On an IVF whose probes cover its cells, the index plan and the exact plan rank the same allowed rows the
    same way: the rule that picks between them changes the cost, not the results."""
    docs = [Document(id=f"d{i}", title="", text=f"text {i}", metadata=json.dumps({"bucket": i % 100}))
            for i in range(N)]
    spec = resolve_spec("ivf", Quantization.BINARY, N, ivf_nlist=16, ivf_nprobe=16)
    write_bundle(tmp_path, docs, vectors, dim=256, quantization=Quantization.BINARY, card=load_card(resolve("teacher")),
                 source=EmbeddingSource(kind="imported"), started=time.perf_counter(), index=spec)
    bundle = Bundle(tmp_path)
    try:
        queries = vectors[:8] + 0.3 * np.random.default_rng(2).standard_normal((8, 768)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        for buckets in (1, 2):  # 30 and 60 rows: k × oversample covers them all in either plan
            flt = parse_filter({"field": "bucket", "lt": buckets}, bundle.filter_fields)
            runs = [search(bundle, queries, ["q"] * 8, SearchOptions(top_k=10, filter=flt), 10, plan).hits
                    for plan in (Planner(exact_share=1.0), Planner(exact_share=0.0), Planner())]
            rows = [[[h.row for h in hits] for hits in run] for run in runs]
            assert rows[0] == rows[1] == rows[2]
    finally:
        bundle.close()
