"""API keys, body size limits, CORS and error hygiene, over a real uvicorn server, on the tiny models
(tests/fixtures/tiny_service.py)."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from models.errors import InputError
from service.http.app import create_app
from service.runtime.logs import make_handler
from service.settings import ServiceSettings
from tests.fixtures.server import LiveServer, serve_app

pytestmark = pytest.mark.slow

FILE_KEYS = ["file-key-0123456789", "file-key-abcdefghij"]
ENV_KEYS = ["env-key-0123456789", "env-key-abcdefghij"]
BODY_LIMIT = 4096
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def keyed(mini_bundle: Path, mini_student: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Keys from a file and from TANDEM_API_KEYS, a small body limit and one CORS origin."""
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    keys_file.write_text(f"# rotated monthly\n{FILE_KEYS[0]}\n\n   {FILE_KEYS[1]}   \n# {ENV_KEYS[0]}-commented\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TANDEM_API_KEYS", ",".join(ENV_KEYS))
        mp.setenv("TANDEM_API_KEYS_FILE", str(keys_file))
        mp.setenv("TANDEM_MAX_BODY_BYTES", str(BODY_LIMIT))
        mp.setenv("TANDEM_CORS_ORIGINS", f"{ORIGIN}, https://other.example")
        settings = ServiceSettings(index=mini_bundle, student=mini_student)
    with serve_app(create_app(settings)) as server:
        yield server


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_search_without_a_key_is_401_with_a_bearer_challenge(keyed: LiveServer) -> None:
    for headers in ({}, {"Authorization": f"Basic {FILE_KEYS[0]}"}, {"Authorization": "Bearer"}):
        response = keyed.client.post("/search", json={"query": "ocean tides"}, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["error"] == "unauthorized"


def test_search_with_a_wrong_key_is_403_and_logged_without_the_key(keyed: LiveServer) -> None:
    stream = io.StringIO()
    handler = make_handler("json", stream)
    logging.getLogger("service.http.auth").addHandler(handler)
    try:
        for i, key in enumerate(("nope", FILE_KEYS[0] + "x", FILE_KEYS[0][:-1], f"{ENV_KEYS[0]}-commented")):
            response = keyed.client.post("/search", json={"query": "ocean tides"},
                                         headers={**_bearer(key), "X-Request-ID": f"wrong-{i}"})
            assert response.status_code == 403, key
            assert response.json() == {"error": "forbidden", "message": "the API key is not valid"}
    finally:
        logging.getLogger("service.http.auth").removeHandler(handler)
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["request_id"] for e in entries] == [f"wrong-{i}" for i in range(4)]
    assert all(e["level"] == "warning" and "key" in e["message"] for e in entries)
    assert FILE_KEYS[0][:-1] not in stream.getvalue()


@pytest.mark.parametrize("key", FILE_KEYS + ENV_KEYS)
def test_every_configured_key_opens_search(keyed: LiveServer, key: str) -> None:
    response = keyed.client.post("/search", json={"query": "ocean tides and the moon", "top_k": 1},
                                 headers={"Authorization": f"bearer {key}"})  # the scheme is case-insensitive
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1


def test_probes_metrics_and_docs_need_no_key(keyed: LiveServer) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        assert keyed.client.get(path).status_code == 200, path


