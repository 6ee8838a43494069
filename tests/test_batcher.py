"""Micro-batching over the real tiny bundle and ONNX student: same answers, coalesced, bounded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from service.batcher import DeadlineExceeded, Overloaded
from service.engine import Searcher
from service.settings import ServiceSettings
from tests.fixtures.corpus import PROBES

pytestmark = pytest.mark.slow

COALESCE: dict[str, object] = {"workers": 1, "batch_wait_ms": 200.0, "batch_max_queries": 32}


@contextmanager
def _searcher(bundle: Path, student: Path, **settings: object) -> Iterator[Searcher]:
    searcher = Searcher.load(ServiceSettings(index=bundle, student=student, **settings))
    try:
        yield searcher
    finally:
        searcher.close()


@pytest.fixture()
def searcher(tiny_bundle: Path, tiny_student: Path) -> Iterator[Searcher]:
    # One worker and a generous wait, so that jobs queued together are encoded together. fp32, because
    # int8 dynamic quantization scales activations per batch: batchmates move a vector (cosine ≥ 0.99).
    with _searcher(tiny_bundle, tiny_student, student_precision="fp32", **COALESCE) as loaded:
        yield loaded


def _ids(hits: list) -> list[str]:
    return [hit.doc.id for hit in hits]


def test_coalesced_jobs_get_the_answers_they_would_get_alone(searcher: Searcher) -> None:
    queries = sorted(PROBES)
    alone = {q: _ids(searcher.search_vectors(searcher.student.encode([q]), 3)[0]) for q in queries}
    futures = [searcher.batcher.submit([q], 3, timeout_s=30) for q in queries]
    outcomes = [f.result(timeout=30) for f in futures]
    assert [_ids(o.hits[0]) for o in outcomes] == [alone[q] for q in queries]
    assert max(o.batch_size for o in outcomes) > 1  # some of them shared an ONNX call
    assert searcher.batcher.pending == 0


def test_int8_batches_keep_each_querys_best_hit(tiny_bundle: Path, tiny_student: Path) -> None:
    with _searcher(tiny_bundle, tiny_student, **COALESCE) as searcher:
        futures = [searcher.batcher.submit([q], 1, timeout_s=30) for q in sorted(PROBES)]
        assert [_ids(f.result(timeout=30).hits[0]) for f in futures] == [[PROBES[q]] for q in sorted(PROBES)]


def test_jobs_with_different_top_k_share_a_batch_but_not_a_cutoff(searcher: Searcher) -> None:
    futures = [searcher.batcher.submit(sorted(PROBES)[:2], k, timeout_s=30) for k in (1, 4, 2)]
    outcomes = [f.result(timeout=30) for f in futures]
    assert [[len(hits) for hits in o.hits] for o in outcomes] == [[1, 1], [4, 4], [2, 2]]
    assert outcomes[1].hits[0][:1] == outcomes[0].hits[0]


def test_admission_is_bounded(tiny_bundle: Path, tiny_student: Path) -> None:
    with _searcher(tiny_bundle, tiny_student, max_pending=4, max_batch_queries=4) as searcher:
        with pytest.raises(Overloaded, match="at most 4"):
            searcher.batcher.submit(["a"] * 5, 1, timeout_s=30)
        assert searcher.batcher.pending == 0
        assert searcher.batcher.submit(["a"] * 4, 1, timeout_s=30).result(timeout=30).batch_size == 4


def test_a_job_past_its_deadline_is_not_run(searcher: Searcher) -> None:
    with pytest.raises(DeadlineExceeded):
        searcher.batcher.submit(["tides"], 1, timeout_s=0).result(timeout=30)
    assert searcher.batcher.pending == 0


def test_settings_refuse_a_batch_larger_than_admission() -> None:
    with pytest.raises(Exception, match="TANDEM_MAX_BATCH_QUERIES"):
        ServiceSettings(index=Path("i"), student=Path("s"), max_pending=8, max_batch_queries=16)
