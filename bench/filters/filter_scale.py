"""Filters at scale: what a filtered /search costs at 1M documents, its recall against exact filtered search,
the planner's two plans side by side, and the payload index's memory.

Why: a filter used to be SQLite's JSON functions over every row of the docstore on each request (500 ms and
more at 1M documents, a broad one past the deadline); the payload index (models.bundle.payload.index) and the planner
(models.search.planner) should make a filtered request cost about what an unfiltered one does. In one run:

1. Inputs: `--n` synthetic documents (SciFact's teacher vectors plus covariance-shaped noise, as
   bench/index/index_types.py makes them) with payload keys on each line, built with `--metadata-extra` by
   `tandem index build` importing the vectors: `r` (an integer uniform in [0, 10000): `r < t` selects t/10000 of
   the corpus), `year` (35 values), `tag` (26 letters, declared keyword), `labels` (0 to 3 of 100 labels,
   declared keyword-list). Bundles: flat binary and HNSW binary at `--dim`.
2. Exact filtered search, the reference: each query's top 10 by the float inner product over the rows each
   filter allows (the bench's own evaluation of the filter over the metadata it generated).
3. The plans, in process: `models.search.search` for one query at a time with each plan forced (the exact pass
   over the allowed rows, and FAISS with an ID selector), per selectivity: p50/p99 of the search call and
   recall@10. Where one overtakes the other places the planner's crossover (EXACT_SHARE).
4. The service: `tandem serve` on each bundle with its default settings, one request at a time (SciFact's test
   queries), unfiltered and per filter: p50/p99 of the whole request as the client sees it, non-200 answers,
   recall@10, the server's `timing_ms.filter`. With `--baseline REV`, the same requests to REV's code serving the
   same bundle (hard links, manifest without the payload index), which filters through SQLite.
5. Memory: anonymous RSS a process gains opening the payload index and evaluating every filter, and the payload
   files' bytes (memory-mapped, on disk), per document per field.

    python -m bench.filters.filter_scale --student /work/bench-35/student --work /work/bench-35 --baseline e801d5e
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

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
from bench.harness.runs import module_cmd
from bench.harness.servers import free_port, rss_mib, start_process, stop, tandem_serve_cmd, wait_ready
from bench.index.index_types import DEFAULT_REFERENCE, anon_rss_bytes, bundle_for, synthetic_inputs

log = logging.getLogger("bench.filter_scale")

SECTION = "filter-scale"
K = 10
CHUNK = 65_536
LETTERS = [chr(ord("a") + i) for i in range(26)]
THRESHOLDS = (1, 10, 100, 300, 500, 1000, 2000, 3000, 5000, 9000, 9700)  # r < t: t/10000 of the corpus


@dataclass(frozen=True)
class Case:
    name: str
    body: dict[str, object]
    allows: Callable[[dict[str, np.ndarray]], np.ndarray]  # the bench's own evaluation, over its columns


def cases() -> list[Case]:
    out = [Case(f"r < {t}", {"field": "r", "lt": t}, lambda c, t=t: c["r"] < t) for t in THRESHOLDS]
    out += [
        Case("year = 2000", {"field": "year", "eq": 2000}, lambda c: c["year"] == 2000),
        Case("year >= 1991", {"field": "year", "gte": 1991}, lambda c: c["year"] >= 1991),
        Case("tag in [a, b]", {"field": "tag", "in": ["a", "b"]}, lambda c: c["tag"] < 2),
        Case("labels = l7", {"field": "labels", "eq": "l7"}, lambda c: c["labels"][:, 7]),
        Case("tag = q and year = 2000", {"and": [{"field": "tag", "eq": "q"}, {"field": "year", "eq": 2000}]},
             lambda c: (c["tag"] == 16) & (c["year"] == 2000)),
        Case("r < 9700 and not tag = q", {"and": [{"field": "r", "lt": 9700}, {"not": {"field": "tag", "eq": "q"}}]},
             lambda c: (c["r"] < 9700) & (c["tag"] != 16)),
    ]
    return out


# --- inputs and bundles --------------------------------------------------------------------------------------

def make_inputs(work: Path, n: int, reference: Path) -> Path:
    """The synthetic inputs (index_types.synthetic_inputs) with payload keys, and their columns.npz, made once."""
    directory = work / f"inputs-{n}"
    if (directory / "columns.npz").is_file() and (directory / "ids.json").is_file():
        return directory
    rng = np.random.default_rng(n + 1)
    columns = {"r": rng.integers(0, 10_000, n), "year": rng.integers(1966, 2001, n), "tag": rng.integers(0, 26, n)}
    counts = rng.integers(0, 4, n)
    labels = np.zeros((n, 100), dtype=bool)
    picks = rng.integers(0, 100, (n, 3))
    for j in range(3):
        chosen = counts > j
        labels[np.flatnonzero(chosen), picks[chosen, j]] = True

    def payload(i: int) -> dict[str, object]:
        return {"r": int(columns["r"][i]), "year": int(columns["year"][i]), "tag": LETTERS[columns["tag"][i]],
                "labels": [f"l{j}" for j in np.flatnonzero(labels[i])]}

    synthetic_inputs(directory, n, reference, payload)
    if not (directory / "columns.npz").is_file():
        np.savez(directory / "columns.npz", labels=labels, **columns)
    return directory


def build(inputs: Path, index: str, dim: int) -> Path:
    return bundle_for(inputs, index, "binary", "--dim", str(dim), "--metadata-extra", "--field", "tag:keyword",
                      "--field", "labels:keyword-list", name=f"bundle-{index}-binary-{dim}")


def without_payload(bundle: Path, work: Path) -> Path:
    """The bundle as the code before the payload index reads it: hard links to its files, a manifest without
    `payload` (older code refuses unknown manifest keys)."""
    out = work / f"{bundle.name}-no-payload"
    if out.exists():
        shutil.rmtree(out)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.pop("payload", None)
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith("payload/")}
    for name in manifest["files"]:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(bundle / name, out / name)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def baseline_tree(rev: str, work: Path) -> Path:
    """REV's source tree (git archive: no worktree), where `python -m tandem` runs REV's code."""
    out = work / f"tree-{rev}"
    if not out.is_dir():
        out.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO, check=True, capture_output=True)
        tar = out / "tree.tar"
        tar.write_bytes(archive.stdout)
        with tarfile.open(tar) as fh:
            fh.extractall(out, filter="data")
        tar.unlink()
    return out


# --- the reference -------------------------------------------------------------------------------------------

def exact_top(vectors: Path, queries: np.ndarray, masks: dict[str, np.ndarray | None],
              dim: int) -> dict[str, np.ndarray]:
    """Each mask's exact top K rows per query by the float inner product at `dim` (None: every row)."""
    docs = np.load(vectors, mmap_mode="r")
    q = np.ascontiguousarray(queries[:, :dim], dtype=np.float32)
    best = {name: (np.full((len(q), 0), -np.inf, np.float32), np.zeros((len(q), 0), np.int64)) for name in masks}
    for start in range(0, len(docs), CHUNK):
        scores = q @ np.asarray(docs[start : start + CHUNK, :dim], dtype=np.float32).T
        rows = np.arange(start, start + scores.shape[1])
        for name, mask in masks.items():
            s = scores if mask is None else np.where(mask[rows], scores, -np.inf)
            top = np.argpartition(-s, min(K, s.shape[1] - 1), axis=1)[:, :K]
            cand_s = np.concatenate([best[name][0], np.take_along_axis(s, top, 1)], axis=1)
            cand_r = np.concatenate([best[name][1], rows[top]], axis=1)
            keep = np.argsort(-cand_s, axis=1, kind="stable")[:, :K]
            best[name] = (np.take_along_axis(cand_s, keep, 1), np.take_along_axis(cand_r, keep, 1))
    return {name: np.where(np.isfinite(s), r, -1) for name, (s, r) in best.items()}


