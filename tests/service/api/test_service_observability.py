"""/metrics, request ids and structured logs, over a real uvicorn server (and one real `tandem serve`)."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.http.app import create_app
from service.runtime.logs import make_handler
from service.settings import ServiceSettings
from tests.fixtures import service_fast
from tests.fixtures.corpus import LONG_BATCH
from tests.fixtures.server import READY_TIMEOUT_S, LiveServer, local_client, post_together, serve_app
from tests.fixtures.tiny_service import MINI_DIM, build_mini

pytestmark = pytest.mark.slow

NAMED_METRICS = {
    "tandem_stage_duration_seconds", "tandem_http_requests", "tandem_overloaded", "tandem_queue_depth",
    "tandem_index_info", "tandem_index_documents", "tandem_index_load_seconds", "tandem_reloads",
}


def _samples(server: LiveServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = server.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_exposes_the_named_families_and_the_index(mini_server: LiveServer, mini_bundle: Path) -> None:
    text = mini_server.client.get("/metrics").text
    families = {family.name for family in text_string_to_metric_families(text)}
    assert families >= NAMED_METRICS
    samples = _samples(mini_server)
    assert _value(samples, "tandem_index_info", version=mini_bundle.name) == 1
    assert _value(samples, "tandem_index_documents") == 20
    assert _value(samples, "tandem_index_load_seconds") > 0
    assert ("tandem_queue_depth", frozenset()) in samples  # read from the batcher at scrape time


def test_a_search_is_counted_and_timed_per_stage(mini_server: LiveServer) -> None:
    before = _samples(mini_server)
    response = mini_server.client.post("/search", json={"query": "ocean tides and the moon", "top_k": 3})
    assert response.status_code == 200
    bad = mini_server.client.post("/search", json={"query": "tides", "top_k": 0})
    assert bad.status_code == 422
    after = _samples(mini_server)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("tandem_http_requests_total", route="/search", method="POST", status="200") == 1
    assert delta("tandem_http_requests_total", route="/search", method="POST", status="422") == 1
    for stage in ("queue", "tokenize", "encode", "search"):
        assert delta("tandem_stage_duration_seconds_count", stage=stage) == 1, stage
    assert delta("tandem_stage_duration_seconds_count", stage="total") == 2  # the 422 took time too
    assert delta("tandem_stage_duration_seconds_count", stage="rescore") == 0  # float bundle: no rescoring


def test_unknown_paths_share_one_label(mini_server: LiveServer) -> None:
    for i in range(3):
        assert mini_server.client.get(f"/no/such/path/{i}").status_code == 404
    samples = _samples(mini_server)
    assert _value(samples, "tandem_http_requests_total", route="unmatched", method="GET", status="404") >= 3
    assert not any("/no/such" in dict(labels).get("route", "") for _, labels in samples)


def test_binary_bundles_time_the_rescoring(tiny_corpus: Path, mini_student: Path, mini_bundle: Path,
                                           mini_teacher: Path, tmp_path: Path) -> None:
    binary = build_mini(tiny_corpus, tmp_path / "binary", mini_teacher, dim=MINI_DIM, quantization="binary")
    with serve_app(create_app(ServiceSettings(index=binary, student=mini_student))) as server:
        before = _value(_samples(server), "tandem_stage_duration_seconds_count", stage="rescore")
        assert server.client.post("/search", json={"query": "ocean tides", "top_k": 2}).status_code == 200
        after = _value(_samples(server), "tandem_stage_duration_seconds_count", stage="rescore")
    assert after - before == 1


def test_429s_are_counted(tiny_bundle: Path, tiny_student: Path) -> None:
    # the real student: LONG_BATCH must take long enough to encode that the burst overlaps
    settings = ServiceSettings(index=tiny_bundle, student=tiny_student, workers=1, max_pending=len(LONG_BATCH),
                               max_batch_queries=len(LONG_BATCH))
    with serve_app(create_app(settings)) as server:
        codes = [r.status_code for r in post_together(server.url, [{"queries": LONG_BATCH, "top_k": 1}] * 6)]
        samples = _samples(server)
    refused = codes.count(429)
    assert refused >= 1, codes
    assert _value(samples, "tandem_overloaded_total") == refused
    assert _value(samples, "tandem_http_requests_total", route="/search", method="POST", status="429") == refused


def test_request_id_is_echoed_generated_or_replaced(mini_server: LiveServer) -> None:
    echoed = mini_server.client.get("/healthz", headers={"X-Request-ID": "abc-123.def_456:7"})
    assert echoed.headers["x-request-id"] == "abc-123.def_456:7"
    generated = {mini_server.client.get("/healthz").headers["x-request-id"] for _ in range(2)}
    assert len(generated) == 2 and all(len(rid) == 32 for rid in generated)
    for bad in ("has space", "x" * 65, "quote\"", "<script>", "é"):
        replaced = mini_server.client.get("/healthz", headers={"X-Request-ID": bad.encode("utf-8")})
        assert replaced.headers["x-request-id"] not in (bad, ""), bad
    refused = mini_server.client.post("/search", json={"top_k": "ten"}, headers={"X-Request-ID": "on-a-422"})
    assert refused.status_code == 422 and refused.headers["x-request-id"] == "on-a-422"


@pytest.fixture
def access_lines() -> Iterator[io.StringIO]:
    """tandem.access records through the real JSON formatter, into a buffer."""
    stream = io.StringIO()
    handler = make_handler("json", stream)
    logger = logging.getLogger("tandem.access")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_access_log_is_json_with_the_request_id(mini_server: LiveServer, access_lines: io.StringIO) -> None:
    response = mini_server.client.post("/search", json={"query": "tides", "top_k": 1},
                                       headers={"X-Request-ID": "log-me-1"})
    assert response.status_code == 200
    entries = [json.loads(line) for line in access_lines.getvalue().splitlines()]
    mine = [e for e in entries if e["request_id"] == "log-me-1"]
    assert len(mine) == 1
    entry = mine[0]
    assert {"time", "level", "logger", "message"} <= set(entry)
    assert (entry["logger"], entry["level"]) == ("tandem.access", "info")
    assert (entry["method"], entry["path"], entry["status"]) == ("POST", "/search", 200)
    assert isinstance(entry["duration_ms"], float) and entry["duration_ms"] >= 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_tandem_serve_logs_json_by_default(mini_bundle: Path, mini_student: Path, tandem_home: Path,
                                           tmp_path: Path) -> None:
    """The real command: JSON lines on stderr, access lines tagged with the request id, keys from the env."""
    port = _free_port()
    env = {**os.environ, "TANDEM_API_KEYS": "cli-key-0123456789", "OMP_NUM_THREADS": "1"}
    env.pop("TANDEM_LOG_FORMAT", None)
    stderr = tmp_path / "stderr"
    proc = service_fast.start(["serve", "--index", str(mini_bundle), "--student", str(mini_student), "--port",
                               str(port)], env, tmp_path / "stdout", stderr=stderr)
    try:
        with local_client(f"http://127.0.0.1:{port}", timeout=30.0) as client:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            assert client.post("/search", json={"query": "tides"}).status_code == 401
            ok = client.post("/search", json={"query": "tides", "top_k": 1},
                             headers={"Authorization": "Bearer cli-key-0123456789", "X-Request-ID": "cli-1"})
            assert ok.status_code == 200
    finally:
        service_fast.stop(proc)
    lines = [line for line in stderr.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is JSON, uvicorn's own included
    assert any(e["logger"].startswith("uvicorn") for e in entries)
    access = [e for e in entries if e["logger"] == "tandem.access" and e["request_id"] == "cli-1"]
    assert [(e["method"], e["path"], e["status"]) for e in access] == [("POST", "/search", 200)]


def test_text_format_and_exceptions_keep_the_request_id() -> None:
    """The formatters themselves, on records logged inside a request's context."""
    from service.runtime.logs import request_id_var

    text, structured = io.StringIO(), io.StringIO()
    logger = logging.getLogger("tests.logs")
    handlers = [make_handler("text", text), make_handler("json", structured)]
    for handler in handlers:
        logger.addHandler(handler)
    token = request_id_var.set("ctx-7")
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("failed %s", "here", exc_info=True, extra={"batch": 3})
    finally:
        request_id_var.reset(token)
        for handler in handlers:
            logger.removeHandler(handler)
    assert "[ctx-7]: failed here" in text.getvalue()
    entry = json.loads(structured.getvalue())
    assert (entry["request_id"], entry["message"], entry["batch"]) == ("ctx-7", "failed here", 3)
    assert "ValueError: boom" in entry["exception"]
