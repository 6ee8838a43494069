"""Index types for size: recall@10 against exact search, single-query latency and RAM per document.

Why: an operator choosing `tandem index build --index/--quantization` trades recall for RAM and
speed; this measures all three for every valid combination on one synthetic corpus and records
them in the lab notebook (docs/lab/<date>-index-types.md).

The corpus is SciFact's teacher embeddings with noise, because random unit vectors are a poor
proxy for real embeddings (no clusters, no anisotropy): each document is a reference vector plus
Gaussian noise shaped like the reference set's covariance. Queries are noisy copies of reference
vectors held out of the documents, so no query has a planted duplicate. Each index is built here,
saved, then loaded and searched in a fresh child process, so its resident-memory growth is the
index alone: anonymous RSS counts the first stage held in RAM; the memory-mapped rescoring file
shows up only as file-backed pages (page cache, evictable) and is reported as disk.

    nice -n 15 python -m bench.index.index_types --n 100000 --dims 768,256
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

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

log = logging.getLogger("bench.index_types")

SECTION = "index-types"
DEFAULT_REFERENCE = (Path(os.environ.get("TANDEM_SCIFACT_DIR", REPO.parent / "shared" / "data" / "scifact"))
                     / "reference" / "all-mpnet-base-v2.corpus.f16.npy")
TYPES = [("flat", "float"), ("flat", "int8"), ("flat", "binary"), ("hnsw", "float"), ("hnsw", "int8"),
         ("hnsw", "binary"), ("ivf", "binary")]
K = 10


@dataclass(frozen=True)
class Row:
    dim: int
    index: str
    quantization: str
    params: str
    build_s: float
    recall: float
    p50_ms: float
    p99_ms: float
    ram_bytes_per_doc: float
    file_bytes_per_doc: float
    disk_rescore_bytes_per_doc: float
    rescore_resident_mb: float


def synthesize(reference: Path, n: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` documents and `queries` queries around the reference embeddings (relative noise 0.4–0.8)."""
    rng = np.random.default_rng(seed)
    ref = np.asarray(np.load(reference), dtype=np.float32)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    if queries >= len(ref) // 2:
        raise SystemExit(f"--queries {queries} must be under half the {len(ref)} reference vectors")
    ref = ref[rng.permutation(len(ref))]
    held, kept = ref[:queries], ref[queries:]
    eigvals, eigvecs = np.linalg.eigh(np.cov(kept, rowvar=False))
    shape = (eigvecs * np.sqrt(np.clip(eigvals, 0, None))).T / np.sqrt(eigvals.clip(0).sum())

    def noisy(base: np.ndarray) -> np.ndarray:
        scale = rng.uniform(0.4, 0.8, (len(base), 1)).astype(np.float32)
        x = base + scale * (rng.standard_normal(base.shape, dtype=np.float32) @ shape.astype(np.float32))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    docs = np.concatenate([noisy(kept[rng.integers(0, len(kept), size)])
                           for size in np.diff(np.r_[0:n:20_000, n])])
    return docs, noisy(held)


def synthetic_inputs(directory: Path, size: int, reference: Path,
                     payload: Callable[[int], dict[str, object]] | None = None) -> Path:
    """corpus.jsonl, vectors.f16.npy and ids.json for `size` synthetic documents in `directory`, made once;
    `payload(i)` adds keys to document i's corpus line."""
    if (directory / "ids.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    docs, _ = synthesize(reference, size, 1, seed=size)
    np.save(directory / "vectors.f16.npy", docs.astype(np.float16))
    del docs
    ids = [f"doc{i}" for i in range(size)]
    with (directory / "corpus.jsonl").open("w") as fh:
        for i, doc_id in enumerate(ids):
            line = {"_id": doc_id, "title": f"Synthetic {doc_id}", "text": "Synthetic text."}
            fh.write(json.dumps(line | payload(i) if payload is not None else line) + "\n")
    (directory / "ids.json").write_text(json.dumps(ids))  # last: marks the inputs complete
    return directory


def bundle_for(inputs: Path, index: str, quantization: str, *options: str, name: str | None = None) -> Path:
    """Built once with `tandem index build` (import of the synthetic vectors, plus `options`) into
    `inputs/name`; reused while it exists."""
    out = inputs / (name or f"bundle-{index}-{quantization}")
    if (out / "manifest.json").is_file():
        return out
    cmd = [sys.executable, "-m", "tandem", "index", "build", "--corpus", str(inputs / "corpus.jsonl"),
           "--out", str(out), "--embeddings", str(inputs / "vectors.f16.npy"), "--ids", str(inputs / "ids.json"),
           "--quantization", quantization, "--index", index, *options, "--force"]
    began = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                   env={**os.environ, "TANDEM_LOG_LEVEL": "WARNING"})
    log.info("built %s in %.0f s", out, time.perf_counter() - began)
    return out


