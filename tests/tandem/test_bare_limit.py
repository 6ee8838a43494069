"""The bare-limit bookkeeping of bench/serving/serve_load.py: settings mirrored from the server's, and the ratio read
beside it. Why: a wrong override or ratio would misstate what share of the machine the server delivers.
The measurement itself needs a student and a quiet machine (bench/serving/bare_limit.py), not the test suite."""

from __future__ import annotations

import argparse

import pytest

from bench.harness.servers import Step, judge
from bench.serving.bare_limit import BareLimit, settings_overrides
from bench.serving.serve_load import Config, limit_lines
from tandem.loadtest import LoadReport


def _step(rps: float, p99: float) -> Step:
    report = LoadReport(url="http://x", target_rps=rps, duration_s=1.0, sent=int(rps), completed=int(rps),
                        achieved_rps=rps, latency_ms={"p50": p99 / 2, "p99": p99}, status={"200": int(rps)},
                        errors={})
    return judge(report, 50.0)


def _bare(qps: float) -> BareLimit:
    return BareLimit(workers=2, duration_s=1.0, queries=int(qps), qps=qps, query_p50_ms=5.0, query_p99_ms=9.0,
                     worker_rss_mb=100.0, top_k=10, oversample=4, encode_threads=1, search_threads=1,
                     precision="int8")


def test_overrides_are_the_servers_variables_without_prefix() -> None:
    got = settings_overrides({"TANDEM_BINARY_OVERSAMPLE": "8", "TANDEM_SEARCH_THREADS": "1", "OTHER": "x"})
    assert got == {"binary_oversample": "8", "search_threads": "1"}


def test_ratio_is_sustained_over_bare() -> None:
    config = Config(100, "flat", "binary", steps=[_step(100, 10), _step(200, 40), _step(400, 90)], bare=_bare(400.0))
    assert config.sustained is not None and config.sustained.rps == 200
    assert config.ratio == pytest.approx(0.5)
    assert Config(100, "flat", "binary", steps=[_step(100, 90)]).ratio is None  # no passing step


def test_ratio_reads_the_mean_of_the_limits_that_bracket_the_ladder() -> None:
    config = Config(100, "flat", "binary", steps=[_step(300, 10)], bare=_bare(400.0), bare_after=_bare(600.0))
    assert config.bare_qps == pytest.approx(500.0) and config.ratio == pytest.approx(0.6)
    args = argparse.Namespace(p99_ms=50.0, bare_duration=15.0, bare_warmup=3.0, half_duration=15.0,
                              half_p99_ms=25.0)
    row = next(line for line in limit_lines([config], args) if line.startswith("| 100 |"))
    assert "| 400.0 (2) | 600.0 |" in row and "| 0.600 |" in row


def test_limit_table_names_each_config() -> None:
    config = Config(100, "flat", "binary", steps=[_step(100, 10)], bare=_bare(400.0), half=_step(200, 12))
    args = argparse.Namespace(p99_ms=50.0, bare_duration=15.0, bare_warmup=3.0, half_duration=15.0,
                              half_p99_ms=25.0)
    row = next(line for line in limit_lines([config], args) if line.startswith("| 100 |"))
    assert "400.0 (2) | — |" in row and "0.25" in row and "| 200 |" in row
    assert limit_lines([Config(100, "flat", "binary")], args) == []
