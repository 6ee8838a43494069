"""Tandem's POST /search side by side with two peers that serve the same SciFact corpus with the teacher.

Why: tandem's claim is that a distilled student in front of the teacher's index answers faster and carries
more load than serving the teacher. This measures it against what people would otherwise run, in the same
run, on the same machine and corpus, with the same open-loop load generator (`tandem.loadtest`):

- txtai's API (`uvicorn txtai.api:app`), an index of the reference teacher vectors (exact FAISS flat),
  queries vectorized by the teacher through sentence-transformers (bench/serving/peer_txtai.py);
- the plain way: FastAPI + `SentenceTransformer(teacher)` + FAISS `IndexFlatIP` (bench/serving/peer_plain.py);
- `tandem serve` with its defaults: the student encodes queries, the bundle holds the same reference vectors.

Each server is started fresh, checked (its top 10 against exact search with the teacher's query vectors;
for txtai also its query vectors against models/encoders/teacher.py), warmed up, measured at a low open-loop rate
(latency), then up a ladder of rates (throughput: the highest step with no error, ≥ 95% of the target rate
answered and p99 within a bound), and stopped; its peak RSS is read from /proc first. Results go into a
dated record in the lab notebook (docs/lab/<date>-peers.md).

    python -m bench.serving.peers [--index .tandem/bundles/scifact-768-float] \
        [--student .tandem/students/scifact-trainq-4ep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np

from bench.encoding.encode_latency import DEFAULT_SCIFACT, busy_note, load_queries, versions
from bench.harness.record import (
    REPO,
    LoadSpan,
    add_output_args,
    command_line,
    machine,
    publish,
    start_logging,
)
from bench.harness.runs import module_cmd
from bench.harness.servers import Step, free_port, judge, rss_mib, start_process, stop, tandem_serve_cmd, wait_ready
from bench.serving.peer_txtai import FAISS_COMPONENTS, api_cmd, build_index, write_api_config
from tandem.loadclient import ConnectionPool
from tandem.loadtest import Answer, LoadReport, Request, Send, format_report, post_search, run_loadtest

log = logging.getLogger("bench.peers")

SECTION = "peers"
PEERS = ("txtai", "plain", "tandem")
DEFAULT_LADDER = "5,10,20,40,80,160,320,640"
REFERENCE = "all-mpnet-base-v2.corpus"  # the SciFact reference vectors: {REFERENCE}.f16.npy, {REFERENCE}.ids.json


def txtai_search(query: str, top_k: int) -> Request:
    return Request("GET", "/search?" + urlencode({"query": query, "limit": top_k}))


def result_ids(body: Any) -> list[str]:
    """Hit ids of a tandem or plain answer ({"results": [...]}) or of a txtai one (a bare list)."""
    hits = body["results"] if isinstance(body, dict) else body
    return [str(hit["id"]) for hit in hits]


@dataclass
class Peer:
    name: str
    describe: str  # for the setup line
    cmd: list[str]
    url: str
    ready_path: str
    send: Send = post_search
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    peer: Peer
    overlap: float  # mean top-k overlap with exact teacher search on the check queries
    cosine: float | None  # min cosine of the server's query vectors to the teacher's (txtai only)
    latency: LoadReport
    ladder: list[Step]
    peak_rss_mib: float | None

    @property
    def max_rps(self) -> float:
        passed = [s.report.target_rps for s in self.ladder if s.passed]
        return max(passed, default=0.0)


# --- checks --------------------------------------------------------------------------------------------------

@dataclass
class Reference:
    """Exact search with the teacher: the yardstick for every server's top k."""

    queries: list[str]
    vectors: np.ndarray  # teacher query vectors
    top: list[list[str]]


def reference(queries: list[str], teacher: Path, embeddings: Path, ids: Path, top_k: int) -> Reference:
    import torch

    from models.encoders.teacher import TeacherEncoder

    torch.set_num_threads(2)
    encoder = TeacherEncoder(teacher, device="cpu")
    vectors = encoder.encode_queries(queries, batch_size=8)
    del encoder
    docs = np.asarray(np.load(embeddings), dtype=np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    names = [str(i) for i in json.loads(ids.read_text())]
    top = [[names[r] for r in np.argsort(-scores, kind="stable")[:top_k]] for scores in vectors @ docs.T]
    return Reference(queries, vectors, top)


async def _ask(url: str, send: Send, queries: Sequence[str], top_k: int) -> list[Answer]:
    """One query at a time (warm-up and checks, not timed)."""
    async with ConnectionPool(url, timeout_s=120.0) as pool:
        return [await pool.request(send(q, top_k)) for q in queries]


def check_hits(peer: Peer, ref: Reference, top_k: int) -> float:
    answers = asyncio.run(_ask(peer.url, peer.send, ref.queries, top_k))
    for answer in answers:
        if not answer.ok:
            raise RuntimeError(f"{peer.name}: a check query got HTTP {answer.status}: {answer.body[:200]!r}")
    found = [result_ids(a.json()) for a in answers]
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, ref.top, strict=True)]))


