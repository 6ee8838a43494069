"""`tandem loadtest` against a real server (the service over the mini bundle and student: what is counted is requests,
not answers), and its input checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.errors import InputError
from tandem.loadtest import parse_budget, read_queries, run_loadtest
from tests.fixtures.server import LiveServer


def test_open_loop_run_counts_every_scheduled_request(mini_server: LiveServer) -> None:
    report = run_loadtest(mini_server.url, rps=20, duration_s=1.0, queries=["ocean tides"], budget={"errors": 0})
    assert report.sent == 20
    assert report.status == {"200": 20} and report.errors == {}
    assert report.completed == 20 and report.achieved_rps == 20.0
    assert set(report.latency_ms) == {"p50", "p90", "p99", "p99.9", "max"}
    assert report.latency_ms["p50"] <= report.latency_ms["p99"] <= report.latency_ms["max"]
    assert report.budget_missed == []


def test_an_impossible_budget_is_reported_missed(mini_server: LiveServer) -> None:
    report = run_loadtest(mini_server.url, rps=5, duration_s=0.4, queries=["tides"], budget={"p50": 0.0})
    assert report.budget_missed and report.budget_missed[0].startswith("p50: ")


def test_unreachable_server_is_counted_as_errors_not_latency() -> None:
    report = run_loadtest("http://127.0.0.1:9", rps=5, duration_s=0.4, queries=["tides"], budget={"errors": 0})
    assert report.completed == 0 and sum(report.errors.values()) == 2
    assert report.budget_missed == ["errors: 2 > 0"]


def test_budget_parsing() -> None:
    assert parse_budget("p50=5ms, p99=25ms,max=1s,errors=0") == {"p50": 5.0, "p99": 25.0, "max": 1000.0,
                                                                  "errors": 0.0}
    with pytest.raises(InputError, match="'p42=5ms'"):
        parse_budget("p42=5ms")


def test_queries_file_beir_or_plain_and_bad_lines_named(tmp_path: Path) -> None:
    beir = tmp_path / "queries.jsonl"
    beir.write_text('{"_id": "1", "text": "first"}\n\n{"_id": "2", "text": "second"}\n')
    assert read_queries(beir) == ["first", "second"]
    plain = tmp_path / "queries.txt"
    plain.write_text("alpha\n beta \n")
    assert read_queries(plain) == ["alpha", "beta"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": ""}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl:2"):
        read_queries(bad)
