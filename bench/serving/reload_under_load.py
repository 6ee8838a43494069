"""Acceptance benchmark: hot reloads under open-loop load lose no request and switch versions exactly.

A real `tandem serve` process (127.0.0.1) serves a bundle root built from a small corpus while
`tandem.loadtest` drives POST /search open-loop. In the middle, three reloads:

1. POST /admin/reload {"path": v2}              (valid: answers switch to v2)
2. CURRENT → a copy of v1 with flipped bytes      (the watcher tries it; refused by its sha256)
3. CURRENT → v3                                   (valid: the watcher swaps it in)

It checks: no failed request, the corrupted bundle refused, and every answer's `index.version`
is the version in service while the request was in flight (old or new only inside a reload's
window). Results go into a dated record in the lab notebook (docs/lab/).

With `--replicas N` (N > 1) it runs N `tandem serve` processes on one bundle root behind Debian's nginx
(`apt-get install nginx`; a generated config, no root needed) and drives the load through nginx, as
docker-compose.yml does. Moving CURRENT reaches every replica (each watches it); POST /admin/reload is
sent to every replica directly, one after the other. Every replica must refuse the corrupted bundle,
each answer's version must be the one in service on the replica that answered it (nginx names it), and
once the last replica has switched, no answer may come from an older version. That run has its own
section (`reload-under-load-replicas`), so the single-replica one stays.

    python -m bench.serving.reload_under_load [--student DIR] [--rps 40] [--duration 30] [--replicas N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

from bench.harness.record import (
    REPO,
    command_line,
    load_average,
    machine,
    parse_with_output,
    publish,
    start_logging,
)
from bench.harness.servers import (
    UPSTREAM_HEADER,
    free_port,
    nginx_binary,
    nginx_version,
    start_nginx,
    start_process,
    stop,
    tandem_serve_cmd,
    wait_ready,
)

log = logging.getLogger("bench.reload")


SECTION = "reload-under-load"
REPLICAS_SECTION = "reload-under-load-replicas"


def section_name(replicas: int, processes: int, workers: int | None = None) -> str:
    """One section per shape of the run, so each keeps its figures: 1 server, N replicas, and either with processes,
    and either with batches on the event loop (workers 0)."""
    base = SECTION if replicas == 1 else REPLICAS_SECTION
    base = base if processes == 1 else f"{base}-processes"
    return f"{base}-inline" if workers == 0 else base


def workers_of(processes: int, workers: int | None) -> int | None:
    """TANDEM_WORKERS of each process: as given; else 1 with several processes (threads are per process), else the
    server's default (None)."""
    return workers if workers is not None else (1 if processes > 1 else None)


WATCH_TIMEOUT_S = 60.0


@dataclass
class Answer:
    due: float  # scheduled send, time.perf_counter()
    done: float
    status: int
    version: str | None
    replica: str | None = None  # "127.0.0.1:PORT" of the replica that answered, where nginx said


@dataclass
class Switch:
    """One replica's part of a reload: asked (or CURRENT moved) at `start`, outcome confirmed at `end`."""

    start: float
    end: float
    outcome: dict[str, object]


@dataclass
class Event:
    """A reload across every replica: from the first trigger to the last replica's confirmed outcome."""

    name: str
    expected: str  # "switch" or "refused"
    target: str
    start: float = 0.0
    end: float = 0.0
    outcome: dict[str, object] = field(default_factory=dict)  # the common outcome ("mixed" if they differ)
    replicas: dict[str, Switch] = field(default_factory=dict)  # "127.0.0.1:PORT" → that replica's part

    def window(self, replica: str | None) -> tuple[float, float]:
        """The reload's window on `replica`, or across all of them where the replica is unknown."""
        part = self.replicas.get(replica) if replica is not None else None
        return (part.start, part.end) if part is not None else (self.start, self.end)

    def settle(self) -> None:
        """Set the overall window and outcome from the replicas' parts."""
        parts = list(self.replicas.values())
        self.start, self.end = min(p.start for p in parts), max(p.end for p in parts)
        outcomes = {str(p.outcome.get("outcome")) for p in parts}
        self.outcome = {**parts[0].outcome, "outcome": outcomes.pop() if len(outcomes) == 1 else "mixed"}