def timed_plan(bundle: Any, encoder: Any, texts: Sequence[str], flt: Any, planner: Any,
               rounds: int) -> tuple[list[float], list[list[int]]]:
    """Each text encoded alone, then searched with `planner` (the search timed, not the encode), `rounds` times:
    the seconds of each search and the rows of its hits."""
    from models.search import SearchOptions, search

    times: list[float] = []
    found: list[list[int]] = []
    for _ in range(rounds):
        for text in texts:
            vector = encoder.encode([text], batch_size=1)
            began = time.perf_counter()
            hits = search(bundle, vector, [text], SearchOptions(top_k=K, filter=flt), 4, planner).hits[0]
            times.append(time.perf_counter() - began)
            found.append([h.row for h in hits])
    return times, found


def recall(found: Sequence[Sequence[int]], truth: np.ndarray) -> float:
    """Mean share of each query's exact top K (fewer when fewer rows are allowed) among its hits."""
    shares = []
    for hits, exact in zip(found, truth, strict=True):
        wanted = set(exact[exact >= 0].tolist())
        if wanted:
            shares.append(len(wanted & set(hits)) / len(wanted))
    return float(np.mean(shares)) if shares else float("nan")


# --- the plans, in process -----------------------------------------------------------------------------------

@dataclass
class PlanRow:
    index: str
    case: str
    share: float
    plan: str
    p50_ms: float
    p99_ms: float
    recall: float


