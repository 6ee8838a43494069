"""Does the work a server does between two encodes slow the encode itself?

Why: the int8 student spent about 0.2 ms more CPU per query inside `tandem serve` than in the bare-limit loop
(docs/lab/2026-11-25-gc-pauses.md), and that difference alone is most of what keeps the server
under the bare limit. In the loop a process encodes back to back on a core of its own; in a server the HTTP
path, the other server process and the load generator run between two encodes and take over the core's caches.
This measures the encode's CPU time (`time.thread_time`, so waiting for the core is not counted) in one process,
one thread, with nothing, a request's worth of Python, or a sweep through more memory than a core's L2 cache
run before each encode. The three take turns in blocks, so a machine that drifts moves them alike.

    python -m bench.encoding.encode_interference --student .tandem/students/scifact-full
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.encoding.encode_latency import DEFAULT_SCIFACT, load_queries
from bench.harness.record import LoadSpan, add_output_args, command_line, cpu_line, publish, start_logging
from models.encoders.student import StudentEncoder

log = logging.getLogger("bench.encode_interference")

SECTION = "encode-interference"


def python_work() -> Callable[[], None]:
    """About a request's worth of Python: JSON round trips of a ten-hit answer (the app costs 0.16-0.19 ms)."""
    answer = {"results": [{"id": str(i), "score": 0.5, "title": "t" * 40, "text": "x" * 600} for i in range(10)],
              "index": {"version": "v", "count": 1}, "timing_ms": {"queue": 0.1, "encode": 1.5, "search": 0.3}}

    def run() -> None:
        for _ in range(6):
            json.loads(json.dumps(answer))
    return run


def sweep(mib: int) -> Callable[[], None]:
    """Touch one float in every 64-byte line of `mib` MiB: what a neighbour on the core leaves in its caches."""
    buffer = np.zeros(mib * 1024 * 1024 // 8)

    def run() -> None:
        buffer[::8] += 1.0
    return run


def measure(encoder: StudentEncoder, queries: Sequence[str], before: dict[str, Callable[[], None] | None],
            rounds: int, block: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Encode CPU ms per query under each condition, in `rounds` of blocks; and each condition's own cost in ms."""
    costs = {}
    for name, work in before.items():
        if work is not None:
            began = time.thread_time()
            for _ in range(block):
                work()
            costs[name] = (time.thread_time() - began) / block * 1e3
    for query in queries[:20]:  # warm-up
        encoder.encode_counted([query], batch_size=1)
    times: dict[str, list[float]] = {name: [] for name in before}
    i = 0
    for _ in range(rounds):
        for name, work in before.items():
            for _ in range(block):
                if work is not None:
                    work()
                began = time.thread_time()
                encoder.encode_counted([queries[i % len(queries)]], batch_size=1)
                times[name].append((time.thread_time() - began) * 1e3)
                i += 1
    return times, costs


def render(times: dict[str, list[float]], costs: dict[str, float], command: str, load: str, described: str,
           args: argparse.Namespace) -> str:
    alone = statistics.median(times["alone"])
    lines = ["# Encode CPU time after other work on the core", "", f"Command: `{command}`", "",
             f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
             f"- Machine: {cpu_line()}; load average {load}",
             f"- Setup: the int8 student `{args.student.name}`, one ONNX thread, one query per call, queries: "
             f"{described}; `time.thread_time` around `StudentEncoder.encode_counted`; {args.rounds} rounds of blocks "
             f"of {args.block} queries, the conditions taking turns.", "",
             "| before each encode | its own cost, ms | encode CPU ms, mean | median | median over alone |",
             "|---|---:|---:|---:|---:|"]
    for name, values in times.items():
        cost = f"{costs[name]:.3f}" if name in costs else "—"
        median = statistics.median(values)
        lines.append(f"| {name} | {cost} | {statistics.mean(values):.3f} | {median:.3f} | "
                     f"{median - alone:+.3f} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--student", type=Path, required=True, help="Exported student directory (int8 is timed).")
    parser.add_argument("--queries", type=Path, default=DEFAULT_SCIFACT,
                        help="BEIR directory (its test queries) or queries file.")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=300, help="Queries per block.")
    parser.add_argument("--sweep-mib", type=int, default=4, help="MiB swept before an encode (above a core's L2).")
    add_output_args(parser)
    parser.add_argument("--section", default=SECTION, help="Name of the record: docs/lab/<date>-<section>.md.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging()
    queries, described = load_queries(args.queries, 10_000)
    encoder = StudentEncoder(args.student, "int8", 1)
    span = LoadSpan()
    before: dict[str, Callable[[], None] | None] = {
        "alone": None, "Python work": python_work(), f"a {args.sweep_mib} MiB sweep": sweep(args.sweep_mib)}
    times, costs = measure(encoder, queries, before, args.rounds, args.block)
    command = command_line()
    load = span.text()
    publish(args.lab, args.section, render(times, costs, command, load, described, args),
            write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
