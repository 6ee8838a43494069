"""tandem_client against real servers: typed answers, keys, errors with the server's words, and retries
of a real overload that honour Retry-After and stop within the budget."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from service.http.app import create_app
from service.settings import CollectionSpec, ServiceSettings
from tandem_client import ApiError, AsyncClient, Client, RetryPolicy, SearchResult, TransportError
from tandem_client._core import SearchOptions, search_body, search_path
from tests.fixtures.corpus import DOCS, LONG_BATCH, PROBES
from tests.fixtures.metadata import META
from tests.fixtures.server import LiveServer, local_client, serve_app

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


def test_options_left_none_are_not_sent() -> None:
    """None is the server's default: the body carries only what the caller chose (an older server still works)."""
    assert search_body("tides", SearchOptions()) == {"query": "tides"}
    chosen = SearchOptions(top_k=3, mode="hybrid", filter={"field": "year", "gte": 2018}, offset=0, min_score=0.0,
                           fields=("id", "metadata"), fusion="convex", alpha=0.25)
    assert search_body(["a", "b"], chosen) == {
        "queries": ["a", "b"], "top_k": 3, "mode": "hybrid", "filter": {"field": "year", "gte": 2018}, "offset": 0,
        "min_score": 0.0, "fields": ["id", "metadata"], "fusion": "convex", "alpha": 0.25}


def test_lexical_and_hybrid_modes(meta_server: LiveServer) -> None:
    with Client(meta_server.url) as client:
        lexical = client.search("Odoacer", mode="lexical", top_k=3)
        assert [h.id for h in lexical.results] == ["rome"]  # the only document with the word
        assert "lexical" in lexical.timing_ms.model_fields_set and lexical.timing_ms.lexical >= 0
        dense = client.search("volcanic eruption lava", top_k=3)
        for fusion in ("rrf", "convex"):
            hybrid = client.search("volcanic eruption lava", mode="hybrid", fusion=fusion, top_k=3)
            assert hybrid.results[0].id == "volcano"
        # alpha 1: all the weight on the dense side, whose ranking leads
        only_dense = client.search("volcanic eruption lava", mode="hybrid", fusion="convex", alpha=1.0, top_k=3)
        assert [h.id for h in only_dense.results] == [h.id for h in dense.results]
        batch = client.search_batch(["Odoacer", "Zanzibar"], mode="lexical", top_k=2)
        assert [[h.id for h in hits] for hits in batch.results] == [["rome"], []]


def test_a_filter_narrows_the_results(meta_server: LiveServer) -> None:
    earth = {doc_id for doc_id, meta in META.items() if meta["topic"] == "earth"}
    with Client(meta_server.url) as client:
        everything = client.search("what is this about", top_k=len(DOCS))
        assert len(everything.results) == len(DOCS)
        narrowed = client.search("what is this about", top_k=len(DOCS), filter={"field": "topic", "eq": "earth"},
                                 fields=["id", "metadata"])
        assert {h.id for h in narrowed.results} == earth
        for hit in narrowed.results:  # metadata is typed on the hit, the extra key kept by --metadata-extra too
            assert hit.metadata == {**META[hit.id or ""], "source": "fixture"}
        later = client.search_batch(["what is this about"], top_k=len(DOCS),
                                    filter={"and": [{"field": "year", "gte": 2015}, {"field": "doi", "exists": True}]})
        assert {h.id for h in later.results[0]} == {
            doc_id for doc_id, meta in META.items() if meta["year"] >= 2015 and "doi" in meta}