def check_txtai_vectors(url: str, ref: Reference) -> float:
    """Min cosine between txtai's query vectors (GET /transform) and models/encoders/teacher.py's."""
    with httpx.Client(base_url=url, timeout=120.0, trust_env=False) as client:
        served = np.asarray([client.get("/transform", params={"text": q}).raise_for_status().json()
                             for q in ref.queries], dtype=np.float32)
    served /= np.linalg.norm(served, axis=1, keepdims=True)
    return float((served * ref.vectors).sum(axis=1).min())


# --- measurement ---------------------------------------------------------------------------------------------

def measure(peer: Peer, args: argparse.Namespace, queries: list[str], ref: Reference) -> Outcome:
    log.info("%s: starting `%s`", peer.name, shlex.join(peer.cmd))
    server = start_process(peer.cmd, args.work / f"{peer.name}.log", peer.env)
    try:
        with httpx.Client(base_url=peer.url, timeout=30.0, trust_env=False) as client:
            wait_ready(client, server, peer.ready_path)
        log.info("%s: ready (pid %d); checking against exact teacher search", peer.name, server.pid)
        overlap = check_hits(peer, ref, args.top_k)
        cosine = check_txtai_vectors(peer.url, ref) if peer.name == "txtai" else None
        log.info("%s: top-%d overlap with exact teacher search %.3f%s", peer.name, args.top_k, overlap,
                 "" if cosine is None else f"; query vectors' min cosine to the teacher's {cosine:.6f}")
        asyncio.run(_ask(peer.url, peer.send, queries[: args.warmup], args.top_k))
        latency = run_loadtest(peer.url, args.latency_rps, args.latency_duration, queries, {}, top_k=args.top_k,
                               send=peer.send)
        log.info("%s latency:\n%s", peer.name, format_report(latency))
        ladder: list[Step] = []
        for rps in args.ladder:
            step = judge(run_loadtest(peer.url, rps, args.step_duration, queries, {}, top_k=args.top_k,
                                      send=peer.send), args.p99_bound_ms, args.min_achieved)
            ladder.append(step)
            log.info("%s at %g rps: achieved %.1f, p99 %s ms: %s", peer.name, rps, step.report.achieved_rps,
                     step.report.latency_ms.get("p99", "n/a"), step.why)
            if not step.passed:
                break
        rss = rss_mib(server.pid)
    finally:
        stop(server)
    log.info("%s: stopped (exit %s), peak RSS %s MiB", peer.name, server.returncode,
             "n/a" if rss is None else f"{rss:.0f}")
    return Outcome(peer, overlap, cosine, latency, ladder, rss)


# --- report ------------------------------------------------------------------------------------------------

def peer_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    names = ("txtai", "sentence-transformers", "faiss-cpu", "fastapi", "uvicorn")
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} n/a")
    return f"{versions()}, " + ", ".join(found)


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def topped_out(outcome: Outcome) -> bool:
    """The server sustained the ladder's last step: its max rps is only a lower bound."""
    return bool(outcome.ladder) and outcome.ladder[-1].passed


def throughput_ratio(base: Outcome, peer: Outcome) -> str:
    if peer.max_rps == 0:
        return f"n/a ({peer.peer.name} sustained no step)"
    if topped_out(base) and topped_out(peer):
        return "n/a (both sustained the whole ladder: extend it)"
    bound = "≥ " if topped_out(base) else "≤ " if topped_out(peer) else ""
    return f"{bound}{base.max_rps / peer.max_rps:.1f}×"


def ratios(outcomes: list[Outcome]) -> list[str]:
    base = next((o for o in outcomes if o.peer.name == "tandem"), None)
    if base is None:
        return []
    lines = []
    for o in outcomes:
        if o is base:
            continue
        p50 = o.latency.latency_ms.get("p50", float("nan")) / base.latency.latency_ms.get("p50", float("nan"))
        rps = throughput_ratio(base, o)
        lines.append(f"- {o.peer.name}: p50 {o.peer.name} ÷ tandem = **{fmt(p50)}×**; "
                     f"max rps tandem ÷ {o.peer.name} = **{rps}**")
    return lines