def measure_plans(bundle_dir: Path, index: str, encoder: Any, texts: list[str], truth: dict[str, np.ndarray],
                  shares: dict[str, float], rounds: int) -> list[PlanRow]:
    """Each plan forced, per selectivity, one query at a time. Each query is encoded by the student just before its
    search, as the service does: right after an encode, FAISS's selector scan ran twice as slow as on its own,
    so timing searches back to back would misplace the crossover."""
    from models.bundle.version import Bundle
    from models.search import parse_filter, set_search_threads
    from models.search.planner import Planner

    set_search_threads(1)
    bundle = Bundle(bundle_dir, lexical=False)
    rows: list[PlanRow] = []
    plans = [("exact", Planner(exact_share=1.0)), ("index", Planner(exact_share=0.0))]
    try:
        for case in [Case("none", {}, lambda c: c["r"] >= 0), *cases()[: len(THRESHOLDS)]]:
            flt = parse_filter(case.body, bundle.filter_fields) if case.body else None
            for plan, planner in plans[:1] if flt is None else plans:
                times, found = timed_plan(bundle, encoder, texts, flt, planner, rounds)
                row = PlanRow(index, case.name, shares[case.name], plan if flt is not None else "none",
                              1e3 * float(np.percentile(times, 50)), 1e3 * float(np.percentile(times, 99)),
                              recall(found[: len(texts)], truth[case.name]))
                log.info("%s", row)
                rows.append(row)
    finally:
        bundle.close()
    return rows


# --- the service ---------------------------------------------------------------------------------------------

@dataclass
class ServiceRow:
    index: str
    case: str
    share: float
    p50_ms: float
    p99_ms: float
    errors: int
    recall: float
    filter_ms: float  # the server's timing_ms.filter, median
    search_ms: float  # the server's timing_ms.search, median
    requests: int


@dataclass
class Served:
    rows: list[ServiceRow] = field(default_factory=list)
    rss_mib: float = 0.0
    vector_gap: float = 0.0  # largest |server's query vector − the bench's|