# --- preparation -------------------------------------------------------------------------------------------

def prepare_corpus(work: Path, corpus: Path | None, docs: int) -> Path:
    if corpus is not None:
        return corpus
    from tandem.demo_corpus import write_demo_corpus

    out = work / f"corpus-{docs}.jsonl"
    if not out.is_file():
        write_demo_corpus(out, max_docs=docs)
    return out


def build_version(corpus: Path, root: Path, quantization: str) -> str:
    """A published version under `root`; the teacher vectors are cached after the first build."""
    from indexer.build import BuildRequest, build
    from models.bundle.versions import new_version_name

    name = new_version_name()
    build(BuildRequest(corpus=corpus, out=root / name, quantization=quantization))
    return name


def corrupt_copy(root: Path, source: str) -> str:
    """A copy of `source` with 16 bytes of index.faiss flipped, so its sha256 no longer matches the manifest."""
    name = f"{source}-corrupted"
    shutil.copytree(root / source, root / name)
    path = root / name / "index.faiss"
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return name


def prepare_student(work: Path, corpus: Path, bundle: Path, student: Path | None) -> Path:
    """The given student, or a small one distilled once into the work directory (its quality is irrelevant here)."""
    if student is not None:
        return student
    from models.distill.pipeline import DistillRequest, run_distill
    from models.distill.presets import Preset

    out = work / "student"
    if not (out / "student.json").is_file():
        preset = Preset(name="bench", queries_per_doc=1, max_queries=200, passages_per_epoch=100, val_docs=20,
                        epochs=1, max_steps=20)
        run_distill(DistillRequest(corpus=corpus, index=bundle, out=out, preset=preset, seed=1, force=True))
    return out


# --- server ------------------------------------------------------------------------------------------------

def start_server(root: Path, student: Path, port: int, token: str, log_path: Path,
                 processes: int = 1, workers: int | None = None) -> subprocess.Popen[bytes]:
    env = {"TANDEM_ADMIN_TOKEN": token, "TANDEM_LOG_FORMAT": "text"}
    if processes > 1:
        env["TANDEM_PROCESSES"] = str(processes)
    if (threads := workers_of(processes, workers)) is not None:
        env["TANDEM_WORKERS"] = str(threads)
    return start_process(tandem_serve_cmd(root, student, port), log_path, env)


# --- the reloads -------------------------------------------------------------------------------------------

def admin_status(client: httpx.Client, token: str) -> dict[str, object]:
    response = client.get("/admin/status", headers={"Authorization": f"Bearer {token}"})
    response.raise_for_status()
    status: dict[str, object] = response.json()
    return status


def reload_by_request(clients: dict[str, httpx.Client], token: str, root: Path, event: Event) -> None:
    """POST /admin/reload to every replica directly, one after the other: a reload request reaches only the
    process it is sent to (through a balancer, one replica), so a deploy script must address each."""
    for name, client in clients.items():
        start = time.perf_counter()
        response = client.post("/admin/reload", json={"path": str(root / event.target)},
                               headers={"Authorization": f"Bearer {token}"})
        body = response.json()
        outcome = body.get("outcome", "rejected" if response.status_code == 409 else f"HTTP {response.status_code}")
        event.replicas[name] = Switch(start, time.perf_counter(),
                                      {"trigger": "POST /admin/reload", **body, "outcome": outcome})
    event.settle()


def reload_by_pointer(clients: dict[str, httpx.Client], token: str, root: Path, event: Event) -> None:
    """Repoint CURRENT, then poll every replica's status until each watcher has recorded an outcome for that
    version; each replica's confirmation time is its own."""
    from models.bundle.versions import set_current

    start = time.perf_counter()
    set_current(root, event.target)
    deadline = time.monotonic() + WATCH_TIMEOUT_S
    while time.monotonic() < deadline and len(event.replicas) < len(clients):
        for name, client in clients.items():
            if name in event.replicas:
                continue
            status = admin_status(client, token)
            last, processes = status.get("last_reload"), status.get("processes")
            target = str(root / event.target)
            # with --processes N the status comes from one process: the switch counts once all of them serve it
            every = (event.expected != "switch" or not isinstance(processes, list)
                     or all(p.get("path") == target for p in processes))
            if isinstance(last, dict) and last.get("path") == target and every:
                event.replicas[name] = Switch(start, time.perf_counter(),
                                              {"trigger": "CURRENT pointer (watcher)", **last})
        time.sleep(0.05)
    if len(event.replicas) < len(clients):
        late = sorted(set(clients) - set(event.replicas))
        raise TimeoutError(f"the watcher of {', '.join(late)} did not act on {event.target} "
                           f"within {WATCH_TIMEOUT_S:g} s")
    event.settle()


