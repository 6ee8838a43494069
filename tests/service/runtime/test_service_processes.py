"""`tandem serve --processes 2` (issue 27): the real command, two real worker processes sharing one port.

Every answer is checked, answers come from both processes (X-Tandem-Process), /metrics adds the
processes up, a new CURRENT and an admin reload or rollback reach every process, the settings and the
read deadlines hold in every worker, and a mismatched student is refused before any worker starts.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from models.bundle.versions import set_current
from tests.fixtures import service_fast
from tests.fixtures.corpus import LONG_BATCH, PROBES
from tests.fixtures.server import Served, Started, free_port, popen, post_together, serve_process
from tests.fixtures.tiny_service import versions_root
from tests.service.api.test_service_limits import _closed_by_server, _trickler
from tests.service.api.test_service_refuses import altered_student
from tests.service.reload.test_service_reload import AUTH, TOKEN, wait_for

pytestmark = pytest.mark.slow

PROCESSES = 2
SCRAPES = 3 * PROCESSES  # scrapes on fresh connections: several land on each process
ROUNDS = 10  # concurrent rounds of every probe, at most, until both processes have answered
BURSTS = 5  # bursts, at most, until one is shed
MAX_QUERY_CHARS = 64  # the watched servers' limit: every probe is shorter

Start = Callable[[Sequence[str], Mapping[str, str], Path], Started]  # how `tandem serve` starts (serve_process)


def _serve_args(index: Path, student: Path) -> list[str]:
    return ["--index", str(index), "--student", str(student), "--processes", str(PROCESSES)]


def _env(**extra: str) -> dict[str, str]:
    """The servers' settings. Admission by time is opened wide: these tests load both processes on purpose (a
    burst of every probe, with two clients searching beside it), and on a slow or busy machine the default 40 ms
    budget rightly sheds some of that burst with 429s, and the 1 s request deadline a 503 while a replacement
    worker starts beside them (it imports onnxruntime and FAISS on the same cores), which is not what they test.
    The admission test sets its own bounds."""
    return {**os.environ, "TANDEM_ADMIN_TOKEN": TOKEN, "TANDEM_WORKERS": "1", "TANDEM_LOG_FORMAT": "text",
            "OMP_NUM_THREADS": "1", "TANDEM_MAX_QUEUE_MS": "60000", "TANDEM_REQUEST_TIMEOUT_MS": "60000", **extra}


def _fresh(url: str) -> httpx.Client:
    """A client whose every request opens a connection of its own, which the kernel hands to whichever worker
    accepts it: tests.fixtures.server.local_client (plain HTTP, no TLS context) with keep-alive off."""
    return httpx.Client(base_url=url, timeout=60.0, trust_env=False, verify=False,
                        limits=httpx.Limits(max_keepalive_connections=0))


def _processes(client: httpx.Client) -> list[dict[str, Any]]:
    response = client.get("/admin/status", headers=AUTH)
    assert response.status_code == 200, response.text
    processes: list[dict[str, Any]] = response.json()["processes"]
    return processes


@contextmanager
def serving(index: Path, student: Path, log: Path, start: Start = popen, **env: str) -> Iterator[Served]:
    """`tandem serve --processes 2`, ready once both workers report a version (tests.fixtures.server.serve_process),
    started as users start it (`popen`) or forked warm (service_fast.start)."""
    def all_serving(client: httpx.Client) -> bool:
        states = _processes(client)
        return len(states) == PROCESSES and all(s["version"] for s in states)

    with serve_process(_serve_args(index, student), _env(**env), log, all_serving, start=start) as served:
        yield served


def _fresh_processes(url: str) -> list[dict[str, Any]]:
    with _fresh(url) as client:
        return _processes(client)


def _replaced(url: str, gone: set[int], version: str = "v2") -> bool:
    """Every worker reports `version`, and none of the `gone` pids is among them."""
    states = _fresh_processes(url)
    return (len(states) == PROCESSES and not gone & {s["pid"] for s in states}
            and {s["version"] for s in states} == {version})


def _search_everywhere(url: str, version: str | None = None) -> tuple[int, set[str]]:
    """Every probe, concurrently, in rounds until both processes have answered: each answer is checked (the
    document the probe gets first when asked alone, from `version` if given). The requests made (the ones asked
    alone included), and the processes that answered the concurrent ones."""
    bodies: list[dict[str, object]] = [{"query": query, "top_k": 3} for query in sorted(PROBES)] * 2
    with _fresh(url) as client:
        alone = {query: client.post("/search", json={"query": query, "top_k": 3}).json()["results"][0]["id"]
                 for query in sorted(PROBES)}
    pids: set[str] = set()
    made = len(alone)
    for _ in range(ROUNDS):
        for body, response in zip(bodies, post_together(url, bodies), strict=True):
            made += 1
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["results"][0]["id"] == alone[str(body["query"])]
            if version is not None:
                assert answer["index"]["version"] == version
            pids.add(response.headers["X-Tandem-Process"])
        if len(pids) == PROCESSES:
            break
    return made, pids


def _metric(client: httpx.Client, name: str, **labels: str) -> float:
    text = client.get("/metrics").text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _scrape_each(url: str, name: str, **labels: str) -> list[float]:
    """One scrape per fresh connection (several land on each process)."""
    with _fresh(url) as client:
        return [_metric(client, name, **labels) for _ in range(SCRAPES)]


@pytest.fixture(scope="module", params=["1", "0"])  # 0: each process's event loop encodes and searches itself
def watched(request: pytest.FixtureRequest, mini_bundle: Path, mini_v2_bundle: Path, mini_student: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    """`tandem serve --processes 2` over a root of the mini bundle (v1) and its v2, each process watching CURRENT; one
    per TANDEM_WORKERS for the module's tests that leave it as they found it or set what they need first (starting
    two worker interpreters costs more than what those tests do with them). Its query limit and read deadlines are
    set (MAX_QUERY_CHARS over every probe): test_settings_and_hardening_reach_every_worker finds them in each.

    TANDEM_WORKERS 1's supervisor starts as users start it (`popen`: its own interpreter and imports); 0's, which
    differs only in how each worker's batcher runs, is forked warm (service_fast.start, about a CPU-second of the
    supervisor's imports skipped). Both fork their workers from their own forkserver, checked in each.

    Once the supervisor has stopped, its runtime directory (every worker's metrics and status files, those of the
    workers test_replaced_workers_catch_up_and_totals_keep_adding_up killed and replaced included) is gone."""
    assert max(map(len, PROBES)) <= MAX_QUERY_CHARS
    folder = tmp_path_factory.mktemp(f"watched-{request.param}")
    root = versions_root(folder / "bundles", mini_bundle, mini_v2_bundle)
    log = folder / "serve.log"
    start: Start = popen if request.param == "1" else service_fast.start
    with serving(root, mini_student, log, start, TANDEM_WATCH_INTERVAL_S="0.2",
                 TANDEM_WORKERS=request.param, TANDEM_MAX_QUERY_CHARS=str(MAX_QUERY_CHARS),
                 TANDEM_HEADER_TIMEOUT_S="1", TANDEM_BODY_TIMEOUT_S="1") as server:
        _check_forkserver(server.pid)
        yield server, root
    found = re.search(r"runtime directory (\S+)\)", log.read_text())
    assert found is not None, log.read_text()
    assert not Path(found.group(1)).exists()  # metrics files and status files go with the server


def _check_forkserver(supervisor: int) -> None:
    """The workers' forkserver (service.runtime.workers), a child of the supervisor, has preloaded the service's
    imports (FAISS mapped) but not onnxruntime, and holds no thread besides its own when it forks."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    servers = [pid for pid in children if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(servers) == 1, children
    maps = Path(f"/proc/{servers[0]}/maps").read_text()
    assert "faiss" in maps and "onnxruntime" not in maps
    assert os.listdir(f"/proc/{servers[0]}/task") == [servers[0]]


