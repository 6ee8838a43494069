"""Fail-closed configuration and bounded inputs (issue 24, items 1 and 2), over a real uvicorn server."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from models.errors import InputError
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures import service_fast
from tests.fixtures.server import LiveServer, local_client, serve_app

pytestmark = pytest.mark.slow

TRICKLERS = 200


@pytest.mark.parametrize("value", ["", ",", " , ,"])
def test_api_keys_set_but_empty_refuses_to_start(mini_bundle: Path, mini_student: Path, value: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TANDEM_API_KEYS", value)
        settings = ServiceSettings(index=mini_bundle, student=mini_student)
    with pytest.raises(InputError, match="TANDEM_API_KEYS"):
        create_app(settings)


def test_serve_with_empty_api_keys_exits_naming_the_variable(mini_bundle: Path, mini_student: Path) -> None:
    """What an unset `${VAR}` in a compose file does: `tandem serve` must exit, not serve an open API."""
    env = {**os.environ, "TANDEM_API_KEYS": ","}
    done = service_fast.run(["serve", "--index", str(mini_bundle), "--student", str(mini_student), "--port", "0"],
                            env=env)
    assert done.returncode == 2, done.stderr
    assert "error: TANDEM_API_KEYS is set but holds no key" in done.stderr


def test_a_mebibyte_of_queries_gets_a_small_422_while_healthz_answers(mini_server: LiveServer) -> None:
    body = b'{"queries":[' + b",".join([b"1"] * ((1 << 20) // 2 - 16)) + b"]}"
    assert len(body) <= 1 << 20
    answers: list[httpx.Response] = []

    def post() -> None:
        with local_client(mini_server.url, timeout=60.0) as client:
            answers.append(client.post("/search", content=body, headers={"Content-Type": "application/json"}))

    thread = threading.Thread(target=post)
    thread.start()
    probes = [mini_server.client.get("/healthz").status_code for _ in range(5)]
    thread.join(timeout=60)
    assert probes == [200] * 5
    (response,) = answers
    assert response.status_code == 422
    assert len(response.content) < 4096
    assert response.json()["details"][0]["field"] == "body"  # the value cap, on the bytes, before json.loads
    assert "values, at most" in response.json()["message"]


def test_item_errors_are_capped(mini_server: LiveServer) -> None:
    response = mini_server.client.post("/search", json={"queries": [1] * 60})
    assert response.status_code == 422
    details = response.json()["details"]
    assert len(details) <= 11
    assert details[-1]["message"] == "and 50 more problems"


def test_total_hits_per_request_are_bounded(mini_server: LiveServer) -> None:
    response = mini_server.client.post("/search", json={"queries": ["tides"] * 20, "top_k": 1000})
    assert response.status_code == 422
    assert "TANDEM_MAX_TOTAL_HITS" in response.json()["message"]
    ok = mini_server.client.post("/search", json={"queries": ["tides"] * 10, "top_k": 1000})
    assert ok.status_code == 200
    assert len(ok.json()["results"]) == 10


def test_settings_bound_keep_versions_and_batch_size(mini_bundle: Path, mini_student: Path) -> None:
    with pytest.raises(InputError, match="TANDEM_KEEP_VERSIONS"):
        ServiceSettings(index=mini_bundle, student=mini_student, keep_versions=100)
    with pytest.raises(InputError, match="TANDEM_MAX_BATCH_QUERIES"):
        ServiceSettings(index=mini_bundle, student=mini_student, max_batch_queries=5000, max_pending=10_000)


@pytest.fixture(scope="module")
def strict_timeouts(mini_bundle: Path, mini_student: Path) -> Iterator[LiveServer]:
    settings = ServiceSettings(index=mini_bundle, student=mini_student, header_timeout_s=1.0, body_timeout_s=1.0)
    with serve_app(create_app(settings)) as server:
        yield server


def _connect(url: str) -> socket.socket:
    """A bare connection to the server at `url` (http://HOST:PORT)."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _trickler(url: str, body: bool) -> socket.socket:
    sock = _connect(url)
    if body:  # complete headers, then a body that never arrives
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"query\":")
    else:  # headers that never end
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server hangs up (EOF or reset); False if the socket is still open after its timeout."""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_trickling_clients_neither_block_search_nor_hold_connections(strict_timeouts: LiveServer) -> None:
    socks = [_trickler(strict_timeouts.url, body=i % 2 == 1) for i in range(TRICKLERS)]
    try:
        response = strict_timeouts.client.post("/search", json={"query": "ocean tides", "top_k": 1})
        assert response.status_code == 200
        assert all(_closed_by_server(sock) for sock in socks[:10] + socks[-10:])
    finally:
        for sock in socks:
            sock.close()
    assert strict_timeouts.client.get("/healthz").status_code == 200


def _refused(url: str) -> bool:
    try:
        _connect(url).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_request_sent_as_the_server_shuts_down_is_answered(mini_bundle: Path, mini_student: Path) -> None:
    """uvicorn closes a connection with no request in flight as soon as it shuts down, so a request already on its way
    got a connection reset (a worker replaced by `kill -HUP` did this to its clients). Now a connection accepted
    before the shutdown may still send one within the grace: it is answered, then closed; a silent one is closed."""
    # The grace is the window between the server's shutdown and the late request (a poll of 50 ms here, so 2 s is a
    # wide margin); the silent connection is closed only when it ends, and the test waits for that, so it is no longer.
    settings = ServiceSettings(index=mini_bundle, student=mini_student, shutdown_grace_s=2.0)
    with serve_app(create_app(settings)) as live:
        late, silent = _connect(live.url), _connect(live.url)
        try:
            # Answered on a later connection: the loop has accepted the two before it (it accepts in order).
            with local_client(live.url, timeout=30.0) as client:
                assert client.get("/healthz").status_code == 200
            live.server.should_exit = True
            deadline = time.monotonic() + 30
            while not _refused(live.url):  # the server has stopped listening: its shutdown has begun
                assert time.monotonic() < deadline, "the server did not stop listening"
                time.sleep(0.05)
            late.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while chunk := late.recv(65536):
                answer += chunk
            head = answer.split(b"\r\n\r\n", 1)[0].lower()
            assert head.startswith(b"http/1.1 200"), answer
            assert b"connection: close" in head, answer
            assert _closed_by_server(silent)
        finally:
            late.close()
            silent.close()


def test_openapi_states_the_batch_bound(mini_server: LiveServer) -> None:
    schema = json.loads(mini_server.client.get("/openapi.json").content)
    queries = schema["components"]["schemas"]["SearchRequest"]["properties"]["queries"]
    assert any(branch.get("maxItems") == 64 for branch in queries.get("anyOf", [queries]))


def test_tandem_serve_applies_the_timeouts(mini_bundle: Path, mini_student: Path) -> None:
    """The real entry point: `tandem serve` runs uvicorn with the header deadline and answers searches."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "TANDEM_HEADER_TIMEOUT_S": "1"}
    server = service_fast.start(["serve", "--index", str(mini_bundle), "--student", str(mini_student), "--port",
                                 str(port)], env, Path(os.devnull))
    url = f"http://127.0.0.1:{port}"
    try:
        with local_client(url, timeout=30.0) as client:
            for _ in range(1200):
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert server.poll() is None, "tandem serve exited"
                threading.Event().wait(0.1)
            assert client.post("/search", json={"query": "ocean tides", "top_k": 1}).status_code == 200
        sock = _trickler(url, body=False)
        with sock:
            assert _closed_by_server(sock)
    finally:
        service_fast.stop(server, signal.SIGTERM)
