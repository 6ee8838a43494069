"""The bare limit: queries/s of the student's encode plus the bundle's search in a tight loop on every core, no HTTP.

Why: a server's sustained rate means little alone; beside the rate the same machine reaches doing only the
work a query needs, their ratio is what HTTP, queueing and the event loop cost, and it reads the same on any
machine. Each worker process opens the bundle and the student exactly as `tandem serve` does (the settings
come from `service.settings.ServiceSettings`, so TANDEM_* variables and overrides apply alike) and calls
what the server calls for one query: `StudentEncoder.encode_counted`, then `models.search.search`, dense,
with the server's top_k, oversample and FAISS thread count. Workers start loading together, warm up, wait at
a barrier, then loop for the same fixed duration; their rates are summed.

Memory: each worker loads its own copy of the FAISS index (`VectorIndex.load` reads it whole; the int8
rescoring codes and the document store are memory-mapped or paged, so shared through the page cache).

    python -m bench.serving.bare_limit --index BUNDLE --student DIR
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import queue
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from bench.harness.record import cpu_flags, cpu_model, start_logging
from bench.harness.servers import rss_mib
from service.settings import available_cores  # which the server and the load generator share too

log = logging.getLogger("bench.bare_limit")

LOAD_TIMEOUT_S = 600.0  # loading a large bundle in every worker at once


def settings_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """TANDEM_X=VALUE server settings as ServiceSettings keyword arguments (x=VALUE)."""
    from service.settings import ENV_PREFIX

    return {key.removeprefix(ENV_PREFIX).lower(): value for key, value in env.items() if key.startswith(ENV_PREFIX)}


@dataclass(frozen=True)
class WorkerResult:
    queries: int
    seconds: float
    latencies_ms: list[float]
    rss_mb: float


@dataclass(frozen=True)
class BareLimit:
    """The summed rate of `workers` processes, and the per-query latency while all of them ran."""

    workers: int
    duration_s: float
    queries: int
    qps: float
    query_p50_ms: float
    query_p99_ms: float
    worker_rss_mb: float  # the largest worker's peak resident memory
    top_k: int
    oversample: int
    encode_threads: int
    search_threads: int
    precision: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _worker(rank: int, index: str, student: str, overrides: dict[str, str], top_k: int, queries: list[str],
            warmup_s: float, duration_s: float, barrier: Any, results: Any) -> None:
    """Load, warm up, wait for every worker, loop for `duration_s`; put a WorkerResult (or the error) on `results`."""
    try:
        import faiss

        from models.bundle.version import Bundle
        from models.bundle.versions import resolve_bundle
        from models.encoders.student import StudentEncoder
        from models.search import SearchOptions, search
        from service.settings import ServiceSettings

        settings = ServiceSettings(index=Path(index), student=Path(student), **overrides)
        bundle = Bundle(resolve_bundle(settings.index))
        encoder = StudentEncoder(settings.student, settings.student_precision, settings.encode_threads)
        bundle.check_student(encoder.teacher)
        options = SearchOptions(top_k=top_k)  # mode dense, no filter, first page: what the load test asks
        faiss.omp_set_num_threads(settings.search_threads)  # per calling thread; this one does every search
        threadpool_limits(limits=settings.search_threads, user_api="blas")  # as service.core.searcher.Searcher does

        def one(text: str) -> None:
            vectors, _ = encoder.encode_counted([text], batch_size=settings.batch_max_queries)
            search(bundle, vectors, [text], options, settings.binary_oversample)

        i = rank * len(queries) // max(barrier.parties, 1)  # workers start at different queries
        until = time.perf_counter() + warmup_s
        while time.perf_counter() < until:
            one(queries[i % len(queries)])
            i += 1
        barrier.wait(LOAD_TIMEOUT_S)
        latencies: list[float] = []
        began = now = time.perf_counter()
        until = began + duration_s
        while now < until:
            one(queries[i % len(queries)])
            i += 1
            done = time.perf_counter()
            latencies.append((done - now) * 1e3)
            now = done
        results.put((rank, WorkerResult(len(latencies), now - began, latencies, rss_mib(os.getpid()) or float("nan"))))
        bundle.close()
    except BaseException as exc:  # the parent must hear of it, or it waits for the full timeout
        barrier.abort()
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def check_memory(index: Path, workers: int) -> None:
    """Refuse to start `workers` copies of a FAISS index that the machine's available memory cannot hold."""
    from models.bundle.vectors.index import INDEX_FILE
    from models.bundle.versions import resolve_bundle

    need_mb = (resolve_bundle(index) / INDEX_FILE).stat().st_size / 2**20 * workers
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        available_mb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:")) / 1024
    except (OSError, StopIteration, ValueError, IndexError):
        return
    if need_mb > 0.8 * available_mb:
        raise MemoryError(f"{workers} workers would each load {INDEX_FILE} of {index} ({need_mb:.0f} MB in all) "
                          f"with {available_mb:.0f} MB available; run fewer workers")