def anon_rss_bytes() -> int:
    """Anonymous resident memory, after handing freed heap back so new allocations show up as growth."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def mapped_rss_bytes(path: Path) -> int:
    """Resident bytes of the memory mappings of `path` (page cache the process can see, not its own memory)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isalnum() and "-" in line.split(" ", 1)[0]:  # a mapping's header line
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def measure(directory: Path, meta: dict[str, object], latency_queries: int) -> dict[str, float]:
    """In a fresh process: load the index, record RSS growth, search (recall batch; latency one by one)."""
    import faiss

    from models.bundle.vectors.index import RESCORE_FILE
    from models.bundle.vectors.index_spec import IndexSpec, Quantization
    from models.search import VectorIndex

    queries = np.load(directory.parent / "queries.npy")
    truth = np.load(directory.parent / f"truth-{meta['dim']}.npy")
    spec = IndexSpec.model_validate(meta["spec"])
    q = Quantization(str(meta["quantization"]))
    before = anon_rss_bytes()
    index = VectorIndex.load(directory, int(str(meta["dim"])), q, spec)
    ram = anon_rss_bytes() - before
    _, rows = index.search(queries, K)
    recall = float(np.mean([len(set(r) & set(t)) / K for r, t in zip(rows, truth, strict=True)]))
    faiss.omp_set_num_threads(1)
    times = []
    for query in queries[:latency_queries]:
        began = time.perf_counter()
        index.search(query[None], K)
        times.append((time.perf_counter() - began) * 1000)
    return {
        "recall": recall,
        "p50_ms": float(np.percentile(times, 50)),
        "p99_ms": float(np.percentile(times, 99)),
        "ram_bytes": float(ram),
        "rescore_resident_mb": mapped_rss_bytes((directory / RESCORE_FILE).resolve()) / 2**20,
    }


def run_one(workdir: Path, docs: np.ndarray, dim: int, kind: str, quantization: str, args: argparse.Namespace) -> Row:
    import faiss

    from models.bundle.vectors.index import RESCORE_FILE
    from models.bundle.vectors.index_spec import Quantization, resolve_spec
    from models.search import VectorIndex

    q = Quantization(quantization)
    overrides = {"ef_search": args.ef_search} if kind == "hnsw" else {}
    spec = resolve_spec(kind, q, len(docs), **overrides)
    directory = workdir / f"{dim}-{kind}-{quantization}"
    directory.mkdir()
    faiss.omp_set_num_threads(args.build_threads)
    began = time.perf_counter()
    VectorIndex.build(docs, dim, q, spec).save(directory)
    build_s = time.perf_counter() - began
    meta = {"dim": dim, "quantization": quantization, "spec": spec.model_dump(mode="json")}
    child = subprocess.run(
        module_cmd("bench.index.index_types", "--measure", str(directory), "--meta", json.dumps(meta),
                   "--latency-queries", str(args.latency_queries)),
        check=True, capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": str(args.build_threads)},
    )
    got = json.loads(child.stdout.strip().splitlines()[-1])
    rescore = directory / RESCORE_FILE
    n = len(docs)
    params = ", ".join(f"{k}={v}" for k, v in spec.model_dump(exclude_none=True, mode="json").items() if k != "type")
    row = Row(dim=dim, index=kind, quantization=quantization, params=params or "–", build_s=build_s,
              recall=got["recall"], p50_ms=got["p50_ms"], p99_ms=got["p99_ms"], ram_bytes_per_doc=got["ram_bytes"] / n,
              file_bytes_per_doc=(directory / "index.faiss").stat().st_size / n,
              disk_rescore_bytes_per_doc=rescore.stat().st_size / n if rescore.exists() else 0.0,
              rescore_resident_mb=got["rescore_resident_mb"] if rescore.exists() else 0.0)
    log.info("%s", row)
    return row


