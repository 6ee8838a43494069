"""Segments (issue 37): what a change costs against what the corpus holds, in one run per corpus size.

For each size N, a bundle root of N imported synthetic unit vectors (flat binary, the streaming build, as
bench/index/index_scale.py makes them) and one change file of 100 changes (50 replaced texts, 25 added, 25 deleted):

- the full build (`tandem index build --root`): wall time and peak RSS;
- the update as a segment (`tandem index update --root`): wall time, peak RSS, bytes added to the root and
  to the embedding store;
- the same update as every update was before segments (indexer.versions.rewrite, the whole bundle rewritten), on the
  same base, into a scratch directory: wall time, peak RSS, bytes written;
- the reload: `tandem serve` on the root (its CURRENT the base) under open-loop load, POST /admin/reload to
  the updated version: the reload's seconds, the server's RSS before and after, failed requests;
- the compaction (`tandem index compact --root`) of the updated version: wall time and peak RSS.

Each indexer command runs alone in a fresh process under GNU time (peak RSS), with the machine's threads. The
server, pinned to one BLAS/OpenMP thread, and the load generator share the machine's cores.

    python -m bench.index.segments --sizes 100000,1000000 [--student DIR] [--rps 50] [--duration 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

from bench.harness.record import add_output_args, command_line, cpu_line, load_average, publish, start_logging
from bench.harness.runs import home_with_teacher
from bench.harness.servers import free_port, rss_mib, start_process, stop, tandem_serve_cmd, wait_ready
from bench.index import index_scale
from bench.index.index_scale import WORDS, synthetic_import

log = logging.getLogger("bench.segments")

SECTION = "segments"
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

REWRITE = """
import sys
from pathlib import Path
from indexer.versions.request import UpdateRequest
from indexer.versions.rewrite import rewrite
base = Path(sys.argv[1])
rewrite(UpdateRequest(changes=Path(sys.argv[2]), base=base, out=Path(sys.argv[3])), base)
"""


@dataclass
class Run:
    seconds: float
    peak_gib: float


@dataclass
class Row:
    n: int
    build: Run
    update: Run
    update_root_mb: float
    update_store_mb: float
    rewrite: Run
    rewrite_mb: float
    reload_s: float
    reload_rss_before_mib: float
    reload_rss_after_mib: float
    reload_failed: int
    reload_answers: int
    shared_segments: int
    compact: Run


def timed(cmd: list[str], home: Path) -> Run:
    """`cmd` (a Python command line) alone in a fresh process under GNU time, with the machine's threads: wall
    seconds and peak RSS."""
    wall, gib = index_scale.timed(cmd, home)
    return Run(round(wall, 2), round(gib, 3))


def tandem(*args: str) -> list[str]:
    return [sys.executable, "-m", "tandem", *args]


def disk_bytes(*paths: Path) -> int:
    """Bytes on disk under `paths`, a hard-linked file counted once (du in one invocation)."""
    out = subprocess.run(["du", "-scb", *map(str, paths)], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def change_file(path: Path, n: int, seed: int = 1) -> Path:
    """50 replaced texts, 25 added documents, 25 deleted ones, picked at random among the N."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(n, size=75, replace=False)
    lines = [{"_id": f"d{i}", "title": f"Doc {i}", "text": " ".join(rng.choice(WORDS, size=14))} for i in picked[:50]]
    lines += [{"_id": f"new{i}", "title": f"New {i}", "text": " ".join(rng.choice(WORDS, size=12))} for i in range(25)]
    lines += [{"_id": f"d{i}", "delete": True} for i in picked[50:]]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def reload_under_load(root: Path, student: Path, work: Path, rps: float, duration: float) -> dict[str, float]:
    """Serve `root` (CURRENT: v1), reload to v2 halfway through an open-loop load; the reload's figures."""
    from tandem.loadtest import DEFAULT_QUERIES, run_loadtest

    token, port = secrets.token_urlsafe(16), free_port()
    server = start_process(tandem_serve_cmd(root, student, port), work / "server.log",
                           {"TANDEM_ADMIN_TOKEN": token, "TANDEM_WATCH_INTERVAL_S": "0", "TANDEM_LOG_FORMAT": "text",
                            **THREADS})
    url = f"http://127.0.0.1:{port}"
    figures: dict[str, float] = {}
    try:
        with httpx.Client(base_url=url, timeout=60.0, trust_env=False) as client:
            wait_ready(client, server)

            def reload() -> None:
                time.sleep(duration / 2)
                figures["rss_before"] = rss_mib(server.pid, "VmRSS") or 0.0
                began = time.perf_counter()
                response = client.post("/admin/reload", json={"path": str(root / "v2")},
                                       headers={"Authorization": f"Bearer {token}"})
                figures["wall"] = time.perf_counter() - began
                response.raise_for_status()
                outcome = response.json()
                figures["seconds"] = outcome["seconds"]
                figures["shared"] = outcome["current"]["shared_segments"]
                time.sleep(2.0)
                figures["rss_after"] = rss_mib(server.pid, "VmRSS") or 0.0

            thread = threading.Thread(target=reload, name="reload")
            thread.start()
            report = run_loadtest(url, rps, duration, DEFAULT_QUERIES, {"errors": 0.0}, top_k=10)
            thread.join()
        figures["failed"] = report.failures
        figures["answers"] = report.completed
    finally:
        stop(server)
    return figures