def _settled_count(client: httpx.Client, name: str, **labels: str) -> float:
    """A counter once two scrapes agree: a request is counted just after its answer is sent, so an earlier test's
    last answers may still be on their way into it."""
    seen: list[float] = [_metric(client, name, **labels)]

    def same() -> bool:
        seen.append(_metric(client, name, **labels))
        return seen[-1] == seen[-2]

    wait_for(same, f"{name} settled")
    return seen[-1]


def _serving_one(client: httpx.Client) -> str:
    """The version every process serves (one and the same)."""
    versions = {s["version"] for s in _processes(client)}
    assert len(versions) == 1, versions
    return str(versions.pop())


def test_both_processes_answer_and_metrics_add_up(watched: tuple[Served, Path]) -> None:
    server, _ = watched
    version = _serving_one(server.client)
    ok = {"route": "/search", "method": "POST", "status": "200"}
    counted = _settled_count(server.client, "tandem_http_requests_total", **ok)
    staged = _settled_count(server.client, "tandem_stage_duration_seconds_count", stage="total")
    made, pids = _search_everywhere(server.url, version=version)
    assert len(pids) == PROCESSES, f"every answer came from {pids}"
    assert pids == {str(s["pid"]) for s in _processes(server.client)}
    # A request is counted just after its answer is sent: wait for the last ones, then every scrape agrees.
    wait_for(lambda: _metric(server.client, "tandem_http_requests_total", **ok) == counted + made,
             "all requests counted")
    assert _scrape_each(server.url, "tandem_http_requests_total", **ok) == [counted + made] * SCRAPES
    assert _scrape_each(server.url, "tandem_stage_duration_seconds_count", stage="total") == [staged + made] * SCRAPES
    assert _metric(server.client, "tandem_index_info", version=version) == PROCESSES
    assert _metric(server.client, "tandem_queue_depth") == 0


