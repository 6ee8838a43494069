"""tandem.client against real servers: typed answers, keys, errors with the server's words, and retries
of a real overload that honour Retry-After and stop within the budget."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.settings import ServiceSettings
from tandem.client import ApiError, AsyncClient, Client, RetryPolicy, SearchResult, TransportError
from tests.fixtures.corpus import LONG_BATCH, PROBES
from tests.fixtures.server import LiveServer, serve_app

TEXTS = sorted(PROBES)
BIG = LONG_BATCH * 3  # one request that fills the whole admission window of the overloaded server
HAMMERS = 3


def test_search_answers_are_typed(live_server: LiveServer, tiny_bundle: Path) -> None:
    with Client(live_server.url) as client:
        result = client.search(TEXTS[0], top_k=3)
        assert isinstance(result, SearchResult)
        assert result.results[0].id == PROBES[TEXTS[0]] and len(result.results) == 3
        assert result.index.version == tiny_bundle.name and result.index.count == 20
        assert min(result.timing_ms.queue, result.timing_ms.encode, result.timing_ms.search) >= 0
        batch = client.search_batch(TEXTS, top_k=2)
        assert [hits[0].id for hits in batch.results] == [PROBES[t] for t in TEXTS]
        assert client.healthz().status == "ok"
        assert client.readyz().ready
        embedded = client.embed(TEXTS[:2], dimensions=128)
        assert [len(v) for v in embedded.vectors] == [128, 128] and embedded.prompt_tokens > 0
        assert abs(sum(x * x for x in embedded.vectors[0]) - 1.0) < 1e-4


def test_async_client(live_server: LiveServer) -> None:
    async def run() -> list[str]:
        async with AsyncClient(live_server.url) as client:
            assert (await client.readyz()).ready
            results = await asyncio.gather(*(client.search(text, top_k=1) for text in TEXTS))
            batch = await client.search_batch(TEXTS[:2])
            assert len(batch.results) == 2
            return [result.results[0].id for result in results]

    assert asyncio.run(run()) == [PROBES[t] for t in TEXTS]


def test_errors_carry_the_servers_message_and_request_id(live_server: LiveServer) -> None:
    with Client(live_server.url) as client, pytest.raises(ApiError) as info:
        client.search("tides", top_k=0)
    error = info.value
    assert (error.status, error.code, error.attempts) == (422, "invalid_request", 1)  # a 422 is never retried
    assert "top_k" in error.message and error.message in str(error)
    assert error.request_id and error.request_id in str(error)


def test_api_keys(tiny_bundle: Path, tiny_student: Path) -> None:
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, api_keys="k-client")
    with serve_app(create_app(settings)) as server:
        for key, status, code in [(None, 401, "unauthorized"), ("wrong", 403, "forbidden")]:
            with Client(server.url, api_key=key) as client, pytest.raises(ApiError) as info:
                client.search("tides")
            assert (info.value.status, info.value.code) == (status, code)
        with Client(server.url, api_key="k-client") as client:
            assert client.search("tides", top_k=1).results[0].id == "tides"
            assert client.healthz().status == "ok"  # probes stay open


def test_no_server_is_a_transport_error_within_the_budget() -> None:
    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", retry=RetryPolicy(budget_s=0.5)) as client, \
            pytest.raises(TransportError) as info:
        client.search("tides")
    assert info.value.attempts >= 1 and "ConnectError" in str(info.value)


class Hammer:
    """Threads that keep the server's only worker busy with requests that fill its admission window."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.refused = 0
        self._pool = ThreadPoolExecutor(max_workers=HAMMERS)

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60.0, trust_env=False) as client:
            while not self.stop.is_set():
                if client.post("/search", json={"queries": BIG, "top_k": 1}).status_code == 429:
                    self.refused += 1

    def __enter__(self) -> Hammer:
        for _ in range(HAMMERS):
            self._pool.submit(self._loop)
        _until(lambda: self.refused > 0, "the server never refused the hammer")  # it is overloaded now
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._pool.shutdown(wait=True)


def _until(condition: object, message: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, message
        time.sleep(0.01)


@pytest.fixture(scope="module")
def overloaded_url(tiny_bundle: Path, tiny_student: Path) -> Iterator[str]:
    # One worker; a BIG request fills the admission window, so while one runs every other request gets 429.
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, workers=1, max_pending=len(BIG),
                               max_batch_queries=len(BIG), request_timeout_ms=60_000, max_queue_ms=60_000)
    with serve_app(create_app(settings)) as server:
        yield server.url


def _retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tandem.client" and "retrying in" in r.getMessage()]


@pytest.mark.slow
def test_overload_gives_up_within_the_budget(overloaded_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tandem.client")
    # Retry-After is 1 s: a 2.5 s budget leaves room for two waits, so two or three attempts, never more.
    with Hammer(overloaded_url), Client(overloaded_url, retry=RetryPolicy(budget_s=2.5)) as client:
        with pytest.raises(ApiError) as info:
            client.search("tides")
        with pytest.raises(ApiError) as embedding:
            client.embed(["tides"])  # /v1/embeddings is admitted by the same batcher
    for error in (info.value, embedding.value):
        assert (error.status, error.code, error.retry_after) == (429, "overloaded", 1.0)
        assert 2 <= error.attempts <= 3, error.attempts
        assert error.request_id
    retries = _retries(caplog)
    assert retries and all("retrying in 1.00 s (Retry-After 1.0)" in line for line in retries), retries


@pytest.mark.slow
def test_overload_is_retried_after_retry_after_until_it_passes(overloaded_url: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tandem.client")
    with Client(overloaded_url, retry=RetryPolicy(budget_s=120, max_attempts=1000)) as client, \
            ThreadPoolExecutor(max_workers=1) as pool:
        with Hammer(overloaded_url):
            answer = pool.submit(client.search, "ocean tides and the moon", 1)
            _until(lambda: _retries(caplog), "the client never met the overload")
        result = answer.result(timeout=120)  # the hammer stopped: the next retry gets through
    assert result.results[0].id == "tides"
    assert "(Retry-After 1.0)" in _retries(caplog)[0]