def measure(index: Path, student: Path, queries: Sequence[str], *, workers: int | None = None, top_k: int = 10,
            warmup_s: float = 3.0, duration_s: float = 15.0, env: Mapping[str, str] | None = None) -> BareLimit:
    """Sum of queries/s over `workers` spawned processes (default: every available core), each looping for
    `duration_s` after `warmup_s`; `env` holds TANDEM_X=VALUE server settings, applied as the server would."""
    from service.settings import ServiceSettings

    n = workers or available_cores()
    check_memory(index, n)
    overrides = settings_overrides(env or {})
    settings = ServiceSettings(index=index, student=student, **overrides)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, name=f"bare-{rank}", daemon=True,
                         args=(rank, str(index), str(student), overrides, top_k, list(queries), warmup_s, duration_s,
                               barrier, results))
             for rank in range(n)]
    for p in procs:
        p.start()
    got: dict[int, WorkerResult] = {}
    errors: list[str] = []
    try:
        deadline = time.monotonic() + LOAD_TIMEOUT_S + warmup_s + duration_s
        while len(got) + len(errors) < n:
            try:
                rank, result = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                errors.append(f"{n - len(got) - len(errors)} workers gave no result in time")
                break
            if isinstance(result, WorkerResult):
                got[rank] = result
            else:
                errors.append(f"worker {rank}: {result}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError("bare-limit workers failed: " + "; ".join(errors))
    latencies = np.concatenate([np.asarray(r.latencies_ms) for r in got.values()])
    return BareLimit(
        workers=n, duration_s=duration_s, queries=sum(r.queries for r in got.values()),
        qps=sum(r.queries / r.seconds for r in got.values()),
        query_p50_ms=float(np.percentile(latencies, 50)), query_p99_ms=float(np.percentile(latencies, 99)),
        worker_rss_mb=max(r.rss_mb for r in got.values()), top_k=top_k, oversample=settings.binary_oversample,
        encode_threads=settings.encode_threads, search_threads=settings.search_threads,
        precision=settings.student_precision,
    )


def describe(bare: BareLimit) -> str:
    return (f"{bare.qps:.1f} q/s over {bare.workers} workers ({bare.queries} queries in {bare.duration_s:g} s; "
            f"per query p50 {bare.query_p50_ms:.2f} ms, p99 {bare.query_p99_ms:.2f} ms; worker peak RSS "
            f"{bare.worker_rss_mb:.0f} MB; top_k {bare.top_k}, oversample {bare.oversample}, {bare.precision} "
            f"student, {bare.encode_threads} encode / {bare.search_threads} search threads)")


def main(argv: Sequence[str] | None = None) -> int:
    from bench.encoding.encode_latency import DEFAULT_SCIFACT, load_queries

    parser = argparse.ArgumentParser(description="Bare limit: student encode + bundle search on every core, no HTTP.")
    parser.add_argument("--index", type=Path, required=True, help="Index bundle directory (or bundle root).")
    parser.add_argument("--student", type=Path, required=True, help="Exported student directory.")
    parser.add_argument("--queries", type=Path, default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)))
    parser.add_argument("--workers", type=int, default=None, help="Processes (default: the cores available).")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--warmup", type=float, default=3.0, help="Seconds each worker runs before measuring.")
    parser.add_argument("--duration", type=float, default=15.0, help="Seconds measured.")
    parser.add_argument("--env", action="append", default=[], metavar="TANDEM_X=VALUE",
                        help="Server settings (repeatable), applied as `tandem serve` would.")
    args = parser.parse_args(argv)
    start_logging()
    queries, described = load_queries(args.queries, 10_000)
    bare = measure(args.index, args.student, queries, workers=args.workers, top_k=args.top_k, warmup_s=args.warmup,
                   duration_s=args.duration, env=dict(item.split("=", 1) for item in args.env))
    log.info("%s: %s", cpu_model(), cpu_flags())
    # the query set on the figure's own line: two figures compare only over the same set (the built-in questions
    # are shorter than SciFact's; docs/lab/2026-11-26-encode-floor.md, section 4)
    log.info("bare limit: %s; queries: %s", describe(bare), described)
    return 0


if __name__ == "__main__":
    sys.exit(main())