def _failed(answers: list[httpx.Response | Exception]) -> list[str]:
    """Every answer that is not a 200, with its body (a 503 says which: not ready, deadline, overload), or the
    error a request met."""
    return [f"{a.status_code} {a.text}" if isinstance(a, httpx.Response) else repr(a)
            for a in answers if not isinstance(a, httpx.Response) or a.status_code != 200]


@contextmanager
def under_load(url: str, clients: int = 2) -> Iterator[list[httpx.Response | Exception]]:
    """Searches from `clients` threads (a fresh connection every few requests) until the block ends; every
    answer, or the error a request met, is collected."""
    answers: list[httpx.Response | Exception] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            with httpx.Client(base_url=url, timeout=30.0, trust_env=False, verify=False) as client:  # no TLS
                for query in sorted(PROBES):
                    try:
                        answers.append(client.post("/search", json={"query": query, "top_k": 1}))
                    except httpx.HTTPError as exc:
                        answers.append(exc)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)


def test_a_new_current_and_admin_changes_reach_every_process(watched: tuple[Served, Path]) -> None:
    server, root = watched
    set_current(root, "v1")  # where this test starts, whatever ran on this server before
    wait_for(lambda: {s["version"] for s in _processes(server.client)} == {"v1"}, "v1 in every process")
    with under_load(server.url) as answers:
        _, pids = _search_everywhere(server.url, version="v1")

        set_current(root, "v2")  # every process's own watcher follows the root
        wait_for(lambda: {s["version"] for s in _processes(server.client)} == {"v2"}, "v2 in every process")
        _, pids = _search_everywhere(server.url, version="v2")
        assert len(pids) == PROCESSES

        response = server.client.post("/admin/reload", json={"path": str(root / "v1")}, headers=AUTH)
        assert response.status_code == 200, response.text  # answered once every process serves it
        outcome = response.json()
        assert outcome["current"]["version"] == "v1"
        assert sorted(str(p["pid"]) for p in outcome["processes"]) == sorted(pids)
        assert {p["version"] for p in outcome["processes"]} == {"v1"}
        _, pids = _search_everywhere(server.url, version="v1")
        assert len(pids) == PROCESSES

        response = server.client.post("/admin/rollback", headers=AUTH)
        assert response.status_code == 200, response.text
        assert {p["version"] for p in response.json()["processes"]} == {"v2"}
        _, pids = _search_everywhere(server.url, version="v2")
        assert len(pids) == PROCESSES
        assert _metric(server.client, "tandem_index_info", version="v2") == PROCESSES
        assert _metric(server.client, "tandem_index_info", version="v1") == 0
    # Not one request failed across three changes in two processes, under load.
    assert answers, "the load ran"
    assert _failed(answers) == []
    assert {a.json()["index"]["version"] for a in answers if isinstance(a, httpx.Response)} == {"v1", "v2"}