def test_auth_is_checked_before_the_body_is_parsed(keyed: LiveServer) -> None:
    response = keyed.client.post("/search", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 401


def test_request_limits_still_give_422_behind_auth(keyed: LiveServer) -> None:
    auth = _bearer(ENV_KEYS[1])
    for body in ({"query": "tides", "top_k": 1001}, {"query": "x" * 2049}, {"queries": ["tides"] * 65},
                 {"query": "tides", "top_k": 0}, {"query": ""}):
        response = keyed.client.post("/search", json=body, headers=auth)
        assert response.status_code == 422, str(body)[:80]
        assert response.json()["error"] == "invalid_request"


def test_oversized_content_length_is_413_before_any_body_is_sent(keyed: LiveServer) -> None:
    """The declared length alone decides: the server answers without waiting for the 10 MB."""
    host, port = keyed.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     + b"Authorization: Bearer " + FILE_KEYS[0].encode() + b"\r\nContent-Length: 10000000\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(body)["error"] == "body_too_large"


def test_oversized_chunked_body_is_413_while_streaming(keyed: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"query": "'
        for _ in range(2 * BODY_LIMIT // 512):
            yield b"a" * 512
        yield b'"}'

    response = keyed.client.post("/search", content=chunks(), headers=_bearer(FILE_KEYS[0]))
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"
    assert str(BODY_LIMIT) in response.json()["message"]


def test_chunked_body_under_the_limit_is_served(keyed: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"query": "ocean tides '
        yield b'and the moon", "top_k": 1}'

    response = keyed.client.post("/search", content=chunks(), headers={**_bearer(FILE_KEYS[1]),
                                                                       "Content-Type": "application/json"})
    assert response.status_code == 200
    whole = keyed.client.post("/search", json={"query": "ocean tides and the moon", "top_k": 1},
                              headers=_bearer(FILE_KEYS[1]))
    assert response.json()["results"] == whole.json()["results"]  # the chunks read as the one body


def test_cors_allows_configured_origins_only(keyed: LiveServer) -> None:
    preflight = keyed.client.options("/search", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200  # answered by CORS, outside auth
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    simple = keyed.client.post("/search", json={"query": "tides", "top_k": 1},
                               headers={"Origin": ORIGIN, **_bearer(ENV_KEYS[0])})
    assert simple.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in simple.headers["access-control-expose-headers"].lower()
    refused = keyed.client.post("/search", json={"query": "tides"}, headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in refused.headers


def test_cors_is_off_by_default(mini_server: LiveServer) -> None:
    preflight = mini_server.client.options("/search", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers
    simple = mini_server.client.post("/search", json={"query": "tides", "top_k": 1}, headers={"Origin": ORIGIN})
    assert simple.status_code == 200  # no keys configured: the API is open
    assert "access-control-allow-origin" not in simple.headers


def test_default_body_limit_is_one_mebibyte(mini_server: LiveServer) -> None:
    big = {"query": "x" * (1 << 20)}
    assert mini_server.client.post("/search", json=big).status_code == 413
    assert mini_server.client.post("/search", json={"query": "x" * 5000}).status_code == 422  # length limit


@pytest.mark.parametrize("content", ["", "# only a comment\n\n"])
def test_a_keys_file_without_keys_refuses_to_start(mini_bundle: Path, mini_student: Path, tmp_path: Path,
                                                   content: str) -> None:
    empty = tmp_path / "keys.txt"
    empty.write_text(content)
    with pytest.raises(InputError, match="holds no keys"):
        create_app(ServiceSettings(index=mini_bundle, student=mini_student, api_keys_file=empty))


def test_a_missing_keys_file_refuses_to_start(mini_bundle: Path, mini_student: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="TANDEM_API_KEYS_FILE"):
        create_app(ServiceSettings(index=mini_bundle, student=mini_student, api_keys_file=tmp_path / "absent"))


class _FailingMiddleware:
    """A middleware that breaks after the app answered: the client must still get the generic JSON 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/healthz":
            raise RuntimeError("secret middleware detail")
        await self.app(scope, receive, send)


def test_errors_in_routes_and_middleware_never_leak_a_traceback(mini_bundle: Path, mini_student: Path) -> None:
    app = create_app(ServiceSettings(index=mini_bundle, student=mini_student))

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret route detail")

    app.add_middleware(_FailingMiddleware)  # outermost: outside our request-context middleware
    with serve_app(app, wait_ready=False) as server:
        route = server.client.get("/boom", headers={"X-Request-ID": "boom-1"})
        middleware = server.client.get("/healthz")
    assert route.status_code == 500
    assert route.json() == {"error": "internal", "message": "internal server error"}
    assert route.headers["x-request-id"] == "boom-1"
    assert middleware.status_code == 500
    assert middleware.json() == {"error": "internal", "message": "internal server error"}
    for response in (route, middleware):
        assert "secret" not in response.text and "Traceback" not in response.text


def test_client_errors_are_json_not_html(keyed: LiveServer) -> None:
    for response in (keyed.client.get("/nowhere", headers=_bearer(FILE_KEYS[0])),
                     keyed.client.get("/search", headers=_bearer(FILE_KEYS[0]))):
        assert response.headers["content-type"].startswith("application/json")
        assert set(response.json()) >= {"error", "message"}
    assert httpx.codes.is_client_error(keyed.client.get("/nowhere").status_code)


def test_openapi_declares_the_bearer_scheme_and_the_limits(keyed: LiveServer) -> None:
    schema = keyed.client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["apiKey"] == {
        "type": "http", "scheme": "bearer", "description": "One of the keys in TANDEM_API_KEYS(_FILE)."}
    search = schema["paths"]["/search"]["post"]
    assert search["security"] == [{"apiKey": []}]
    assert {"400", "401", "403", "413", "422", "429", "503"} <= set(search["responses"])
    assert "security" not in schema["paths"]["/healthz"]["get"]
    top_k = schema["components"]["schemas"]["SearchRequest"]["properties"]["top_k"]["anyOf"][0]
    assert top_k["maximum"] == 1000