def render(rows: list[Row], command: str, setup: str, load: str) -> str:
    import faiss

    lines = [
        "# Index types: recall, latency and RAM per document",
        "",
        f"Command: `{command}`",
        "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {machine()}; python {platform.python_version()}, "
        f"faiss {faiss.__version__}; load average {load}",
        f"- Setup: {setup}",
        "",
        "| dim | index | quantization | parameters | build s | recall@10 | p50 ms | p99 ms | RAM B/doc "
        "| index file B/doc | rescore file B/doc (disk, mmap) | rescore pages mapped MB (page cache) |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.dim} | {r.index} | {r.quantization} | {r.params} | {r.build_s:.1f} | {r.recall:.3f} "
                     f"| {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.ram_bytes_per_doc:.0f} | {r.file_bytes_per_doc:.0f} "
                     f"| {r.disk_rescore_bytes_per_doc:.0f} | {r.rescore_resident_mb:.1f} |")
    lines += [
        "",
        "RAM B/doc is the growth of the loading process's anonymous resident memory (`RssAnon`) when the "
        "index is read, divided by the documents: the first stage only. Binary types rescore the top "
        f"{K} × oversample Hamming candidates against int8 codes memory-mapped from `rescore.u8.npy`; those "
        "pages are file-backed page cache, which the kernel can evict, not process memory. The last column is "
        "the mapping's resident size after all queries (`/proc/self/smaps`): the file was just written, so "
        "it is all in the page cache and the kernel's fault-around maps the pages beside each one read; "
        "on a cold cache only the pages read (and their readahead) come in.",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Recall@10, latency and RAM per document of each index type.")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE,
                        help="Teacher embeddings (float16 .npy) the corpus is synthesized around.")
    parser.add_argument("--n", type=int, default=100_000, help="Documents.")
    parser.add_argument("--dims", default="768,256", help="Comma-separated MRL dims.")
    parser.add_argument("--queries", type=int, default=500, help="Queries for recall (held-out references).")
    parser.add_argument("--latency-queries", type=int, default=200, help="Of those, timed one at a time.")
    parser.add_argument("--types", default=",".join(f"{k}-{q}" for k, q in TYPES),
                        help="Comma-separated INDEX-QUANTIZATION pairs.")
    parser.add_argument("--ef-search", type=int, default=None, help="hnsw efSearch (default: tandem's).")
    parser.add_argument("--build-threads", type=int, default=2, help="FAISS threads for builds and batch search.")
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--meta", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, json.loads(args.meta), args.latency_queries)))  # read by the parent
        return
    start_logging()
    dims = [int(d) for d in args.dims.split(",")]
    types = [tuple(t.split("-", 1)) for t in args.types.split(",")]
    if not args.reference.is_file():
        raise SystemExit(f"--reference {args.reference}: not found (SciFact teacher embeddings)")
    import faiss

    from models.contract import truncate

    span = LoadSpan()
    docs, queries = synthesize(args.reference, args.n, args.queries, args.seed)
    log.info("synthesized %d documents and %d queries", len(docs), len(queries))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tandem-index-types-") as tmp:
        workdir = Path(tmp)
        np.save(workdir / "queries.npy", queries)
        faiss.omp_set_num_threads(args.build_threads)
        for dim in dims:
            exact = faiss.IndexFlatIP(dim)
            exact.add(np.ascontiguousarray(truncate(docs, dim)))
            np.save(workdir / f"truth-{dim}.npy", exact.search(np.ascontiguousarray(truncate(queries, dim)), K)[1])
            del exact
            rows += [run_one(workdir, docs, dim, kind, quant, args) for kind, quant in types]
    command = command_line()
    setup = (f"{args.n:,} synthetic documents: SciFact all-mpnet-base-v2 vectors plus covariance-shaped noise "
             f"(relative norm 0.4–0.8), {args.queries} queries from {args.queries} held-out reference vectors. "
             f"Recall@{K} against exact float search at the same dim, all {args.queries} queries. Latency: "
             f"`VectorIndex.search` for one query at a time, {args.latency_queries} queries, "
             f"FAISS threads 1, oversample 4 for binary. Builds with {args.build_threads} FAISS threads.")
    section = render(rows, command, setup, span.text())
    publish(args.lab, SECTION, section, write=not args.no_write)


if __name__ == "__main__":
    main()
