"""Serving settings A/B: the same open-loop rates against `tandem serve` started with each variant.

Why: the issue asks to measure each serving change and keep only what helps. A variant is a set of
`TANDEM_*` settings; each one serves the same bundle, gets a warm-up, then each rate in turn, on a
fresh server. Besides latency and 429s, the CPU each side spends per request is read (the server's
from /proc/PID/stat, the generator's from os.times()): on 2 shared cores, CPU per request is what
bounds throughput, and it is less noisy than a latency percentile.

    python -m bench.serving.serve_settings --student .tandem/students/scifact-full \
        --variant default= --variant 'count-only=TANDEM_MAX_QUEUE_MS=1e9' \
        --variant 'batch8=TANDEM_BATCH_MAX_QUERIES=8' --variant '1x2threads=TANDEM_WORKERS=1,TANDEM_ENCODE_THREADS=2'
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.encoding.encode_latency import DEFAULT_SCIFACT, load_queries
from bench.harness.record import (
    REPO,
    LoadSpan,
    command_line,
    machine,
    parse_with_output,
    publish,
    start_logging,
)
from bench.harness.servers import cpu_seconds, stop
from bench.serving.serve_load import Server
from tandem.loadtest import LoadReport, format_report, run_loadtest

log = logging.getLogger("bench.serve_settings")

SECTION = "serve-settings"


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Variant:
        """`NAME=TANDEM_A=1,TANDEM_B=2`, or `NAME=` for the defaults."""
        name, _, settings = text.partition("=")
        pairs = [item.split("=", 1) for item in settings.split(",") if item]
        if not name or any(len(pair) != 2 or not pair[0].startswith("TANDEM_") for pair in pairs):
            raise SystemExit(f"--variant {text!r}: expected NAME=TANDEM_X=VALUE[,TANDEM_Y=VALUE] or NAME=")
        return cls(name, dict(pairs))


@dataclass(frozen=True)
class Run:
    variant: Variant
    report: LoadReport
    server_cpu_ms: float  # per request answered (any status)
    client_cpu_ms: float


def measure(server: Server, variant: Variant, rps: float, duration: float, queries: list[str]) -> Run:
    server_before, client_before = cpu_seconds(server.process.pid), os.times()
    report = run_loadtest(server.url, rps, duration, queries, {}, top_k=10)
    client_after = os.times()
    answered = max(sum(report.status.values()), 1)
    server_ms = (cpu_seconds(server.process.pid) - server_before) * 1e3 / answered
    client_ms = ((client_after.user - client_before.user) + (client_after.system - client_before.system)) * 1e3
    run = Run(variant, report, server_ms, client_ms / max(report.sent, 1))
    log.info("%s: %s | server CPU %.2f ms/request", variant.name, format_report(report).replace("\n", " | "),
             run.server_cpu_ms)
    return run


def render(runs: list[Run], command: str, setup: str, load: str) -> str:
    import onnxruntime

    lines = [
        "# Serving settings, side by side", "", f"Command: `{command}`", "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {machine()} (server and load generator share them); "
        f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}; load average {load}",
        f"- Setup: {setup}", "",
        "| variant | settings | rps | achieved 2xx rps | p50 ms | p99 ms | 429/503 | server CPU ms/request "
        "| generator CPU ms/request |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        r = run.report
        refused = sum(n for code, n in r.status.items() if code in ("429", "503"))
        settings = ", ".join(f"{k}={v}" for k, v in run.variant.env.items()) or "defaults"
        lines.append(f"| {run.variant.name} | {settings} | {r.target_rps:g} | {r.achieved_rps:.1f} "
                     f"| {r.latency_ms.get('p50', float('nan')):.1f} | {r.latency_ms.get('p99', float('nan')):.1f} "
                     f"| {refused} | {run.server_cpu_ms:.2f} | {run.client_cpu_ms:.2f} |")
    lines += ["", "Server CPU is per request answered, 429s included; latencies are of 2xx answers, from the "
              "scheduled send."]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The same open-loop rates against several server settings.")
    parser.add_argument("--student", type=Path, required=True, help="Exported student directory (int8 served).")
    parser.add_argument("--index", type=Path, default=REPO / ".tandem/bench/serve/n100000/bundle-flat-binary",
                        help="Bundle to serve (default: serve_load.py's 100k flat-binary one).")
    parser.add_argument("--variant", action="append", type=Variant.parse, default=[],
                        help="NAME=TANDEM_X=VALUE[,...] (repeatable); NAME= for the defaults.")
    parser.add_argument("--rates", default="140,280", help="Comma-separated rps, each a run of --duration s.")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--queries", type=Path, default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)))
    parser.add_argument("--rest", type=float, default=2.0, help="Seconds between runs.")
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging()
    if not (args.index / "manifest.json").is_file():
        log.error("%s is not a bundle; build it with bench/serving/serve_load.py or `tandem index build`", args.index)
        return 2
    variants = args.variant or [Variant("default", {})]
    queries, described = load_queries(args.queries, 10_000)
    span = LoadSpan()
    runs: list[Run] = []
    for variant in variants:
        for rps in (float(r) for r in args.rates.split(",")):
            server = Server(args.index, args.student, variant.env, REPO / ".tandem/bench" / f"ab-{variant.name}.log")
            try:
                run_loadtest(server.url, 10, 2, queries, {})  # warm-up
                runs.append(measure(server, variant, rps, args.duration, queries))
            finally:
                stop(server.process)
            time.sleep(args.rest)
    command = command_line()
    setup = (f"`tandem serve` of `{os.path.relpath(args.index, REPO)}` with the int8 student `{args.student.name}`, "
             f"a fresh server per variant and rate, warmed up with 20 requests; open-loop runs of "
             f"{args.duration:g} s; queries: {described}; top_k 10.")
    section = render(runs, command, setup, span.text())
    publish(args.lab, SECTION, section, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
