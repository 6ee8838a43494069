"""The guarantees of issue 42 at scale: hostile and careless requests against a served 1M-document bundle.

Why: a request's cost must be bounded before its work starts, and bad input must be a 4xx, however the body is
built; a unit test shows the rule on a tiny bundle, this run shows it where the work could really be large (a
200,000-value `in` list, a 340-word query whose every word is in every document's postings). In one run:

1. Inputs and bundle: bench/filters/filter_scale.py's `--n` synthetic documents (SciFact's teacher vectors plus
   covariance-shaped noise; payload keys `r`, `year`, `tag`, `labels`; every text "Synthetic text.", so the stem
   "synthet" has a posting list as long as the corpus), flat binary with BM25 and the payload index.
2. `tandem serve` with its default settings on that bundle, but for TANDEM_MAX_BODY_BYTES raised to 16 MiB, so
   that a 200,000-value `in` list reaches the filter's own cap instead of the body's.
3. A steady client in a thread: one ordinary dense request after another, for the whole run; its answers
   (status, latency) while the hostile requests run show whether the service kept answering the others.
4. Each hostile body, `--repeat` times: its status and wall time as the client sees it.

    python -m bench.filters.guarantees --student DIR --work /tmp/tandem-filter-scale --n 1000000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.encoding.encode_latency import DEFAULT_SCIFACT, load_queries
from bench.filters.filter_scale import build, make_inputs
from bench.harness.record import (
    LoadSpan,
    command_line,
    cpu_line,
    parse_with_output,
    publish,
    start_logging,
)
from bench.harness.servers import free_port, rss_mib, start_process, stop, tandem_serve_cmd, wait_ready
from bench.index.index_types import DEFAULT_REFERENCE

log = logging.getLogger("bench.guarantees")

SECTION = "guarantees"
BOUND_S = 2.0  # the bound on any one of these answers


def _nested_not(depth: int) -> str:
    return '{"query": "vitamin d", "filter": ' + '{"not": ' * depth + '{"field": "year", "eq": 2000}' \
        + "}" * depth + "}"


def hostile_bodies() -> dict[str, str]:
    """Each hostile body as the raw JSON text a client would send (some are not what json.dumps writes)."""
    many = json.dumps({"query": "vitamin d", "filter": {"field": "r", "in": list(range(200_000))}})
    at_cap = json.dumps({"query": "vitamin d", "filter": {"field": "r", "in": list(range(1_024))}})
    repeated = json.dumps({"query": " ".join(["text"] * 340), "mode": "lexical"})  # "text": every document
    distinct = json.dumps({"query": " ".join(f"w{i}x" for i in range(340)), "mode": "lexical"})
    def wide_or(n: int) -> str:
        return json.dumps({"query": "vitamin d", "filter": {"or": [{"field": "r", "eq": i} for i in range(n)]}})

    return {
        "gte 1e999": '{"query": "vitamin d", "filter": {"field": "year", "gte": 1e999}}',
        "lone surrogate": '{"query": "\\ud800 vitamin d"}',
        "100,000 nested not": _nested_not(100_000),
        "min_score NaN": '{"query": "vitamin d", "min_score": NaN}',
        "top_k Infinity": '{"query": "vitamin d", "top_k": Infinity}',
        "200,000-value in list": many,
        "1,024-value in list (at the cap)": at_cap,
        "200-condition or": wide_or(200),
        "300-condition or": wide_or(300),
        "340-word repeated word, lexical": repeated,
        "340-word repeated word, hybrid": repeated.replace('"lexical"', '"hybrid"'),
        "340 distinct words, lexical": distinct,
        "offset past the hits bound": '{"query": "vitamin d", "top_k": 100, "offset": 100000000}',
        "undeclared field": '{"query": "vitamin d", "filter": {"field": "no_such_field", "eq": 1}}',
    }


@dataclass
class Hostile:
    name: str
    statuses: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    detail: str = ""


@dataclass
class Steady:
    statuses: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def steady_client(url: str, texts: list[str], steady: Steady) -> None:
    with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
        i = 0
        while not steady.stop.is_set():
            began = time.perf_counter()
            try:
                status = client.post("/search", json={"query": texts[i % len(texts)], "top_k": 10}).status_code
            except httpx.HTTPError:
                status = 0
            steady.seconds.append(time.perf_counter() - began)
            steady.statuses.append(status)
            i += 1


def run_hostile(url: str, bodies: dict[str, str], repeat: int) -> list[Hostile]:
    out = []
    with httpx.Client(base_url=url, timeout=60.0, trust_env=False) as client:
        for name, body in bodies.items():
            row = Hostile(name)
            for _ in range(repeat):
                began = time.perf_counter()
                response = client.post("/search", content=body.encode("utf-8", "surrogatepass"),
                                       headers={"content-type": "application/json"})
                row.seconds.append(time.perf_counter() - began)
                row.statuses.append(response.status_code)
                row.detail = response.text[:160].replace("|", "\\|").replace("\n", " ")
            log.info("%s: %s in %.3f s max", name, row.statuses, max(row.seconds))
            out.append(row)
    return out


def render(args: argparse.Namespace, rows: list[Hostile], steady: Steady, rss: float | None, command: str,
           load: str) -> str:
    lines = [
        f"# Guarantees at {args.n:,} documents ({time.strftime('%Y-%m-%d', time.gmtime())})",
        "",
        f"- Command: `{command}`",
        f"- CPU: {cpu_line()}; {os.cpu_count()} cores; load {load}",
        f"- Bundle: flat binary, dim {args.dim}, BM25 and payload index (bench/filters/filter_scale.py's inputs); "
        "`tandem serve` with its default settings but TANDEM_MAX_BODY_BYTES 16 MiB; "
        f"served RSS {rss or float('nan'):.0f} MiB",
        f"- Each hostile body sent {args.repeat} times, one at a time, while a steady client sent ordinary dense "
        "requests back to back.",
        "",
        f"| body | statuses | max s | within {BOUND_S:.0f} s | answer (first 160 characters) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        ok = max(row.seconds) <= BOUND_S and all(s < 500 for s in row.statuses)
        lines.append(f"| {row.name} | {', '.join(map(str, sorted(set(row.statuses))))} | {max(row.seconds):.3f} | "
                     f"{'yes' if ok else '**no**'} | {row.detail} |")
    answered = sum(s == 200 for s in steady.statuses)
    times = np.asarray(steady.seconds) * 1e3
    lines += [
        "",
        f"Steady client meanwhile: {len(steady.statuses)} requests, {answered} answered 200, "
        f"{sum(s >= 500 or s == 0 for s in steady.statuses)} 5xx or failed; "
        f"p50 {np.percentile(times, 50):.1f} ms, p99 {np.percentile(times, 99):.1f} ms, "
        f"max {times.max():.1f} ms.",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--student", type=Path, required=True, help="Student directory the server encodes queries with.")
    p.add_argument("--work", type=Path, default=Path("/tmp/tandem-filter-scale"), help="Inputs and bundles (kept).")
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    p.add_argument("--scifact", type=Path, default=DEFAULT_SCIFACT)
    return parse_with_output(p, argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start_logging()
    span = LoadSpan()
    bundle = build(make_inputs(args.work, args.n, args.reference), "flat", args.dim)
    texts, _ = load_queries(args.scifact, 100)
    port = free_port()
    process = start_process(tandem_serve_cmd(bundle, args.student, port), args.work / "serve-guarantees.log",
                            {"TANDEM_LOG_FORMAT": "text", "TANDEM_LOG_LEVEL": "WARNING",
                             "TANDEM_MAX_BODY_BYTES": str(16 << 20)})
    url = f"http://127.0.0.1:{port}"
    steady = Steady()
    try:
        with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
            wait_ready(client, process)
            for text in texts[:5]:  # warm
                client.post("/search", json={"query": text})
        thread = threading.Thread(target=steady_client, args=(url, texts, steady), daemon=True)
        thread.start()
        rows = run_hostile(url, hostile_bodies(), args.repeat)
        steady.stop.set()
        thread.join()
        rss = rss_mib(process.pid, "VmRSS")
    finally:
        steady.stop.set()
        stop(process)
    command = command_line()
    text = render(args, rows, steady, rss, command, span.text())
    publish(args.lab, SECTION, text, write=not args.no_write)


if __name__ == "__main__":
    main()
