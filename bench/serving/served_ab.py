"""Served `POST /search` latency of two or more source trees of tandem on one root, taking turns, in one run.

Why: "main is not slower than the tree before the change on any served figure" can only be shown in one run on
the same machine in the same minutes; two runs apart drift by more than most changes move. Every tree serves the
same root with its own `tandem serve` (default settings, `python -m tandem` from the tree's directory, one server
up at a time), warms up on other queries, then answers the same sequential requests per case: dense unfiltered and
under bench/index/scale_10m.py's filters, lexical, hybrid. `--rounds` restarts each tree's server in turn (A, B, A, B…),
so a slow minute of the machine falls on both. Per case and tree: the median of the rounds' p50, and the p99 of
all rounds' requests pooled.

A tree is a directory with models/, service/ and tandem/ (`git archive REV | tar -x -C DIR`, or a checkout).

    python -m bench.serving.served_ab --root ROOT --student DIR --tree before=/tmp/before --tree after=. --rounds 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import numpy as np

from bench.harness.record import cpu_line
from bench.harness.servers import served
from bench.index.scale_10m import _split, timed_cases, train_queries

log = logging.getLogger("bench.served_ab")
def serve_once(tree: Path, root: Path, student: Path, texts: list[str], warm: list[str],
               logs: Path) -> dict[str, list[float]]:
    """One server of `tree` on `root`: the warm-up, then each case's requests; seconds per request by case."""
    env = {"PYTHONPATH": str(tree), "TANDEM_LOG_LEVEL": "WARNING", "TANDEM_LOG_FORMAT": "text"}
    out: dict[str, list[float]] = {}
    with served(root, student, logs / f"{tree.name}.log", env, cwd=tree, ready_timeout_s=600) as server:
        for name, mode, times, responses in timed_cases(server.client, texts, warm):
            for response in responses:
                if response.status_code != 200:
                    raise RuntimeError(f"{tree}: {mode} {name} answered {response.status_code}: {response.text}")
            out[f"{mode} · {name}"] = times
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="A root or version every tree can serve.")
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40, help="Sequential requests per case and round.")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/served_ab"))
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel("WARNING")
    trees = {label: Path(d).resolve() for label, d in (t.split("=", 1) for t in args.tree)}
    texts, warm = _split(train_queries(2 * args.requests), args.requests)
    times: dict[str, dict[str, list[list[float]]]] = {label: {} for label in trees}
    for r in range(args.rounds):
        for label, tree in trees.items():
            for case, seconds in serve_once(tree, args.root, args.student, texts, warm, args.logs).items():
                times[label].setdefault(case, []).append(seconds)
            log.info("round %d, %s done", r + 1, label)
    print(f"CPU: {cpu_line()}; root {args.root}; "
          f"{args.rounds} rounds × {args.requests} requests per case and tree")
    labels = list(trees)
    print("| case | " + " | ".join(f"{lb} p50 | {lb} p99" for lb in labels) + " |")
    print("|---|" + "---:|---:|" * len(labels))
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for case in times[labels[0]]:
        row = {}
        for lb in labels:
            rounds = times[lb][case]
            row[lb] = {"p50_ms": 1e3 * statistics.median(float(np.percentile(t, 50)) for t in rounds),
                       "p99_ms": 1e3 * float(np.percentile(np.concatenate(rounds), 99))}
        summary[case] = row
        print(f"| {case} | " + " | ".join(f"{row[lb]['p50_ms']:.1f} | {row[lb]['p99_ms']:.1f}" for lb in labels)
              + " |")
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
