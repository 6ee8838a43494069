"""Server CPU per dense POST /search, the same requests against two or more source trees of tandem, interleaved.

Why: a door into /search that skips FastAPI's routing and dependency resolution saves server CPU only if the
saving stands out of the noise of the same machine in the same minutes; measured apart, the drift between two
runs on a shared machine is as large as the saving. So every tree gets its own `tandem serve` (the real
server: `python -m tandem serve`, one process, on 127.0.0.1, TANDEM_WORKERS=0 so the event loop runs each
batch, OMP/BLAS/ONNX threads pinned to 1), all are started and warmed up, and then blocks of the same fixed
number of sequential requests go to each tree in turn, A/B/A/B..., one server busy at a time. A block's figure
is the server process's CPU time (utime + stime of /proc/PID/stat, every thread) over its requests, divided by
their number. `--rounds` restarts all the servers, so process-level luck (memory placement) counts as noise too.

A tree is a directory holding models/, service/ and tandem/ (e.g. `git archive REV | tar -x -C DIR`): its
server runs with that directory first on PYTHONPATH, the same interpreter and installed libraries for all.

    python -m bench.serving.search_door_ab --index BUNDLE --student DIR --tree shortcut=/tmp/a --tree route=/tmp/b
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.harness.record import cpu_flags, cpu_model, start_logging
from bench.harness.servers import cpu_seconds, free_port, start_process, stop, tandem_serve_cmd, wait_ready

log = logging.getLogger("bench.search_door_ab")

QUERIES = ("how do tides work", "protein folding", "vitamin d deficiency", "gene expression in cancer cells")
PINNED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TANDEM_WORKERS": "0",
          "TANDEM_ENCODE_THREADS": "1", "TANDEM_SEARCH_THREADS": "1", "TANDEM_PROCESSES": "1",
          "TANDEM_LOG_LEVEL": "warning"}


@dataclass
class Tree:
    label: str
    root: Path
    ms_per_request: list[float] = field(default_factory=list)  # one figure per block


def start(tree: Tree, index: Path, student: Path, port: int, logs: Path) -> subprocess.Popen[bytes]:
    """The tree's own `tandem serve`: run in the tree, with the tree first on PYTHONPATH."""
    return start_process(tandem_serve_cmd(index, student, port), logs / f"{tree.label}-{port}.log",
                         env={**PINNED, "PYTHONPATH": str(tree.root)}, cwd=tree.root)


def send(client: httpx.Client, count: int, top_k: int) -> None:
    for i in range(count):
        body = json.dumps({"query": QUERIES[i % len(QUERIES)], "top_k": top_k})
        response = client.post("/search", content=body, headers={"content-type": "application/json"})
        if response.status_code != 200:
            raise RuntimeError(f"POST /search answered {response.status_code}: {response.text[:200]}")


def block(client: httpx.Client, pid: int, count: int, top_k: int) -> float:
    """Server CPU milliseconds per request over `count` sequential requests."""
    before = cpu_seconds(pid)
    send(client, count, top_k)
    return (cpu_seconds(pid) - before) * 1e3 / count


def run_round(trees: list[Tree], args: argparse.Namespace, logs: Path) -> None:
    servers: list[tuple[Tree, subprocess.Popen[bytes], httpx.Client]] = []
    try:
        for tree in trees:
            port = free_port()
            server = start(tree, args.index, args.student, port, logs)
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0)
            servers.append((tree, server, client))
            wait_ready(client, server)
            send(client, args.warmup, args.top_k)
        for _ in range(args.blocks):
            for tree, server, client in servers:
                tree.ms_per_request.append(block(client, server.pid, args.requests, args.top_k))
                log.info("%s: %.4f ms of server CPU per search", tree.label, tree.ms_per_request[-1])
    finally:
        for _, server, client in servers:
            client.close()
            stop(server)


def report(trees: list[Tree]) -> str:
    """Per tree: the blocks' mean, spread and ratio to the first tree's; and the paired difference, each block
    minus the first tree's block of the same cycle (adjacent in time, so the machine's drift cancels), as its
    mean ± standard error."""
    base = trees[0]
    lines = [f"CPU: {cpu_model()} ({os.cpu_count()} cores); {cpu_flags()}",
             f"tree | blocks | mean ms/search | stdev | min | max | ratio to {base.label} | "
             f"paired Δ ms vs {base.label} (± s.e.)"]
    for tree in trees:
        values = tree.ms_per_request
        mean = statistics.fmean(values)
        ratio = mean / statistics.fmean(base.ms_per_request)
        deltas = [v - b for v, b in zip(values, base.ms_per_request, strict=True)]
        error = statistics.stdev(deltas) / len(deltas) ** 0.5 if tree is not base else 0.0
        lines.append(f"{tree.label} | {len(values)} | {mean:.4f} | {statistics.stdev(values):.4f} | "
                     f"{min(values):.4f} | {max(values):.4f} | {ratio:.3f} | "
                     f"{statistics.fmean(deltas):+.4f} ± {error:.4f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=DIR",
                        help="a source tree to serve (two or more; the first is the baseline of the ratios)")
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per block")
    parser.add_argument("--warmup", type=int, default=300, help="requests per server before the first block")
    parser.add_argument("--blocks", type=int, default=2, help="blocks per tree per round, interleaved")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each with freshly started servers")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/search_door_ab"))
    args = parser.parse_args()
    start_logging()
    trees = [Tree(label, Path(root).resolve()) for label, _, root in (t.partition("=") for t in args.tree)]
    if len(trees) < 2:
        parser.error("give two or more --tree LABEL=DIR")
    args.logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for number in range(args.rounds):
        log.info("round %d of %d", number + 1, args.rounds)
        run_round(trees, args, args.logs)
    print(report(trees))
    print(f"({args.rounds} rounds × {args.blocks} blocks × {args.requests} requests per tree, "
          f"{time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
