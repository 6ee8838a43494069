"""A follower handed a backlog (issue 42, item 6's acceptance): its versions' segments stay under the documented
bound, and a service watching the root follows every one.

A root of `--docs` synthetic documents with imported vectors (bench/index/index_scale.py's, no teacher) is served by
`tandem serve` (its watcher polling CURRENT every 0.2 s); `--files` tiny change files (`--changes` changes each:
metadata replaced, the vector kept, and a delete in every fourth file) are dropped into a directory the way
operations.md tells producers to (a dot-name, then a rename), all before the follower starts; then
`tandem index follow --once` with its default bounds applies the backlog and exits. Recorded: the versions
published, each version's segments against the bound (max(--compact-segments, 2)), the follower's wall time, and
what the service did: the reloads it made and refused (its /metrics), every version it was seen serving (GET
/admin/status polled every 0.05 s), its open descriptors (sampled), and how long it took to serve the last.

"Follows every one" is measured as: the service ends serving the follower's last version, no reload was refused
or failed, and each published version was either loaded or superseded (CURRENT had moved on before the watcher
got to it: a watcher reloads what CURRENT names, never a version already replaced).

    python -m bench.index.follow_backlog --student DIR [--docs 400] [--files 1000] [--work /tmp/follow-backlog]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.record import add_output_args, cpu_line, load_average, publish, start_logging
from bench.harness.runs import home_with_teacher
from bench.harness.servers import free_port, start_process, stop, tandem_serve_cmd, wait_ready
from bench.index.index_scale import synthetic_import
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import list_versions, read_current

log = logging.getLogger("bench.follow_backlog")

SECTION = "follow-backlog"
COMPACT_SEGMENTS = 8  # `tandem index follow`'s defaults, passed explicitly so the record names them
BATCH_FILES = 16
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def tandem(*args: str) -> list[str]:
    return [sys.executable, "-m", "tandem", *args]


def build_root(work: Path, docs: int, env: dict[str, str]) -> Path:
    corpus, vectors, ids = synthetic_import(work, docs)
    root = work / "root"
    subprocess.run(tandem("index", "build", "--corpus", str(corpus), "--embeddings", str(vectors), "--ids", str(ids),
                          "--root", str(root)), check=True, env=env)
    return root


def drop_changes(directory: Path, corpus: Path, files: int, changes: int, docs: int) -> int:
    """`files` change files of `changes` lines each over `corpus`'s documents, written under a dot-name and renamed
    into place; the lines written."""
    rng = np.random.default_rng(1)
    texts = {line["_id"]: line for line in map(json.loads, corpus.open())}
    live = [f"d{i}" for i in range(docs)]
    lines = 0
    for n in range(files):
        picked = rng.choice(len(live), size=changes, replace=False)
        body = [{**texts[live[i]], "metadata": {"rev": n}} for i in picked[:changes - 1]]
        last = live[picked[-1]]
        if n % 4 == 3:  # a delete in every fourth file
            body.append({"_id": last, "delete": True})
            live.remove(last)
        else:
            body.append({**texts[last], "metadata": {"rev": n}})
        temp = directory / f".{n:05d}.jsonl"
        temp.write_text("".join(json.dumps(line) + "\n" for line in body))
        temp.rename(directory / f"{n:05d}.jsonl")
        lines += len(body)
    return lines


@dataclass
class Watch:
    """What the service was seen doing while the follower ran: versions served, descriptors held."""

    root: Path
    served: list[str] = field(default_factory=list)
    max_fds: int = 0
    segments_at_max: int = 0  # distinct segments the service held files of when it held the most descriptors
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, client: httpx.Client, pid: int, token: str) -> None:
        while not self.stop.is_set():
            try:
                status = client.get("/admin/status", headers={"Authorization": f"Bearer {token}"}).json()
                version = (status.get("current") or {}).get("version")
                if version and (not self.served or self.served[-1] != version):
                    self.served.append(version)
                self._descriptors(pid)
            except (httpx.HTTPError, OSError, ValueError) as exc:
                log.warning("status poll failed: %s", exc)
            time.sleep(0.05)

    def _descriptors(self, pid: int) -> None:
        """The service's open descriptors now; at a new peak, the segments whose files they are."""
        links = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed meanwhile
                links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        if len(links) <= self.max_fds:
            return
        self.max_fds = len(links)
        segments = set()
        for link in links:
            if link.startswith(f"{self.root}/"):
                parts = Path(link).relative_to(self.root).parts  # VERSION/segments/NAME/… or VERSION/… (its first)
                if not parts[0].startswith("."):  # a version, not the root's own files
                    segments.add(parts[2] if len(parts) > 3 and parts[1] == "segments" else parts[0])
        self.segments_at_max = len(segments)


def publish_order(root: Path, final: str, first: str) -> list[str]:
    """The versions published after `first`, oldest first, by each manifest's base (names alone do not sort two
    versions of the same second)."""
    chain = [final]
    while chain[-1] != first:
        base = read_bundle_manifest(root / chain[-1]).base
        assert base is not None, f"{chain[-1]} names no base"
        chain.append(base.version)
    published = chain[-2::-1]
    assert sorted(published) == sorted(v for v in list_versions(root) if v != first), "a version outside the chain"
    return published