def render(command: str, setup: str, load: str, note: str | None, outcomes: list[Outcome],
           args: argparse.Namespace) -> str:
    rows = [f"| server | p50 ms | p90 ms | p99 ms | max sustained rps | peak RSS MiB | top-{args.top_k} overlap "
            "with exact teacher search |", "|---|---:|---:|---:|---:|---:|---:|"]
    for o in outcomes:
        lat = o.latency.latency_ms
        sustained = f"{o.max_rps:g}" if o.max_rps else f"< {args.ladder[0]:g}"
        if topped_out(o):
            sustained = f"≥ {sustained} (ladder top)"
        rows.append(f"| {o.peer.name} | {fmt(lat.get('p50'))} | {fmt(lat.get('p90'))} | {fmt(lat.get('p99'))} | "
                    f"{sustained} | {fmt(o.peak_rss_mib, 0)} | {o.overlap:.3f} |")
    steps = ["| server | target rps | achieved rps | p50 ms | p99 ms | errors | verdict |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for o in outcomes:
        for s in o.ladder:
            r = s.report
            errors = sum(r.errors.values()) + sum(n for c, n in r.status.items() if not c.startswith("2"))
            steps.append(f"| {o.peer.name} | {r.target_rps:g} | {r.achieved_rps:.1f} | "
                         f"{fmt(r.latency_ms.get('p50'))} | {fmt(r.latency_ms.get('p99'))} | {errors} | {s.why} |")
    return "\n".join([
        "# Tandem and its peers: txtai, the plain way", "",
        f"Command: `{command}`", "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {machine()}; {peer_versions()}; load average {load}",
        f"- Setup: {setup}", "",
        *([note, ""] if note else []),
        f"Latency at {args.latency_rps:g} rps open loop for {args.latency_duration:g} s (from the scheduled send), "
        f"throughput up the ladder ({args.step_duration:g} s a step):", "",
        *rows, "",
        "Ratios (peer ÷ tandem for latency, tandem ÷ peer for throughput):", "",
        *(ratios(outcomes) or ["- (needs tandem and at least one peer)"]), "",
        "Ladder:", "",
        *steps, "",
        f"A step is sustained with no error, at least {args.min_achieved:.0%} of the target rate answered with 2xx, "
        f"and p99 ≤ {args.p99_bound_ms:g} ms; the ladder stops at the first step that is not. Peak RSS is the "
        "server process's `VmHWM` after all its load. Max rps, and so its ratios, are only as fine as the ladder's "
        "steps. The overlap is the mean share of a server's top "
        f"{args.top_k} found by exact search with the teacher's query vectors (models/encoders/teacher.py), over the "
        "check queries: 1.0 for servers that run the teacher, lower for tandem's student by design.",
    ])


# --- main ----------------------------------------------------------------------------------------------------

def floats(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("expected positive numbers separated by commas")
    return sorted(values)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="tandem's POST /search vs txtai's API and a plain FastAPI server.")
    parser.add_argument("--index", type=Path, default=REPO / ".tandem" / "bundles" / "scifact-768-float",
                        help="tandem bundle built from the SciFact reference vectors.")
    parser.add_argument("--student", type=Path, default=REPO / ".tandem" / "students" / "scifact-trainq-4ep")
    parser.add_argument("--teacher", type=Path,
                        help="Teacher directory (default: as models/encoders/registry.py resolves).")
    parser.add_argument("--scifact", type=Path, default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)),
                        help="SciFact directory: corpus, queries, reference/ vectors (default: $TANDEM_SCIFACT_DIR "
                             "or ../shared/data/scifact).")
    parser.add_argument("--peers", default=",".join(PEERS), help="Servers to measure, in this order.")
    parser.add_argument("--queries", type=int, default=300, help="SciFact test queries the load cycles through.")
    parser.add_argument("--check-queries", type=int, default=20, help="Queries of the top-k and vector checks.")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=20, help="Untimed queries, one at a time, per server.")
    parser.add_argument("--latency-rps", type=float, default=2.0)
    parser.add_argument("--latency-duration", type=float, default=30.0, help="Seconds of the latency run.")
    parser.add_argument("--ladder", type=floats, default=floats(DEFAULT_LADDER), help="Open-loop rates to climb.")
    parser.add_argument("--step-duration", type=float, default=15.0, help="Seconds per ladder step.")
    parser.add_argument("--p99-bound-ms", type=float, default=500.0, help="Highest p99 of a sustained step.")
    parser.add_argument("--min-achieved", type=float, default=0.95, help="Share of the target rate to answer.")
    parser.add_argument("--work", type=Path, default=REPO / ".tandem" / "bench" / "peers",
                        help="txtai index, configs and server logs.")
    add_output_args(parser)
    args = parser.parse_args(argv)
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if not args.peers or set(args.peers) - set(PEERS):
        parser.error(f"--peers: choose among {', '.join(PEERS)}")
    if min(args.queries, args.check_queries, args.top_k) < 1 or args.warmup < 0:
        parser.error("--queries, --check-queries and --top-k must be >= 1, --warmup >= 0")
    return args


