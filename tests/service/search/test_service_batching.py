"""Micro-batching over a real server: concurrent requests share ONNX calls and each gets its own answer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import PROBES
from tests.fixtures.server import post_together, serve_app

pytestmark = pytest.mark.slow

ROUNDS = 3


def _histogram(metrics: str, name: str) -> tuple[float, float]:
    """(count, count in the le="1" bucket) of a Prometheus histogram in the text exposition."""
    count = float(re.search(rf"^{name}_count (\S+)$", metrics, re.M).group(1))  # type: ignore[union-attr]
    alone = float(re.search(rf'^{name}_bucket{{le="1.0"}} (\S+)$', metrics, re.M).group(1))  # type: ignore[union-attr]
    return count, alone


def test_concurrent_requests_share_batches_and_keep_their_answers(tiny_bundle: Path, tiny_student: Path) -> None:
    # One worker and a generous wait, so queued requests are encoded together; fp32, because int8 dynamic
    # quantization scales activations per batch (batchmates move a vector slightly). Admission by estimated
    # queue wait is another test's subject: with the default 40 ms, one of these five requests once got a 429.
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, workers=1, batch_max_queries=8,
                               batch_wait_ms=200.0, student_precision="fp32", request_timeout_ms=60_000,
                               max_queue_ms=60_000)
    queries = sorted(PROBES)
    with serve_app(create_app(settings)) as server:
        for _ in range(ROUNDS):
            responses = post_together(server.url, [{"query": query, "top_k": 1} for query in queries])
            assert [r.status_code for r in responses] == [200] * len(queries)
            assert [r.json()["results"][0]["id"] for r in responses] == [PROBES[q] for q in queries]
        count, alone = _histogram(server.client.get("/metrics").text, "tandem_batch_queries")
    assert count == ROUNDS * len(queries)
    assert alone < count  # some requests were encoded together with others