def run_reloads(urls: dict[str, str], token: str, root: Path, events: list[Event], at: list[float]) -> None:
    clients = {name: httpx.Client(base_url=url, timeout=120.0, trust_env=False) for name, url in urls.items()}
    try:
        for event, when in zip(events, at, strict=True):
            time.sleep(max(0.0, when - time.perf_counter()))
            if event.name.startswith("POST"):
                reload_by_request(clients, token, root, event)
            else:
                reload_by_pointer(clients, token, root, event)
            log.info("%s: %s in %.2f s%s", event.name,
                     event.outcome.get("outcome", event.outcome.get("error")), event.end - event.start,
                     "" if len(clients) == 1 else " (replicas confirmed after " + ", ".join(
                         f"{name} {p.end - event.start:.2f} s" for name, p in event.replicas.items()) + ")")
    finally:
        for client in clients.values():
            client.close()


# --- checks --------------------------------------------------------------------------------------------------

def in_service(answer: Answer, first: str, switches: list[Event]) -> set[str]:
    """Versions that may have answered: those in service at any instant of [due, done]; inside a reload's
    window (request sent → swap confirmed) both the old and the new one. The window is that of the replica
    that answered where it is known, else from the first replica's trigger to the last one's confirmation."""
    allowed, current, since = set(), first, float("-inf")
    for event in switches:
        start, end = event.window(answer.replica)
        if answer.due < start and answer.done >= since:  # the steady stretch before this reload
            allowed.add(current)
        if answer.due <= end and answer.done >= start:  # the reload's window
            allowed |= {current, event.target}
        current, since = event.target, end
    if answer.done >= since:
        allowed.add(current)
    return allowed


@dataclass
class Verdict:
    failed: int
    misplaced: int
    corrupted_refused: bool
    corrupted_served: int
    switches_ok: bool
    versions_seen: list[str]  # in order of first appearance
    expected: list[str]
    stale_after_switch: int = 0  # answers sent after the last replica switched, from an older version
    after_switch: int = 0  # answers sent after the last replica switched (what the line above counts among)

    @property
    def passed(self) -> bool:
        return (self.failed == 0 and self.misplaced == 0 and self.corrupted_refused and self.corrupted_served == 0
                and self.switches_ok and self.versions_seen == self.expected and self.stale_after_switch == 0)


def stale_after_switch(answers: list[Answer], first: str, switches: list[Event]) -> tuple[int, int]:
    """Answers scheduled after every replica had confirmed a switch that still came from a version before it,
    and how many answers were scheduled after the first switch was complete everywhere."""
    stale, older = 0, {first}
    for event in switches:
        stale += sum(1 for a in answers if a.status == 200 and a.due > event.end and a.version in older)
        older.add(event.target)
    checked = sum(1 for a in answers if a.status == 200 and switches and a.due > switches[0].end)
    return stale, checked


def check(answers: list[Answer], first: str, events: list[Event], client_failures: int) -> Verdict:
    switches = [e for e in events if e.expected == "switch"]
    refused = [e for e in events if e.expected == "refused"]
    by_time = sorted(answers, key=lambda a: a.done)
    stale, checked = stale_after_switch(answers, first, switches)
    return Verdict(
        failed=max(sum(1 for a in answers if a.status != 200), client_failures),
        misplaced=sum(1 for a in answers if a.status == 200 and a.version not in in_service(a, first, switches)),
        corrupted_refused=all(e.outcome.get("outcome") == "rejected" for e in refused),
        corrupted_served=sum(1 for a in answers for e in refused if a.version == e.target),
        switches_ok=all(e.outcome.get("outcome") == "ok" for e in switches),
        versions_seen=list(dict.fromkeys(a.version for a in by_time if a.version is not None)),
        expected=[first, *[e.target for e in switches]],
        stale_after_switch=stale,
        after_switch=checked,
    )