def measure(n: int, work: Path, student: Path, rps: float, duration: float) -> Row:
    directory = work / f"n{n}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    corpus, vectors, ids = synthetic_import(directory, n)
    home = home_with_teacher(directory / "home")
    root = directory / "root"
    build = timed(tandem("index", "build", "--corpus", str(corpus), "--embeddings", str(vectors), "--ids", str(ids),
                         "--quantization", "binary", "--dim", "768", "--index", "flat", "--root", str(root),
                         "--version", "v1"), home)
    changes = change_file(directory / "changes.jsonl", n)
    # the teacher's first load (its files into the page cache) is not the update's: warm it on a scratch update
    scratch = directory / "scratch"
    timed([sys.executable, "-c", REWRITE, str(root / "v1"), str(changes), str(scratch)], home)
    rewrite_mb = disk_bytes(scratch) / 1e6
    shutil.rmtree(scratch)
    rewrite = timed([sys.executable, "-c", REWRITE, str(root / "v1"), str(changes), str(scratch)], home)
    shutil.rmtree(scratch)
    before_root, before_store = disk_bytes(root), disk_bytes(home / "embeddings")
    update = timed(tandem("index", "update", "--root", str(root), "--changes", str(changes), "--version", "v2"),
                   home)
    root_mb = (disk_bytes(root) - before_root) / 1e6
    store_mb = (disk_bytes(home / "embeddings") - before_store) / 1e6
    from models.bundle.versions import set_current

    set_current(root, "v1")  # the server starts on the base, and reloads to the update under load
    figures = reload_under_load(root, student, directory, rps, duration)
    compact = timed(tandem("index", "compact", "--root", str(root), "--base", "v2", "--version", "v3"), home)
    shutil.rmtree(directory)
    return Row(n, build, update, round(root_mb, 2), round(store_mb, 2), rewrite, round(rewrite_mb, 1),
               round(figures["seconds"], 3), round(figures["rss_before"], 1), round(figures["rss_after"], 1),
               int(figures["failed"]), int(figures["answers"]), int(figures["shared"]), compact)


def render(rows: list[Row], command: str, load: str) -> str:
    lines = [f"# Segments: a change costs what it changes ({datetime.now(UTC):%Y-%m-%d})", "",
             f"- Command: `{command}`", f"- CPU: {cpu_line()}", f"- Load average before: {load}",
             "- Roots of imported synthetic unit vectors, flat binary, 768-d; 100 changes: 50 replaced texts, "
             "25 added, 25 deleted (the teacher, CPU fp32, encodes 75 texts). Each indexer command alone in a fresh "
             "process under GNU time, with the machine's threads; the server pinned to one BLAS/OpenMP thread.", "",
             "| documents | full build | update as a segment | its share of the build | disk added (root + store) "
             "| peak RSS | update before segments (rewrite) | its disk | compaction |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        share = r.update.seconds / r.build.seconds
        lines.append(f"| {r.n:,} | {r.build.seconds:.1f} s, {r.build.peak_gib:.2f} GiB | {r.update.seconds:.1f} s "
                     f"| {share:.1%} | {r.update_root_mb:.2f} + {r.update_store_mb:.2f} MB "
                     f"| {r.update.peak_gib * 1024:.0f} MiB | {r.rewrite.seconds:.1f} s, "
                     f"{r.rewrite.peak_gib * 1024:.0f} MiB | {r.rewrite_mb:,.0f} MB | {r.compact.seconds:.1f} s, "
                     f"{r.compact.peak_gib:.2f} GiB |")
    lines += ["", "| documents | reload under load | server RSS before → after | shared segments | "
              "answers, failed |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.n:,} | {r.reload_s:.3f} s | {r.reload_rss_before_mib:.0f} → {r.reload_rss_after_mib:.0f} "
                     f"MiB (+{r.reload_rss_after_mib - r.reload_rss_before_mib:.0f}) | {r.shared_segments} | "
                     f"{r.reload_answers}, {r.reload_failed} |")
    if len(rows) > 1:
        small, large = rows[0], rows[-1]
        lines += ["", f"Update peak RSS at {large.n:,} minus at {small.n:,}: "
                  f"{(large.update.peak_gib - small.update.peak_gib) * 1024:+.0f} MiB."]
    lines += ["", "```json", json.dumps([asdict(r) for r in rows], indent=1), "```"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--student", type=Path, required=True, help="A student of the default teacher.")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tandem-bench-segments"))
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--duration", type=float, default=20.0)
    add_output_args(parser)
    args = parser.parse_args(argv)
    start_logging()
    load = load_average()[1]
    rows = [measure(int(n), args.work, args.student, args.rps, args.duration) for n in args.sizes.split(",")]
    command = command_line(argv)
    publish(args.lab, SECTION, render(rows, command, load), write=not args.no_write)


if __name__ == "__main__":
    main()