def _serve(bundle: Path, student: Path, work: Path, tree: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = start_process(tandem_serve_cmd(bundle, student, port), work / f"serve-{bundle.name}.log",
                            {"TANDEM_LOG_FORMAT": "text", "TANDEM_LOG_LEVEL": "WARNING"}, cwd=tree)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
        wait_ready(client, process)
    return process, url


def measure_service(bundle: Path, index: str, student: Path, work: Path, texts: list[str], vectors: np.ndarray,
                    truth: dict[str, np.ndarray], shares: dict[str, float], requests: int,
                    tree: Path = REPO, only: Sequence[str] | None = None) -> Served:
    process, url = _serve(bundle, student, work, tree)
    served = Served()
    try:
        with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
            if tree == REPO:
                got = [client.post("/v1/embeddings", json={"input": t, "model": "x"}).json()["data"][0]["embedding"]
                       for t in texts[:20]]
                served.vector_gap = float(np.abs(np.asarray(got, dtype=np.float32) - vectors[:20]).max())
            for _ in range(3):  # warm
                client.post("/search", json={"query": texts[0], "top_k": K})
            for name, body in [("none", None), *((c.name, c.body) for c in cases())]:
                if only is not None and name not in only:
                    continue
                times, found, statuses, filter_ms, search_ms = [], [], [], [], []
                for i in range(requests):
                    request = {"query": texts[i % len(texts)], "top_k": K, "fields": ["id"]}
                    if body is not None:
                        request["filter"] = body
                    began = time.perf_counter()
                    response = client.post("/search", json=request)
                    times.append(time.perf_counter() - began)
                    statuses.append(response.status_code)
                    if response.status_code == 200:
                        answer = response.json()
                        filter_ms.append(answer["timing_ms"].get("filter", 0.0))
                        search_ms.append(answer["timing_ms"]["search"])
                        if i < len(texts):
                            found.append([int(h["id"][3:]) for h in answer["results"]])
                    elif i < len(texts):
                        found.append([])
                row = ServiceRow(index, name, shares[name], 1e3 * float(np.percentile(times, 50)),
                                 1e3 * float(np.percentile(times, 99)), sum(s != 200 for s in statuses),
                                 recall(found, truth[name][: len(found)]),
                                 float(np.median(filter_ms)) if filter_ms else float("nan"),
                                 float(np.median(search_ms)) if search_ms else float("nan"), requests)
                log.info("%s", row)
                served.rows.append(row)
        served.rss_mib = rss_mib(process.pid, "VmRSS") or float("nan")
    finally:
        stop(process)
    return served


# --- memory --------------------------------------------------------------------------------------------------

def measure_memory(bundle: Path) -> dict[str, object]:
    """In a fresh process: anonymous RSS gained opening the payload index and evaluating every case."""
    out = subprocess.run(module_cmd("bench.filters.filter_scale", "--memory-of", str(bundle)), check=True,
                         capture_output=True, text=True, cwd=REPO)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _status_bytes(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1]) * 1024
    return 0


def memory_child(bundle: Path) -> None:
    import gc

    from models.bundle.payload.index import PayloadIndex
    from models.bundle.payload.writer import part_name
    from models.bundle.version import read_bundle_manifest
    from models.search import parse_filter

    manifest = read_bundle_manifest(bundle)
    assert manifest.payload is not None
    before, file_before = anon_rss_bytes(), _status_bytes("RssFile")
    payload = PayloadIndex(bundle, manifest.payload, manifest.count)
    opened = anon_rss_bytes()
    fields = frozenset(f.name for f in manifest.payload.fields)
    for case in cases():
        mask = payload.evaluate(parse_filter(case.body, fields).tree, lambda leaf: np.zeros(0, dtype=bool))
        del mask
    gc.collect()
    after, file_after = anon_rss_bytes(), _status_bytes("RssFile")
    files = {f.name: sum((bundle / part_name(i, part)).stat().st_size
                         for part in ("dict", "dict_offsets", "offsets", "rows", "absent", "values")
                         if (bundle / part_name(i, part)).is_file())
             for i, f in enumerate(manifest.payload.fields)}
    print(json.dumps({"count": manifest.count, "fields": len(files), "opened": opened - before,
                      "after_filters": after - before, "mapped": file_after - file_before, "file_bytes": files,
                      "types": {f.name: f.type.value for f in manifest.payload.fields}}))


# --- report --------------------------------------------------------------------------------------------------

def render(args: argparse.Namespace, plans: list[PlanRow], served: dict[str, Served], base: Served | None,
           memory: dict[str, object] | None, loads: str, command: str, student_note: str) -> str:
    n = args.n
    lines = [f"# Filters at scale: {n:,} documents, flat and HNSW binary ({time.strftime('%Y-%m-%d')})", "",
             f"Command: `{command}`", "",
             f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- Machine: {machine()}; load {loads}",
             f"- Setup: {n:,} synthetic documents (SciFact teacher vectors plus covariance-shaped noise), imported by "
             f"`tandem index build --quantization binary --dim {args.dim} --metadata-extra --field tag:keyword "
             f"--field labels:keyword-list` (`r` and `year` inferred integers); binary first stage, int8 rescoring "
             f"×4 memory-mapped. Queries: {len(args.texts)} SciFact test queries, {student_note}. Reference: exact "
             f"filtered search (float inner product at {args.dim} over the rows the filter allows, evaluated by the "
             "bench over the values it generated).", ""]
    if served:
        lines += service_lines(args, served)
    if base is not None:
        lines += ["", f"## Before: `{args.baseline}` serving the same flat bundle (SQLite JSON filters)", "",
                  f"The same requests, {args.baseline_requests} per row, to the code at `{args.baseline}` serving "
                  "the flat bundle through hard links with a manifest without the payload index.", "",
                  "| filter | share | p50 ms | p99 ms | errors (503: deadline) | recall@10 |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r.case} | {100 * r.share:.2f}% | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | {r.recall:.3f} |"
                  for r in base.rows]
    if plans:
        lines += plan_lines(args, plans)
    if memory is not None:
        lines += memory_lines(memory)
    for index, result in served.items():
        lines.append(f"\nServer RSS after the {index} run: {result.rss_mib:.0f} MiB. Largest difference between the "
                     f"server's query vectors and the bench's: {result.vector_gap:.2e}.")
    return "\n".join(lines) + "\n"