def latency_split(answers: list[Answer], events: list[Event]) -> dict[str, dict[str, float]]:
    """Latency of answers that overlapped a reload window (±0.5 s) versus the rest."""

    def near(a: Answer) -> bool:
        return any(a.done >= e.start - 0.5 and a.due <= e.end + 0.5 for e in events)

    out = {}
    for name, group in (("during reloads", [a for a in answers if near(a)]),
                        ("steady", [a for a in answers if not near(a)])):
        ms = np.asarray([(a.done - a.due) * 1e3 for a in group if a.status == 200])
        if len(ms):
            out[name] = {"n": float(len(ms)), "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
                         "max": float(ms.max())}
    return out


# --- report ------------------------------------------------------------------------------------------------

def replica_rows(events: list[Event], t0: float) -> list[str]:
    """Per replica and reload: when it was asked (or CURRENT moved) and when its outcome was confirmed."""
    rows = ["| # | replica | asked at s | validated in s | confirmed after s | outcome |",
            "|---|---|---:|---:|---:|---|"]
    for i, e in enumerate(events, 1):
        for name, part in e.replicas.items():
            rows.append(f"| {i} | {name} | {part.start - t0:.1f} | {part.outcome.get('seconds', float('nan'))} | "
                        f"{part.end - e.start:.2f} | {part.outcome.get('outcome')} |")
    return rows


def render(command: str, setup: str, load_before: str, report_text: str, events: list[Event], verdict: Verdict,
           split: dict[str, dict[str, float]], t0: float, busy: bool, replicas: int = 1,
           answered_by: Counter[str | None] | None = None, note: str = "", processes: int = 1,
           workers: int | None = None) -> str:
    rows = ["| # | reload | trigger | at s | validated in s | confirmed after s | outcome |",
            "|---|---|---|---:|---:|---:|---|"]
    for i, e in enumerate(events, 1):
        outcome = str(e.outcome.get("outcome", ""))
        if e.outcome.get("error") or e.outcome.get("message"):
            reason = str(e.outcome.get("error") or e.outcome.get("message"))
            outcome += ": " + reason.split(": ", 1)[-1].split(";", 1)[0]  # e.g. "checksum mismatch (…)"
        rows.append(f"| {i} | {e.name} → `{e.target}` | {e.outcome.get('trigger')} | {e.start - t0:.1f} | "
                    f"{e.outcome.get('seconds', float('nan'))} | {e.end - e.start:.2f} | {outcome} |")
    lat = ["| answers | n | p50 ms | p99 ms | max ms |", "|---|---:|---:|---:|---:|"]
    lat += [f"| {name} | {int(v['n'])} | {v['p50']:.1f} | {v['p99']:.1f} | {v['max']:.1f} |"
            for name, v in split.items()]
    checks = [
        f"- failed requests: **{verdict.failed}**",
        f"- corrupted bundle refused: **{'yes' if verdict.corrupted_refused else 'NO'}**; answers from it: "
        f"**{verdict.corrupted_served}**",
        f"- versions seen, in order of first answer: {' → '.join(f'`{v}`' for v in verdict.versions_seen)} "
        f"(expected {' → '.join(f'`{v}`' for v in verdict.expected)})",
        f"- answers from a version that was not in service while they were in flight: **{verdict.misplaced}**",
        f"- answers sent after a switch was confirmed on every replica that came from an older version: "
        f"**{verdict.stale_after_switch}** (of {verdict.after_switch} answers sent after the first switch was "
        "complete)",
        f"- verdict: **{'PASS' if verdict.passed else 'FAIL'}**",
        "",
        "An answer is misplaced when its `index.version` was in service at no instant between its scheduled "
        "send and its answer; inside a reload's window (reload requested → swap confirmed by the admin answer "
        "or `/admin/status`) the old and the new version both count. \"Confirmed after\" includes the watcher's "
        "polling delay (up to 2 s) and the benchmark's own 50 ms status polling.",
    ]
    if replicas > 1:
        served = ", ".join(f"{name} {n}" for name, n in sorted((answered_by or Counter()).items(), key=str))
        checks += [
            "",
            f"{replicas} replicas behind nginx: each answer names its replica (`X-Tandem-Upstream`), and the "
            "window used for it is that replica's own. The CURRENT moves reach every replica through its "
            "watcher; `POST /admin/reload` was sent to each replica directly, one after the other (through "
            "the balancer it would reach one of them). Answers per replica: " + served + ".",
            "",
            *replica_rows(events, t0),
        ]
    cores = os.cpu_count() or 1
    if note:
        checks += ["", f"> {note}"]
    if busy:
        checks += ["", f"> The machine was busy before the run (1-min load above its {cores} cores: other jobs), "
                   "so latencies are inflated; the pass/fail checks do not depend on them."]
    title = ("# Hot reload under load" + ("" if replicas == 1 else f", {replicas} replicas behind nginx")
             + ("" if processes == 1 else f", {processes} processes each")
             + (", batches on the event loop" if workers == 0 else ""))
    return "\n".join([
        title, "",
        f"Command: `{command}`", "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {machine()}; "
        f"python {platform.python_version()}; load average {load_before} before the run",
        f"- Setup: {setup}", "",
        *rows, "", *checks, "", *lat, "", "```", report_text, "```",
    ])