def test_a_mismatched_student_is_refused_before_any_worker_starts(mini_bundle: Path, mini_student: Path,
                                                                  tmp_path: Path) -> None:
    """Forked warm (tests/fixtures/service_fast.py): the check runs in the process `tandem serve` starts in, before it
    starts a worker, so no worker is spawned from the fork either way."""
    student = altered_student(mini_student, tmp_path / "student", {"fingerprint": "0" * 64})
    result = service_fast.run(["serve", *_serve_args(mini_bundle, student), "--port", str(free_port())], env=_env())
    assert result.returncode == 2, result.stderr
    assert "fingerprint" in result.stderr
    assert "Traceback" not in result.stderr
    assert "server processes" not in result.stderr and "Started parent process" not in result.stderr


@pytest.mark.parametrize("watched", ["1"], indirect=True)  # the supervisor's part: one TANDEM_WORKERS is enough
def test_replaced_workers_catch_up_and_totals_keep_adding_up(watched: tuple[Served, Path]) -> None:
    """CURRENT says v1 and an admin reload serves v2: a worker that replaces a killed one, and every worker SIGHUP
    brings in, starts on the admin's v2 (not on CURRENT's v1), and the killed worker's requests still count.
    The runtime directory's removal with the supervisor: the `watched` fixture's end."""
    server, root = watched
    set_current(root, "v1")  # where this test starts, whatever ran on this server before
    wait_for(lambda: {s["version"] for s in _processes(server.client)} == {"v1"}, "v1 in every process")
    ok = {"route": "/search", "method": "POST", "status": "200"}
    counted = _settled_count(server.client, "tandem_http_requests_total", **ok)
    response = server.client.post("/admin/reload", json={"path": str(root / "v2")}, headers=AUTH)
    assert response.status_code == 200, response.text
    made, pids = _search_everywhere(server.url, version="v2")
    assert len(pids) == PROCESSES
    # Counted just after each answer is sent: wait for that before killing the worker that sent it.
    wait_for(lambda: _metric(server.client, "tandem_http_requests_total", **ok) == counted + made,
             "all requests counted")
    victim = int(sorted(pids)[0])
    os.kill(victim, signal.SIGKILL)  # the supervisor replaces it; the new one starts on the admin's v2
    # From here on, a fresh connection each time: the shared client's may have been the victim's.

    wait_for(lambda: _replaced(server.url, {victim}), "a replacement worker serving the admin's v2")
    more, pids = _search_everywhere(server.url, version="v2")
    assert len(pids) == PROCESSES and str(victim) not in pids
    wait_for(lambda: _scrape_each(server.url, "tandem_http_requests_total", **ok) == [counted + made + more] * SCRAPES,
             "the dead worker's requests still counted, by every worker")
    # The dead worker's live gauge is gone: the two live ones serve v2.
    assert _scrape_each(server.url, "tandem_index_info", version="v2") == [PROCESSES] * SCRAPES
    assert _scrape_each(server.url, "tandem_index_info", version="v1") == [0] * SCRAPES

    # SIGHUP: uvicorn's supervisor replaces every worker, one by one; the new ones start on v2 as well. Clients
    # searching all along get every answer: none is dropped by a worker as it stops.
    with under_load(server.url) as answers:
        for _ in range(2):
            old = {s["pid"] for s in _fresh_processes(server.url)}
            os.kill(server.pid, signal.SIGHUP)
            wait_for(lambda: _replaced(server.url, old), "every worker replaced, serving v2")  # noqa: B023
    assert answers, "the load ran"
    assert _failed(answers) == []
    # A retired worker leaves the process list as it starts to drain; its live gauge goes once the supervisor has
    # joined it and buried it, after the whole SIGHUP round: wait for that, then only the two new ones count.
    wait_for(lambda: _scrape_each(server.url, "tandem_index_info", version="v2") == [PROCESSES] * SCRAPES,
             "the retired workers' live gauges dropped: the two new ones serve v2")
    _search_everywhere(server.url, version="v2")
    # Left as found: CURRENT names what every process serves (a later set_current(root, "v1") is a change again).
    set_current(root, "v2")


