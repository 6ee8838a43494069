"""A search checks its deadline between segments and stages: past it, it stops with DeadlineExceeded (the service's
503), so its worker is free again; before it, it runs as if it had none. Counted, never timed: the deadline is set
in the past or far ahead."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from indexer.writer import write_bundle
from models.bundle.manifest import EmbeddingSource
from models.bundle.vectors.index_spec import Quantization
from models.bundle.version import Bundle
from models.corpus import Document
from models.encoders.registry import load_card, resolve
from models.errors import DeadlineExceeded
from models.search import Mode, SearchOptions, parse_filter, search
from models.search.query import allowed_rows, deadline_check, dense_candidates

pytestmark = pytest.mark.usefixtures("tandem_home")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    directory = tmp_path_factory.mktemp("deadline") / "v1"
    directory.mkdir()
    docs = [Document(id=f"d{i}", title="", text=f"tide moon {i}", metadata=json.dumps({"n": i})) for i in range(20)]
    vectors = np.random.default_rng(0).standard_normal((20, 768)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    write_bundle(directory, docs, vectors, dim=768, quantization=Quantization.FLOAT, card=load_card(resolve("teacher")),
                 source=EmbeddingSource(kind="imported"), started=time.perf_counter())
    return Bundle(directory)


@pytest.mark.parametrize("mode", list(Mode))
def test_a_search_past_its_deadline_stops(bundle: Bundle, mode: Mode) -> None:
    query = np.asarray(bundle.segments[0].vectors.index.reconstruct(0), dtype=np.float32)[None, :]
    flt = parse_filter({"field": "n", "gte": 3}, bundle.filter_fields)
    ahead = search(bundle, query, ["tide"], SearchOptions(top_k=3, mode=mode, filter=flt,
                                                          deadline=time.monotonic() + 3600), 4)
    assert len(ahead.hits[0]) == 3
    with pytest.raises(DeadlineExceeded):
        search(bundle, query, ["tide"], SearchOptions(top_k=3, mode=mode, filter=flt, deadline=time.monotonic() - 1), 4)


def test_the_check_runs_once_per_segment_and_stage(bundle: Bundle) -> None:
    calls: list[str] = []
    query = np.asarray(bundle.segments[0].vectors.index.reconstruct(0), dtype=np.float32)
    flt = parse_filter({"field": "n", "lt": 5}, bundle.filter_fields)
    allowed = allowed_rows(bundle, flt, lambda: calls.append("filter"))
    dense_candidates(bundle, query, 3, allowed, 4, check=lambda: calls.append("dense"))
    assert calls == ["filter"] * len(bundle.segments) + ["dense"] * len(bundle.segments)
    deadline_check(None)()  # no deadline: never raises
    with pytest.raises(DeadlineExceeded):
        deadline_check(time.monotonic() - 1)()


@pytest.fixture(scope="module")
def binary_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    directory = tmp_path_factory.mktemp("deadline-binary") / "v1"
    directory.mkdir()
    docs = [Document(id=f"d{i}", title="", text=f"tide {i}", metadata=None) for i in range(3000)]
    vectors = np.random.default_rng(1).standard_normal((3000, 768)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    write_bundle(directory, docs, vectors, dim=256, quantization=Quantization.BINARY,
                 card=load_card(resolve("teacher")), source=EmbeddingSource(kind="imported"),
                 started=time.perf_counter())
    return Bundle(directory)


def test_a_deep_rescoring_checks_its_deadline_between_chunks(binary_bundle: Bundle) -> None:
    """offset + top_k = 100 at ×16: 1,600 rows rescored, 1,024 at a time, so the check runs once between them too;
    past the deadline, the search stops there (DeadlineExceeded) instead of at the end of its pool."""
    index = binary_bundle.segments[0].vectors
    index.chunk_rows = 1024
    query = np.random.default_rng(2).standard_normal(768).astype(np.float32)
    query /= np.linalg.norm(query)
    calls: list[str] = []
    allowed = allowed_rows(binary_bundle, None)
    dense_candidates(binary_bundle, query, 100, allowed, 16, check=lambda: calls.append("check"))
    assert calls == ["check"] * (len(binary_bundle.segments) + 1)  # the segment's, then between the two chunks
    before, checks = index.scored.chunks, iter([None])

    def expires_after_the_first_check() -> None:
        if next(checks, DeadlineExceeded) is DeadlineExceeded:
            raise DeadlineExceeded("the search ran past the request's deadline")

    with pytest.raises(DeadlineExceeded):
        dense_candidates(binary_bundle, query, 100, allowed, 16, check=expires_after_the_first_check)
    assert index.scored.chunks - before == 1  # stopped after its first chunk, not at the end of its pool