def test_offset_min_score_and_fields(meta_server: LiveServer) -> None:
    with Client(meta_server.url) as client:
        full = [h.id for h in client.search("energy from the sun", top_k=6).results]
        pages = [[h.id for h in client.search("energy from the sun", top_k=3, offset=o).results] for o in (0, 3)]
        assert pages[0] + pages[1] == full
        high = client.search("bread dough yeast", top_k=len(DOCS), min_score=0.3).results
        assert high and all((h.score or 0) >= 0.3 for h in high) and len(high) < len(DOCS)
        slim = client.search("bread dough yeast", top_k=2, fields=["id", "score"]).results
        assert [h.model_fields_set for h in slim] == [{"id", "score"}] * 2
        assert slim[0].id == "bake" and slim[0].title is None and slim[0].text is None and slim[0].metadata is None


def test_a_malformed_filter_is_an_api_error_with_the_servers_message(meta_server: LiveServer) -> None:
    with Client(meta_server.url) as client, pytest.raises(ApiError) as info:
        client.search("tides", filter={"field": "colour", "eq": "red"})
    error = info.value
    assert (error.status, error.code, error.attempts) == (422, "invalid_request", 1)
    assert "filter.field" in error.message and "colour" in error.message and error.message in str(error)

    async def run() -> ApiError:
        async with AsyncClient(meta_server.url) as client:
            with pytest.raises(ApiError) as async_info:
                await client.search("tides", filter={"and": []})
            return async_info.value

    assert (async_error := asyncio.run(run())).status == 422 and "filter.and" in async_error.message


def test_async_client_options(meta_server: LiveServer) -> None:
    async def run() -> tuple[list[str | None], list[list[str | None]]]:
        async with AsyncClient(meta_server.url) as client:
            one = await client.search("Odoacer", mode="hybrid", fusion="rrf", top_k=1, fields=["id"])
            many = await client.search_batch(["what is this about"], top_k=len(DOCS), offset=1, mode="dense",
                                             filter={"field": "open", "eq": True})
            return [h.id for h in one.results], [[h.id for h in hits] for hits in many.results]

    one, many = asyncio.run(run())
    assert one == ["rome"]
    open_docs = {doc_id for doc_id, meta in META.items() if meta["open"] is True}
    assert len(many[0]) == len(open_docs) - 1 and set(many[0]) < open_docs  # offset 1 skips the best


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


_SCOPED_KEYS = """
[[key]]
id = "docs-only"
key = "docs-only-key-0123456789"
collections = ["docs"]

[[key]]
id = "all"
key = "all-key-0123456789"
collections = ["*"]
"""


def test_collections_are_listed_and_searched_by_name(tiny_bundle: Path, meta_bundle: Path, tiny_student: Path,
                                                       tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(_SCOPED_KEYS)
    specs = (CollectionSpec(name="docs", index=tiny_bundle, student=tiny_student),
             CollectionSpec(name="meta", index=meta_bundle, student=tiny_student))
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, collections=specs, keys_file=keys)
    with serve_app(create_app(settings)) as server:
        with Client(server.url, api_key="all-key-0123456789") as client:
            listed = client.collections()
            assert [(c.name, c.state, c.default, c.count) for c in listed] == [
                ("docs", "ready", False, len(DOCS)), ("meta", "ready", False, len(DOCS))]
            assert listed[1].version == meta_bundle.name and listed[1].student == tiny_student.name
            assert [h.id for h in client.search("Odoacer", mode="lexical", collection="meta").results] == ["rome"]
            assert client.search(TEXTS[0], top_k=1, collection="docs").results[0].id == PROBES[TEXTS[0]]
            batch = client.search_batch(["Odoacer"], mode="lexical", collection="meta")
            assert [h.id for h in batch.results[0]] == ["rome"]
            with pytest.raises(ApiError) as no_default:  # two collections, none named 'default'
                client.search("tides")
            assert no_default.value.status == 404

        async def scoped() -> tuple[list[str], ApiError, str | None]:
            async with AsyncClient(server.url, api_key="docs-only-key-0123456789") as client:
                names = [c.name for c in await client.collections()]
                try:
                    await client.search("Odoacer", collection="meta")
                except ApiError as exc:
                    hidden = exc
                else:
                    raise AssertionError("a key scoped to 'docs' searched 'meta'")
                batch = await client.search_batch([TEXTS[0]], top_k=1, collection="docs")
                return names, hidden, batch.results[0][0].id

        names, hidden, top = asyncio.run(scoped())
        assert names == ["docs"] and top == PROBES[TEXTS[0]]
        assert (hidden.status, hidden.code) == (404, "not_found")  # as one not served: names do not leak