@pytest.mark.parametrize("watched", ["1"], indirect=True)  # the HTTP layer's part: TANDEM_WORKERS plays no role
def test_settings_and_hardening_reach_every_worker(watched: tuple[Served, Path]) -> None:
    """The watched server's query limit and header and body deadlines (set in its environment, pickled into each
    worker with the rest of the settings) hold in every worker: each refuses a query over the limit, and cuts off a
    client trickling its headers or its body, whichever worker took the connection. Once, on TANDEM_WORKERS 1: the
    limit is the search route's (a 422 before any batch) and the deadlines uvicorn's protocol's, neither of which
    TANDEM_WORKERS (the batcher's threads) reaches."""
    server, _ = watched
    too_long: dict[str, object] = {"query": "ocean tides " * 10}
    assert len(str(too_long["query"])) > MAX_QUERY_CHARS
    pids: set[str] = set()
    for _ in range(ROUNDS):
        for response in post_together(server.url, [too_long] * 10):
            assert response.status_code == 422, response.text
            pids.add(response.headers["X-Tandem-Process"])
        if len(pids) == PROCESSES:
            break
    assert len(pids) == PROCESSES
    socks = [_trickler(server.url, body=i % 2 == 1) for i in range(4 * PROCESSES)]
    try:
        assert all(_closed_by_server(sock) for sock in socks)  # the guarded protocol, in whichever worker
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("workers", ["1", "0"])
def test_admission_holds_in_every_worker_and_refusals_add_up(tiny_bundle: Path, tiny_student: Path,
                                                             tmp_path: Path, workers: str) -> None:
    """The real models: LONG_BATCH must take long enough to encode that a burst overlaps it. Each worker admits one
    LONG_BATCH at a time (max_pending is per process): a burst is shed with 429 and
    Retry-After, and the refusals, wherever they happened, add up in /metrics.

    A burst overlaps a running batch only if its requests arrive while the batch runs. With workers 0 a process
    reads nothing during a batch, and the tiny model's batch is short: if the clients' threads spread the burst
    thinner than that, every request finds the queue empty. So bursts repeat, a few at most, until one is shed.

    The supervisor is forked warm (tests/fixtures/service_fast.py: it skips its own imports; its workers fork from its
    forkserver as users' do); the watched server of TANDEM_WORKERS 1 starts as users start it, and both
    watched servers check that forkserver."""
    window = str(len(LONG_BATCH))
    with serving(tiny_bundle, tiny_student, tmp_path / "serve.log", service_fast.start, TANDEM_MAX_PENDING=window,
                 TANDEM_MAX_BATCH_QUERIES=window, TANDEM_REQUEST_TIMEOUT_MS="60000",
                 TANDEM_MAX_QUEUE_MS="60000", TANDEM_WORKERS=workers) as server:
        responses: list[httpx.Response] = []
        for _ in range(BURSTS):
            responses += post_together(server.url, [{"queries": LONG_BATCH, "top_k": 1}] * 4 * PROCESSES)
            if any(r.status_code == 429 for r in responses):
                break
        codes = [r.status_code for r in responses]
        assert set(codes) == {200, 429}, codes
        refused = [r for r in responses if r.status_code == 429]
        for response in refused:
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"] == "overloaded"
        for response in responses:
            if response.status_code == 200:
                assert len(response.json()["results"]) == len(LONG_BATCH)
        wait_for(lambda: _metric(server.client, "tandem_http_requests_total", route="/search") == len(responses),
                 "every request counted")
        assert _metric(server.client, "tandem_overloaded_total") == len(refused)
        assert _metric(server.client, "tandem_http_requests_total", route="/search", status="429") == len(refused)