def reloads(client: httpx.Client) -> dict[str, float]:
    """tandem_reloads_total by outcome, from /metrics."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "tandem_reloads_total":
                out[sample.labels["outcome"]] = sample.value
    return out


def measure(args: argparse.Namespace) -> str:
    work: Path = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "TANDEM_HOME": str(home_with_teacher(work / "home")), "TANDEM_LOG_LEVEL": "WARNING"}
    root = build_root(work, args.docs, env)
    first = read_current(root).name
    changes = work / "changes"
    changes.mkdir()
    lines = drop_changes(changes, work / "corpus.jsonl", args.files, args.changes, args.docs)
    token, port = secrets.token_urlsafe(16), free_port()
    server = start_process(tandem_serve_cmd(root, args.student, port), work / "server.log",
                           {**env, "TANDEM_ADMIN_TOKEN": token, "TANDEM_WATCH_INTERVAL_S": "0.2",
                            "TANDEM_LOG_FORMAT": "text", "TANDEM_LOG_LEVEL": "INFO", **THREADS})
    watch = Watch(root.resolve())
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0, trust_env=False) as client:
            wait_ready(client, server)
            watcher = threading.Thread(target=watch.run, args=(client, server.pid, token), name="watch")
            watcher.start()
            began = time.perf_counter()
            follower = subprocess.run(tandem("index", "follow", "--root", str(root), "--changes-dir", str(changes),
                                             "--once", "--compact-segments", str(COMPACT_SEGMENTS), "--batch-files",
                                             str(BATCH_FILES)), env=env, capture_output=True, text=True)
            follow_s = time.perf_counter() - began
            if follower.returncode != 0:
                raise RuntimeError(f"the follower failed ({follower.returncode}): {follower.stderr[-3000:]}")
            final = read_current(root).name
            deadline = time.monotonic() + 120
            while (not watch.served or watch.served[-1] != final) and time.monotonic() < deadline:
                time.sleep(0.05)
            caught_up_s = time.perf_counter() - began - follow_s
            watch.stop.set()
            watcher.join()
            outcomes = reloads(client)
            status = client.get("/admin/status", headers={"Authorization": f"Bearer {token}"}).json()
    finally:
        watch.stop.set()
        stop(server)
    published = publish_order(root, final, first)
    manifests = {v: read_bundle_manifest(root / v) for v in published}
    segments = [len(m.parts) for m in manifests.values()]
    actions = [m.base.action for m in manifests.values() if m.base is not None]
    state = read_bundle_manifest(root / final).follow
    bound = max(COMPACT_SEGMENTS, 2)
    served = set(watch.served)
    unseen = [v for v in published if v not in served]
    order = {v: i for i, v in enumerate(published)}
    superseded = all(any(order[s] > order[v] for s in served if s in order) for v in unseen)
    failed = outcomes.get("failed", 0.0)
    last = status.get("last_reload") or {}
    follows = watch.served[-1] == final and failed == 0 and last.get("outcome") == "ok" and superseded
    load, loads = load_average()
    rows = [
        ("change files applied (CURRENT's follow record)",
         f"{state.files if state else 0:,} (last {state.last if state else None})"),
        ("versions published", f"{len(published)} ({actions.count('follow')} batches, "
                               f"{actions.count('compact')} compactions)"),
        ("segments per version: max / mean", f"{max(segments)} / {np.mean(segments):.1f}"),
        ("documented bound, max(--compact-segments, 2)", str(bound)),
        ("every version within the bound", "yes" if max(segments) <= bound else "NO"),
        ("follower wall time", f"{follow_s:.1f} s ({follow_s / args.files * 1e3:.0f} ms per change file)"),
        ("service: reloads ok / refused or failed", f"{outcomes.get('success', 0):.0f} / {failed:.0f}"),
        ("service: distinct versions seen serving", f"{len(served)} of {len(published) + 1} (polled every 0.05 s)"),
        ("service: versions never seen serving / all superseded before the watcher got to them",
         f"{len(unseen)} / {'yes' if superseded else 'NO'}"),
        ("service: serving the last version",
         f"{'yes' if watch.served[-1] == final else 'NO'}, {max(caught_up_s, 0):.1f} s after the follower exited"),
        ("service: open descriptors, max sampled; segments whose files they held then",
         f"{watch.max_fds}; {watch.segments_at_max}"),
        ("**the service followed every version**", f"**{'yes' if follows else 'NO'}**"),
    ]
    table = "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])
    return f"""# A follower's backlog of {args.files:,} change files, served as it is applied

Issue 42, item 6's acceptance: "A follower handed 1,000 pending change files publishes versions whose segment count
stays under its documented bound, and a service follows every one of them." `python -m bench.index.follow_backlog
--student {args.student} --docs {args.docs} --files {args.files} --changes {args.changes}`; one run.

CPU: {cpu_line()}; {os.cpu_count()} cores; load {loads} at the end (a shared machine:
other engineers' runs may overlap, so the times are an upper bound).

Setup: a root of {args.docs} synthetic documents (imported 768-d vectors, the default float flat bundle, one
segment); {args.files:,} change files of {args.changes} lines each ({lines:,} lines: metadata replaced with the vector
kept, and one delete in every fourth file), all in the directory before the follower starts;
`tandem index follow --once --compact-segments {COMPACT_SEGMENTS} --batch-files {BATCH_FILES}` (the defaults);
`tandem serve` on the root, watching CURRENT every 0.2 s, default settings (descriptor limit raised to the hard one).

{table}

"Followed every version" means: the service ended serving the follower's last version, no reload was refused or
failed (tandem_reloads_total), the last reload's outcome was ok, and every version it was never seen serving had
been superseded by a later one it did serve (the watcher reloads what CURRENT names when it looks, so a version
replaced within one poll is never loaded, by design). The machine's 1-minute load at the end was {load:.1f}.
"""


def main() -> None:
    start_logging()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", type=Path, required=True, help="A student of the default teacher.")
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=3, help="Lines per change file.")
    parser.add_argument("--work", type=Path, default=Path("/tmp/follow-backlog"))
    add_output_args(parser)
    args = parser.parse_args()
    publish(args.lab, SECTION, measure(args), write=not args.no_write)


if __name__ == "__main__":
    main()