def test_a_collection_name_is_escaped_in_the_path() -> None:
    assert search_path(None) == "/search"
    assert search_path("docs") == "/collections/docs/search"
    assert search_path("a/b c") == "/collections/a%2Fb%20c/search"


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
        self._loops: list[Future[None]] = []

    def _loop(self) -> None:
        with local_client(self.url, timeout=60.0) as client:
            while not self.stop.is_set():
                if client.post("/search", json={"queries": BIG, "top_k": 1}).status_code == 429:
                    self.refused += 1

    def __enter__(self) -> Hammer:
        self._loops = [self._pool.submit(self._loop) for _ in range(HAMMERS)]
        _until(lambda: self.refused > 0, "the server never refused the hammer")  # it is overloaded now
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._pool.shutdown(wait=True)
        for loop in self._loops:  # a hammer that died would have lifted the overload unseen: say why
            loop.result()


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
    return [r.getMessage() for r in caplog.records if r.name == "tandem_client" and "retrying in" in r.getMessage()]


def _give_up(call: Callable[[], object], tries: int = 5) -> ApiError:
    """The first ApiError of up to `tries` calls. Between two hammer jobs the admission window is free for an
    instant, and a real server rightly admits a request that lands there: such a call may succeed."""
    for _ in range(tries):
        try:
            call()
        except ApiError as error:
            return error
    raise AssertionError(f"{tries} calls in a row were admitted: the server was not overloaded")


@pytest.mark.slow
def test_overload_gives_up_within_the_budget(overloaded_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tandem_client")
    # Retry-After is 1 s: a 2.5 s budget leaves room for two waits, so two or three attempts, never more. The search
    # and the embedding (/v1/embeddings is admitted by the same batcher) wait out their budgets side by side.
    with Hammer(overloaded_url), Client(overloaded_url, retry=RetryPolicy(budget_s=2.5)) as client, \
            ThreadPoolExecutor(max_workers=2) as pool:
        search = pool.submit(_give_up, lambda: client.search("tides"))
        embed = pool.submit(_give_up, lambda: client.embed(["tides"]))
        searched, embedded = search.result(timeout=120), embed.result(timeout=120)
    for error in (searched, embedded):
        assert (error.status, error.code, error.retry_after) == (429, "overloaded", 1.0)
        assert 2 <= error.attempts <= 3, error.attempts
        assert error.request_id
    retries = _retries(caplog)
    assert retries and all("retrying in 1.00 s (Retry-After 1.0)" in line for line in retries), retries


@pytest.mark.slow
def test_overload_is_retried_after_retry_after_until_it_passes(overloaded_url: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tandem_client")
    with Client(overloaded_url, retry=RetryPolicy(budget_s=120, max_attempts=1000)) as client, \
            ThreadPoolExecutor(max_workers=1) as pool:
        with Hammer(overloaded_url):
            for _ in range(5):  # a search landing in the instant between two hammer jobs is rightly admitted (_give_up)
                answer = pool.submit(client.search, "ocean tides and the moon", 1)
                _until(lambda job=answer: _retries(caplog) or job.done(), "the search neither retried nor finished")
                if _retries(caplog):
                    break
            assert _retries(caplog), "the client never met the overload: 5 searches in a row were admitted"
        result = answer.result(timeout=120)  # the hammer stopped: the next retry gets through
    assert result.results[0].id == "tides"
    assert "(Retry-After 1.0)" in _retries(caplog)[0]
