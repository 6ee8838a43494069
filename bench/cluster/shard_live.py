"""Issue 57's live acceptance: `tandem serve --cluster` under open-loop load while a replica dies and a version is
published.

The SciFact root of bench.cluster.shard_acceptance (base plus three updates; built under --work if missing) is
copied to a fresh root, and `tandem serve --cluster ADDRESS --shards 2 --replicas 2` (a child process, its CURRENT
pointer watched) serves it from a local `ray.cluster_utils.Cluster`. Under an open loop of --rps requests a second
(tandem.openloop: request i leaves at start + i / rps whatever became of the ones before), for at least --seconds:
- at --kill-at, one of the first shard's two replicas is killed (`ray.kill(..., no_restart=True)`; Serve starts a
  replacement of its own);
- at --update-at, a real `tandem index update` (documents added, replaced and deleted, the new texts encoded by the
  teacher) publishes the next version, which the service's pointer watch deploys on new shards and puts in service;
  the load goes on until answers name it and --after seconds more.
Every answer must be a 503 or equal to the single box's for the version it names: afterwards each version named
gets a `tandem serve --index ROOT/VERSION` (no cluster) and every distinct request answered from it is sent there;
results (ids, order, scores as served) and the `index` summary are compared. The report counts exact / 503 / wrong /
other per version, latencies (send to answer), and the send schedule (each send's lag behind start + i / rps, and
the most requests in flight at once: an open loop keeps sending while answers are slow). Prints JSON.

    python -m bench.cluster.shard_live --work /tmp/live-acc --data ../shared/data/scifact \
        --student STUDENT --out live.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.cluster.shard_acceptance import bucket, query_texts, scifact_root
from bench.harness.record import cpu_model, load_average
from bench.harness.servers import free_port, served, start_process, stop, wait_ready
from models.bundle.versions import read_current
from tandem.loadclient import Request
from tandem.openloop import OpenLoop, Record, Target

log = logging.getLogger("bench.shard_live")
MODES = ("dense", "lexical", "hybrid")


def bodies(texts: list[str]) -> list[dict[str, Any]]:
    """The request mix: every query in each mode, with and without a filter (`bucket` < 30), top 10."""
    out: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        mode = MODES[i % len(MODES)]
        extra = {"filter": {"field": "bucket", "lt": 30}} if i % 2 else {}
        out.append({"query": text, "top_k": 10, "mode": mode, **extra})
    return out


def changes(root: Path, work: Path, seed: int = 11) -> Path:
    """The update published under load: 20 new documents (two SciFact texts joined, new ids: the teacher encodes
    them), 20 replaced (a text changed: encoded again) and 40 deleted, chosen among the current version's ids."""
    docs = {d["_id"]: d for d in map(json.loads, (work / "scifact.jsonl").read_text().splitlines())}
    from models.bundle.version import Bundle

    current = Bundle(read_current(root))
    try:
        alive = sorted(set(current.ids()) & set(docs))
    finally:
        current.close()
    rng = random.Random(seed)
    rng.shuffle(alive)
    lines: list[dict[str, Any]] = []
    for n in range(20):
        a, b = docs[alive[2 * n]], docs[alive[2 * n + 1]]
        lines.append({"_id": f"live-{n}", "title": a["title"], "text": f"{a['text']} {b['text']}",
                      "bucket": bucket(f"live-{n}")})
    for doc_id in alive[40:60]:
        lines.append({**docs[doc_id], "text": f"{docs[doc_id]['text']} (revised)"})
    lines += [{"_id": doc_id, "delete": True} for doc_id in alive[60:100]]
    path = work / "live-changes.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _version(record: Record) -> str | None:
    if record.answer is None or record.status != 200:
        return None
    return str(record.answer.json()["index"]["version"])


def _outcome(record: Record) -> str:
    """A record's status, with the error code of a refusal (a 503 is `shard_unavailable` or `deadline_exceeded`)."""
    if record.answer is None:
        return f"no answer ({record.error})"
    if record.status == 200:
        return "200"
    try:
        return f"{record.status} {record.answer.json().get('error')}"
    except ValueError:
        return str(record.status)