def service_lines(args: argparse.Namespace, served: dict[str, Served]) -> list[str]:
    lines = ["## The service (default planner)", "",
              f"`tandem serve` with default settings, one request at a time, {args.requests} requests per row "
              "(the queries in turn), `top_k` 10, `fields: [\"id\"]`. p50/p99: the whole request at the client. "
              "Recall@10 against exact filtered search over the first requests (one per query). "
              "`filter ms`, `search ms`: the server's `timing_ms.filter` and `timing_ms.search`, medians. Errors: "
              "answers other than 200. ✓: p99 within the budget, no error and recall@10 at least the unfiltered "
              "recall − 0.02.", "",
              "| index | filter | share | p50 ms | p99 ms | budget: 2×p99(none)+10 | errors | recall@10 | "
              "unfiltered recall − 0.02 | filter ms | search ms |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for index, result in served.items():
        none = next(r for r in result.rows if r.case == "none")
        budget = 2 * none.p99_ms + 10
        for r in result.rows:
            ok = "" if r.case == "none" else (" ✓" if r.p99_ms <= budget and r.errors == 0 and
                                              r.recall >= none.recall - 0.02 else " ✗")
            lines.append(f"| {index} | {r.case} | {100 * r.share:.2f}% | {r.p50_ms:.1f} | {r.p99_ms:.1f}{ok} | "
                         f"{budget:.1f} | {r.errors} | {r.recall:.3f} | {none.recall - 0.02:.3f} | {r.filter_ms:.2f} | "
                         f"{r.search_ms:.2f} |")
    return lines


def plan_lines(args: argparse.Namespace, plans: list[PlanRow]) -> list[str]:
    lines = ["", "## The plans, forced, in process", "",
              f"`models.search.search` for one query at a time ({len(args.texts)} queries × {args.rounds} rounds, "
              "FAISS threads 1, no HTTP), each query encoded by the student just before its search as in the "
              "service (only the search is timed; `none`: unfiltered): `exact` scores the allowed rows (binary: "
              "Hamming over their sign codes, then int8 rescoring of the best 40), `index` is FAISS with an "
              "IDSelectorBitmap (HNSW widened: efSearch = max(64, 40 / share), at most 1024). The default "
              "planner scores exactly at or below the share in models.search.planner.EXACT_SHARE.", "",
              "| index | filter | share | exact p50 | exact p99 | exact recall@10 | index p50 | index p99 | "
              "index recall@10 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (index, case), pair in _pairs(plans).items():
        if "none" in pair:
            n = pair["none"]
            lines.append(f"| {index} | none | 100% | | | | {n.p50_ms:.2f} | {n.p99_ms:.2f} | {n.recall:.3f} |")
            continue
        e, x = pair["exact"], pair["index"]
        lines.append(f"| {index} | {case} | {100 * e.share:.2f}% | {e.p50_ms:.2f} | {e.p99_ms:.2f} | {e.recall:.3f} | "
                     f"{x.p50_ms:.2f} | {x.p99_ms:.2f} | {x.recall:.3f} |")
    return lines


def memory_lines(memory: dict[str, object]) -> list[str]:
    count = int(memory["count"])  # type: ignore[call-overload]
    fields = int(memory["fields"])  # type: ignore[call-overload]
    lines = ["", "## Memory", "",
              f"A fresh process opening the flat bundle's payload index ({fields} fields) and evaluating every filter "
              f"above once: anonymous RSS {memory['opened']:+,} bytes on opening, {memory['after_filters']:+,} bytes "
              f"after the filters, i.e. {int(memory['after_filters']) / (count * fields):.3f} bytes per document per "  # type: ignore[call-overload]
              f"field in RAM; the columns are memory-mapped: the pages the filters read, {memory['mapped']:,} bytes, "
              "are page cache the kernel may evict, not process memory.", "",
              "| field | type | file bytes per document (disk, memory-mapped) |", "|---|---|---:|"]
    for name, size in memory["file_bytes"].items():  # type: ignore[attr-defined]
        lines.append(f"| {name} | {memory['types'][name]} | {size / count:.2f} |")  # type: ignore[index]
    return lines


def _pairs(plans: list[PlanRow]) -> dict[tuple[str, str], dict[str, PlanRow]]:
    out: dict[tuple[str, str], dict[str, PlanRow]] = {}
    for row in plans:
        out.setdefault((row.index, row.case), {})[row.plan] = row
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--student", type=Path, help="Student directory the servers encode queries with.")
    p.add_argument("--work", type=Path, default=Path("/tmp/tandem-filter-scale"), help="Inputs and bundles (kept).")
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--indexes", default="flat,hnsw")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--requests", type=int, default=300, help="Requests per row of the service table.")
    p.add_argument("--rounds", type=int, default=1, help="Rounds over the queries per forced plan, in process.")
    p.add_argument("--baseline", default=None, help="A git revision whose code serves the flat bundle for a 'before'.")
    p.add_argument("--baseline-requests", type=int, default=40)
    p.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    p.add_argument("--scifact", type=Path, default=DEFAULT_SCIFACT)
    p.add_argument("--parts", default="plans,service,memory",
                   help="What to measure, of plans, service and memory (the inputs and bundles are made first).")
    p.add_argument("--memory-of", type=Path, help=argparse.SUPPRESS)
    return parse_with_output(p, argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.memory_of is not None:
        memory_child(args.memory_of)
        return
    start_logging()
    if args.student is None:
        raise SystemExit("--student is required")
    span = LoadSpan()
    inputs = make_inputs(args.work, args.n, args.reference)
    bundles = {index: build(inputs, index, args.dim) for index in args.indexes.split(",")}
    columns = dict(np.load(inputs / "columns.npz"))
    masks: dict[str, np.ndarray | None] = {"none": None, **{c.name: c.allows(columns) for c in cases()}}
    shares = {name: 1.0 if m is None else float(m.mean()) for name, m in masks.items()}
    del columns

    from models.encoders.student import StudentEncoder

    texts, source = load_queries(args.scifact, args.queries)
    args.texts = texts
    encoder = StudentEncoder(args.student, "int8", 1)
    vectors = np.concatenate([encoder.encode([t], batch_size=1) for t in texts])
    truth = exact_top(inputs / "vectors.f16.npy", vectors, masks, args.dim)
    log.info("exact references ready for %d filters", len(truth))

    parts = set(args.parts.split(","))
    plans: list[PlanRow] = []
    if "plans" in parts:
        for index, path in bundles.items():
            plans += measure_plans(path, index, encoder, texts, truth, shares, args.rounds)
    served = {index: measure_service(path, index, args.student, args.work, texts, vectors, truth, shares,
                                     args.requests) for index, path in bundles.items()} if "service" in parts else {}
    base = None
    if args.baseline is not None and "flat" in bundles and "service" in parts:
        tree = baseline_tree(args.baseline, args.work)
        stripped = without_payload(bundles["flat"], args.work)
        base = measure_service(stripped, "flat", args.student, args.work, texts, vectors, truth, shares,
                               args.baseline_requests, tree=tree,
                               only=["none", "r < 1", "r < 1000", "r < 9700", "year = 2000", "year >= 1991",
                                     "tag in [a, b]", "tag = q and year = 2000"])
        shutil.rmtree(stripped)
    memory = measure_memory(next(iter(bundles.values()))) if "memory" in parts else None
    command = command_line()
    student_note = (f"encoded by the int8 student at {args.student} one at a time (the service's default; "
                    f"latency is the architecture's, not its training's); {source}")
    text = render(args, plans, served, base, memory, span.text(), command,
                  student_note)
    publish(args.lab, SECTION, text, write=not args.no_write)


if __name__ == "__main__":
    main()