def make_peers(args: argparse.Namespace, teacher: Path, embeddings: Path, ids: Path) -> dict[str, Callable[[], Peer]]:
    """Each peer's launch, prepared only when it is measured (the txtai index is rebuilt each run: seconds)."""

    def txtai() -> Peer:
        index = args.work / "txtai-index"
        build_index(index, args.scifact / "corpus.jsonl", embeddings, ids, teacher)
        config = write_api_config(args.work / "txtai.yml", index)
        port = free_port()
        return Peer("txtai", f"txtai {FAISS_COMPONENTS} (exact) index of the same vectors with content, queries by "
                    "`SentenceTransformer(teacher)` (txtai method `sentence-transformers`), torch's default threads, "
                    "`CONFIG=txtai.yml uvicorn txtai.api:app` (one search at a time, under its lock), "
                    "`GET /search?query=…&limit=k` (answers id, text, score)",
                    api_cmd(port), f"http://127.0.0.1:{port}", f"/search?query=ready&limit={args.top_k}",
                    txtai_search, {"CONFIG": str(config)})

    def plain() -> Peer:
        port = free_port()
        cmd = module_cmd("bench.serving.peer_plain", "--teacher", str(teacher), "--embeddings", str(embeddings),
                         "--ids", str(ids), "--port", str(port))
        return Peer("plain", "bench/serving/peer_plain.py: FastAPI on uvicorn (as `tandem serve` runs it), sync "
                    "endpoint in FastAPI's thread pool, `SentenceTransformer(teacher, device=\"cpu\")` with 2 torch "
                    "threads, FAISS `IndexFlatIP` of the same vectors, `POST /search` (answers id, score)",
                    cmd, f"http://127.0.0.1:{port}", "/readyz")

    def tandem() -> Peer:
        port = free_port()
        return Peer("tandem", f"`tandem serve` with its defaults, bundle `{args.index.name}` (the same vectors), "
                    f"student `{args.student.name}`, `POST /search` (answers id, score, title, text)",
                    tandem_serve_cmd(args.index, args.student, port), f"http://127.0.0.1:{port}", "/readyz",
                    env={"TANDEM_LOG_FORMAT": "text"})

    return {"txtai": txtai, "plain": plain, "tandem": tandem}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from models.encoders.registry import resolve

    teacher = resolve("teacher", args.teacher)
    embeddings = args.scifact / "reference" / f"{REFERENCE}.f16.npy"
    ids = args.scifact / "reference" / f"{REFERENCE}.ids.json"
    args.work.mkdir(parents=True, exist_ok=True)
    queries, described = load_queries(args.scifact, args.queries)
    log.info("queries: %s", described)
    span = LoadSpan()
    note = busy_note(span.busy, 2)
    if note:
        log.warning("%s", note.removeprefix("> Warning: "))
    ref = reference(queries[: args.check_queries], teacher, embeddings, ids, args.top_k)
    launchers = make_peers(args, teacher, embeddings, ids)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    try:
        for name in args.peers:
            outcomes.append(measure(launchers[name](), args, queries, ref))
    except (RuntimeError, TimeoutError, httpx.HTTPError, OSError, subprocess.SubprocessError) as exc:
        log.error("%s (server logs in %s)", exc, args.work)
        return 1
    log.info("all servers measured in %.0f s", time.monotonic() - started)
    for line in ratios(outcomes):
        log.info("%s", line.removeprefix("- ").replace("**", ""))
    txtai_check = next((o for o in outcomes if o.cosine is not None), None)
    setup = " ".join([
        f"Queries: {described}, for the load; the {len(ref.queries)} first of them for the checks.",
        f"Documents: the {len(json.loads(ids.read_text())):,} reference teacher vectors "
        f"`reference/{REFERENCE}.f16.npy` for every server, so no server encoded the corpus. "
        "Servers, one at a time, each started fresh, on 127.0.0.1:",
        "; ".join(f"**{o.peer.name}**: {o.peer.describe}" for o in outcomes) + ".",
        *([f"txtai's query vectors (`GET /transform`) against models/encoders/teacher.py's: min cosine "
           f"{txtai_check.cosine:.6f}."] if txtai_check else []),
        f"Load: `tandem.loadtest` open loop in the benchmark's process (10 s client timeout), cycling the queries, "
        f"top {args.top_k}; {args.warmup} untimed queries one at a time before it.",
    ])
    command = command_line()
    load = span.text()
    section = render(command, setup, load, note, outcomes, args)
    publish(args.lab, SECTION, section, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