def phases(records: list[Record], began: float, events: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Outcomes (status and error code, or the version answered) and latencies of the requests sent in each stretch
    of the run: before the kill, after it until the update started, until the first answer of the new version, and
    after."""
    edges = [("before kill", float("-inf")), ("kill..update", events["kill"]),
             ("update..new answers", events["update_started"]), ("new version", events["first_answer_of_new"])]
    out: dict[str, Counter[str]] = {name: Counter() for name, _ in edges}
    latency: dict[str, list[float]] = {name: [] for name, _ in edges}
    for r in records:
        name = [n for n, start in edges if r.sent - began >= start][-1]
        out[name][_version(r) or _outcome(r)] += 1
        latency[name].append(r.answered - r.sent)
    return {k: {**v, "latency": _percentiles(latency[k])} for k, v in out.items()}


def _dump(records: list[Record], began: float, path: Path) -> None:
    """Every record, for a second look at a run: seconds since the load began, status, error and body."""
    with path.open("w") as fh:
        for r in records:
            fh.write(json.dumps({"target": r.target, "sent_s": r.sent - began, "answered_s": r.answered - began,
                                 "status": r.status, "error": r.error,
                                 "body": r.answer.body.decode() if r.answer else None}) + "\n")


def _kill_one_replica(app: str) -> str:
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if "SERVE_REPLICA" in a["name"] and app in a["name"]]
    if len(names) != 2:
        raise RuntimeError(f"expected two replicas of {app}, found {names}")
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    return names[0]


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 1), "p99_ms": round(float(np.percentile(a, 99)), 1),
            "max_ms": round(float(a.max()), 1)}


def schedule(records: list[Record], rps: float) -> dict[str, float]:
    """How the sends kept to start + i / rps, and the most requests in flight at once."""
    sent = sorted(r.sent for r in records)
    lag = [s - sent[0] - i / rps for i, s in enumerate(sent)]
    events = sorted([(r.sent, 1) for r in records] + [(r.answered, -1) for r in records])
    inflight = peak = 0
    for _, step in events:
        inflight += step
        peak = max(peak, inflight)
    span = sent[-1] - sent[0]
    return {"sent": len(sent), "scheduled_rps": rps, "sent_rps": round((len(sent) - 1) / span, 3) if span else 0.0,
            "lag_p99_ms": round(float(np.percentile(lag, 99)) * 1000, 1), "lag_max_ms": round(max(lag) * 1000, 1),
            "peak_in_flight": peak}


def judge(records: list[Record], targets: list[dict[str, Any]], root: Path, student: Path,
          work: Path) -> dict[str, dict[str, int]]:
    """Each answer against the single box's for the version it names: counts per version ("-": no version)."""
    counts: dict[str, Counter[str]] = {}
    named: dict[str, set[int]] = {}
    for r in records:
        version = _version(r)
        if version is None:
            counts.setdefault("-", Counter())[_outcome(r)] += 1
        else:
            named.setdefault(version, set()).add(int(r.target))
    for version, wanted in sorted(named.items()):
        with served(root / version, student, work / f"box-{version}.log", timeout_s=120.0) as box:
            want = {}
            for i in sorted(wanted):
                answer = box.client.post("/search", json=targets[i])
                answer.raise_for_status()
                want[i] = answer.json()
        c = counts.setdefault(version, Counter())
        for r in records:
            if _version(r) == version:
                assert r.answer is not None
                got, box_answer = r.answer.json(), want[int(r.target)]
                same = got["results"] == box_answer["results"] and all(
                    got["index"][k] == box_answer["index"][k] for k in ("version", "build_time", "count"))
                c["exact" if same else "wrong"] += 1
    return {v: dict(c) for v, c in counts.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("TANDEM_AGREEMENT_SAMPLE", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # as tests/conftest.py: the loopback only
    base = scifact_root(args.data, args.work)
    root = args.work / f"live-root-{int(time.time())}"
    shutil.copytree(base, root)
    update = changes(root, args.work)
    before = read_current(root).name
    targets = bodies(query_texts(args.data))

    import ray
    from ray.cluster_utils import Cluster

    from cluster.coordinator import ClusterSearch

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node,
                                                            "object_store_memory": 256 << 20})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=args.cpus_per_node, object_store_memory=256 << 20)
    ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
    port = free_port()
    cmd = [sys.executable, "-m", "tandem", "serve", "--cluster", cluster.address, "--shards", "2", "--replicas", "2",
           "--index", str(root), "--student", str(args.student), "--host", "127.0.0.1", "--port", str(port)]
    env = {"TANDEM_WATCH_INTERVAL_S": "0.5", **dict(kv.split("=", 1) for kv in args.service_env)}
    server = start_process(cmd, args.work / "serve.log", env=env)
    report: dict[str, Any] = {"cpu": cpu_model(), "load_average_before": load_average()[0], "nodes": args.nodes,
                              "cpus_per_node": args.cpus_per_node, "rps": args.rps, "root": str(root),
                              "service_env": env,
                              "versions": {"before": before}}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120.0, trust_env=False) as client:
            wait_ready(client, server, timeout_s=600.0)
        events: dict[str, float] = {}
        load = OpenLoop(f"http://127.0.0.1:{port}", [Target(str(i), Request("POST", "/search", json.dumps(b).encode()))
                                                      for i, b in enumerate(targets)], args.rps, timeout_s=60.0)
        with load:
            began = time.monotonic()
            time.sleep(max(0.0, began + args.kill_at - time.monotonic()))
            events["kill"] = time.monotonic() - began
            report["killed"] = _kill_one_replica(ClusterSearch(2).app((root / before).resolve(), 0))
            time.sleep(max(0.0, began + args.update_at - time.monotonic()))
            events["update_started"] = time.monotonic() - began
            after = f"v{int(before.lstrip('v')) + 1}"
            done = subprocess.run([sys.executable, "-m", "tandem", "index", "update", "--root", str(root),
                                   "--version", after, "--changes", str(update)], capture_output=True, text=True,
                                  check=True)
            events["update_published"] = time.monotonic() - began
            report["update"] = done.stdout.strip().splitlines()[0]
            report["versions"]["after"] = read_current(root).name
            deadline = time.monotonic() + 600
            while not any(_version(r) == after for r in list(load.records)):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"no answer named {after}")
                time.sleep(0.2)
            events["first_answer_of_new"] = time.monotonic() - began
            time.sleep(max(args.after, began + args.seconds - time.monotonic()))
            events["stopped"] = time.monotonic() - began
        report["events_s"] = {k: round(v, 1) for k, v in events.items()}
        records = list(load.records)
        _dump(records, began, args.work / f"{root.name}.records.jsonl")
        report["phases"] = phases(records, began, events)
        report["load_average_after"] = load_average()[0]
    finally:
        stop(server)
        ray.shutdown()
        cluster.shutdown()
    report["schedule"] = schedule(records, args.rps)
    report["latency"] = {"all": _percentiles([r.answered - r.sent for r in records])}
    for status in sorted({r.status for r in records}):
        report["latency"][str(status)] = _percentiles([r.answered - r.sent for r in records if r.status == status])
    report["outcomes"] = dict(sorted(Counter(_outcome(r) for r in records).items()))
    report["answers"] = judge(records, targets, root, args.student, args.work)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="shard_acceptance's --work (its SciFact root)")
    parser.add_argument("--data", type=Path, required=True, help="the SciFact folder")
    parser.add_argument("--student", type=Path, required=True, help="a student of the reference teacher")
    parser.add_argument("--rps", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="load at least this long")
    parser.add_argument("--kill-at", type=float, default=15.0)
    parser.add_argument("--update-at", type=float, default=25.0)
    parser.add_argument("--after", type=float, default=10.0, help="load kept on once the new version answers")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpus-per-node", type=int, default=4,
                        help="Ray slots per node: two versions of 2 shards x 2 replicas at 1 each, and a replacement")
    parser.add_argument("--service-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the served process (e.g. TANDEM_MAX_QUEUE_MS=10000; repeatable)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    text = json.dumps(run(args), indent=2) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
