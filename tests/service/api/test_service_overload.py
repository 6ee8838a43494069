"""Backpressure over a real server: excess load is refused at once with 429, and the service recovers."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import LONG_BATCH
from tests.fixtures.server import LiveServer, post_together, serve_app

pytestmark = pytest.mark.slow

CLIENTS = 6  # each sends LONG_BATCH, which fills the whole admission window: while one runs, the rest are refused


def _burst(url: str) -> list[httpx.Response]:
    return post_together(url, [{"queries": LONG_BATCH, "top_k": 1}] * CLIENTS)


def _check_shed_then_recovered(server: LiveServer, responses: list[httpx.Response], refusal: str) -> None:
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 429}, codes
    for refused in (r for r in responses if r.status_code == 429):
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"] == "overloaded"
        assert refusal in refused.json()["message"]
    for answered in (r for r in responses if r.status_code == 200):
        assert len(answered.json()["results"]) == len(LONG_BATCH)
    recovered = server.client.post("/search", json={"query": "ocean tides and the moon", "top_k": 1})
    assert recovered.status_code == 200
    assert recovered.json()["results"][0]["id"] == "tides"


def test_excess_requests_get_429_with_retry_after_then_service_recovers(tiny_bundle: Path, tiny_student: Path) -> None:
    # Admission by count is under test: a generous deadline keeps a slow machine from turning the admitted
    # request into a 503, and a generous queue-time bound leaves the refusals to max_pending.
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, workers=1, max_pending=len(LONG_BATCH),
                               max_batch_queries=len(LONG_BATCH), request_timeout_ms=60_000, max_queue_ms=60_000)
    with serve_app(create_app(settings)) as server:
        _check_shed_then_recovered(server, _burst(server.url), f"at most {len(LONG_BATCH)} are admitted")


def test_requests_that_would_queue_past_the_time_bound_get_429(tiny_bundle: Path, tiny_student: Path) -> None:
    # The count bound admits every burst here; only the estimated queue wait (any measured pace, times a
    # whole LONG_BATCH ahead, is far beyond a microsecond) refuses. The worker is free for the first request.
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, workers=1,
                               max_pending=CLIENTS * len(LONG_BATCH), max_batch_queries=len(LONG_BATCH),
                               request_timeout_ms=60_000, max_queue_ms=0.001)
    with serve_app(create_app(settings)) as server:
        assert server.client.post("/search", json={"query": "warm-up: measures the pace", "top_k": 1}).is_success
        _check_shed_then_recovered(server, _burst(server.url), "more than the 0 ms admitted")