# --- main ----------------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Hot reloads under open-loop load: no failed request, exact switches.")
    parser.add_argument("--student", type=Path, help="Student directory (default: distil a small one once).")
    parser.add_argument("--corpus", type=Path, help="Corpus JSONL (default: the demo corpus, --docs documents).")
    parser.add_argument("--docs", type=int, default=300, help="Documents of the default corpus.")
    parser.add_argument("--rps", type=float, default=40.0)
    parser.add_argument("--duration", type=float, default=30.0, help="Seconds of load; reloads at 1/4, 1/2, 3/4.")
    parser.add_argument("--replicas", type=int, default=1,
                        help="`tandem serve` processes on one bundle root; above 1, behind nginx.")
    parser.add_argument("--processes", type=int, default=1,
                        help="`tandem serve --processes N` per replica (one worker thread each); above 1, the run "
                        "has a section of its own.")
    parser.add_argument("--workers", type=int, default=None,
                        help="TANDEM_WORKERS of each process (default: 1 with --processes above 1, else the "
                        "server's default); 0, batches on the event loop, has a section of its own.")
    parser.add_argument("--note", default="", help="A line about the run's circumstances for the section "
                        "(e.g. other jobs on the machine).")
    parser.add_argument("--work", type=Path, default=REPO / ".tandem" / "bench" / "reload")
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging()
    from models.bundle.versions import set_current
    from tandem.loadtest import DEFAULT_QUERIES, format_report, run_loadtest
    from tandem.loadtest import Answer as LoadAnswer

    args.work.mkdir(parents=True, exist_ok=True)
    corpus = prepare_corpus(args.work, args.corpus, args.docs)
    root = args.work / "root"
    shutil.rmtree(root, ignore_errors=True)
    v1 = build_version(corpus, root, "float")
    v2 = build_version(corpus, root, "int8")
    v3 = build_version(corpus, root, "float")
    bad = corrupt_copy(root, v1)
    set_current(root, v1)
    student = prepare_student(args.work, corpus, root / v1, args.student)

    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1")
    if args.replicas > 1:
        nginx_binary()  # fail before building anything if nginx is missing
    token, ports = secrets.token_urlsafe(24), [free_port() for _ in range(args.replicas)]
    replica_urls = {f"127.0.0.1:{p}": f"http://127.0.0.1:{p}" for p in ports}
    load_before = load_average()[1]
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    processes: list[subprocess.Popen[bytes]] = []
    answers: list[Answer] = []
    events = [Event("POST /admin/reload", "switch", v2), Event("CURRENT pointer", "refused", bad),
              Event("CURRENT pointer", "switch", v3)]
    try:
        servers = [start_server(root, student, p, token, args.work / ("server.log" if args.replicas == 1
                                                                       else f"server-{i}.log"),
                                args.processes, args.workers)
                   for i, p in enumerate(ports)]
        processes += servers
        for server, replica in zip(servers, replica_urls.values(), strict=True):
            with httpx.Client(base_url=replica, timeout=10.0, trust_env=False) as client:
                wait_ready(client, server)
        if args.replicas == 1:
            url = next(iter(replica_urls.values()))
        else:
            lb_port = free_port()
            processes.append(start_nginx(args.work / "nginx", lb_port, ports))
            url = f"http://127.0.0.1:{lb_port}"
            with httpx.Client(base_url=url, timeout=10.0, trust_env=False) as client:
                wait_ready(client, processes[-1])
            log.info("nginx on %s in front of %s", url, ", ".join(replica_urls))

        def record(due: float, done: float, response: LoadAnswer) -> None:
            version = response.json().get("index", {}).get("version") if response.ok else None
            upstream = response.headers.get(UPSTREAM_HEADER.lower())  # "a, b" after a retry: the last one answered
            answers.append(Answer(due, done, response.status, version,
                                  upstream.split(",")[-1].strip() if upstream else None))

        t0 = time.perf_counter()
        at = [t0 + args.duration * f for f in (0.25, 0.5, 0.75)]
        reloads = threading.Thread(target=run_reloads, args=(replica_urls, token, root, events, at),
                                   name="reloads")
        reloads.start()
        report = run_loadtest(url, args.rps, args.duration, DEFAULT_QUERIES, {"errors": 0.0}, top_k=10,
                              on_response=record)
        reloads.join(timeout=WATCH_TIMEOUT_S * 3)
    finally:
        for process in reversed(processes):
            stop(process)

    verdict = check(answers, v1, events, report.failures)
    report_text = format_report(report)
    events_out = [{"name": e.name, "target": e.target, "seconds": round(e.end - e.start, 3), "outcome": e.outcome,
                   "replicas": {name: {"confirmed_after_s": round(p.end - e.start, 3), "outcome": p.outcome}
                                for name, p in e.replicas.items()}}
                  for e in events]
    log.info("load:\n%s", report_text)
    log.info("reloads and checks:\n%s", json.dumps({"verdict": asdict(verdict), "events": events_out}, indent=2,
                                                   default=str))
    log.info("%s", "PASS" if verdict.passed else "FAIL")
    command = command_line(argv)
    docs = Counter(a.version for a in answers)
    threads = workers_of(args.processes, args.workers)
    shape = ("default settings (2 workers" if args.processes == 1 and threads is None
             else f"{args.processes} process{'es' if args.processes > 1 else ''} ("
             + ("batches on the event loop" if threads == 0 else f"{threads} worker{'s' if threads != 1 else ''} each"))
    setup = (f"{args.docs if args.corpus is None else 'given'}-document corpus ({corpus.name}), 768-d bundles "
             f"`{v1}` (float), `{v2}` (int8), `{v3}` (float), `{bad}` (v1 with 16 bytes of index.faiss flipped); "
             + (f"`tandem serve` on 127.0.0.1 with {shape}, CURRENT polled every 2 s by each); "
                if args.replicas == 1 else
                f"{args.replicas} `tandem serve` replicas on 127.0.0.1, each with {shape}, "
                f"CURRENT polled every 2 s), behind Debian's nginx ({nginx_version()}, round robin, "
                f"`proxy_next_upstream error timeout`, the config in bench/harness/servers.py); ")
             + f"open-loop load {args.rps:g} rps for {args.duration:g} s through "
             + ("the server" if args.replicas == 1 else "nginx") + ", answers per version "
             + ", ".join(f"`{v}` {n}" for v, n in docs.items()))
    section = render(command.strip(), setup, load_before, report_text, events, verdict,
                     latency_split(answers, events), t0, busy, args.replicas, Counter(a.replica for a in answers),
                     args.note, args.processes, args.workers)
    publish(args.lab, section_name(args.replicas, args.processes, args.workers), section, write=not args.no_write)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
