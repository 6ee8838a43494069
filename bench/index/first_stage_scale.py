"""The first stage as the corpus grows: IVF's k-means on a bounded sample, and the rescoring depth flat binary needs.

Why (issue 44): binary IVF trained k-means on up to 256 codes a cell with 25 iterations, at 4·√N cells: its build
grew as N^1.5 (136 s at 200k); flat binary with ×4 int8 rescoring kept 0.886 of the exact top 10 at 100k and
0.445 at 10M. This measures, in process, on the synthetic documents of bench/index/scale_10m.py (SciFact's teacher
vectors plus covariance-shaped noise) and queries made the same way (reference vectors plus noise, never SciFact's
test queries), at each size:

- IVF over binary codes (centered and spun, as the build makes them), k-means on `points` codes a cell (a stride
  of the rows) for `iterations` iterations: training time, adding time, and recall@10 of the search with int8
  rescoring at nprobe = nlist/8 (the default) against exact float search, per oversample;
- flat binary: recall@10 and single-thread latency per oversample (the rescoring depth), which places
  `--index auto`'s oversample and crossover (models.bundle.vectors.index_spec).

    python -m bench.index.first_stage_scale --inputs /work/scale/inputs-1000000 --sizes 200000,1000000
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.harness.record import add_output_args, cpu_line, load_average, publish, start_logging
from bench.index.index_types import DEFAULT_REFERENCE
from bench.index.scale_10m import noise_shape

log = logging.getLogger("bench.first_stage_scale")

SECTION = "first-stage-scale"
K = 10


@dataclass
class Row:
    n: int
    index: str
    params: str
    train_s: float
    add_s: float
    oversample: int
    recall: float
    p50_ms: float
    p99_ms: float


def student_queries(student: Path, count: int) -> np.ndarray:
    """SciFact's train queries as the service encodes them (the student, int8): real queries, never test ones."""
    from bench.index.scale_10m import train_queries
    from models.encoders.student import StudentEncoder

    return StudentEncoder(student).encode(train_queries(count))


def queries_like(reference: Path, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ref = np.asarray(np.load(reference), dtype=np.float32)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    x = ref[rng.integers(0, len(ref), count)] + rng.uniform(0.4, 0.8, (count, 1)).astype(np.float32) * (
        rng.standard_normal((count, 768), dtype=np.float32) @ noise_shape(ref))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_top(docs: np.ndarray, q: np.ndarray) -> np.ndarray:
    best_s = np.full((len(q), 0), -np.inf, np.float32)
    best_r = np.zeros((len(q), 0), np.int64)
    for start in range(0, len(docs), 65_536):
        s = q @ docs[start : start + 65_536].T
        top = np.argpartition(-s, K, axis=1)[:, :K]
        cs = np.concatenate([best_s, np.take_along_axis(s, top, 1)], 1)
        cr = np.concatenate([best_r, top + start], 1)
        keep = np.argsort(-cs, 1)[:, :K]
        best_s, best_r = np.take_along_axis(cs, keep, 1), np.take_along_axis(cr, keep, 1)
    return best_r


def recall(rows: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(r.tolist()) & set(t.tolist())) / K for r, t in zip(rows, truth, strict=True)]))


def measure_index(index, q: np.ndarray, truth: np.ndarray, oversamples: Sequence[int], latency: int
                  ) -> list[tuple[int, float, float, float]]:
    from models.bundle.vectors.index import set_search_threads

    set_search_threads(1)
    out = []
    for oversample in oversamples:
        rows = index.search(q, K, oversample)[1]
        times = []
        for i in range(latency):
            began = time.perf_counter()
            index.search(q[i : i + 1], K, oversample)
            times.append(time.perf_counter() - began)
        out.append((oversample, recall(rows, truth), 1e3 * float(np.percentile(times, 50)),
                    1e3 * float(np.percentile(times, 99))))
        log.info("oversample %d: recall %.3f p50 %.1f ms p99 %.1f ms", *out[-1])
    return out


def run_size(args: argparse.Namespace, n: int) -> list[Row]:
    import faiss

    from models.bundle.vectors.first_stage import empty_first_stage, first_stage_codes
    from models.bundle.vectors.index import VectorIndex
    from models.bundle.vectors.index_spec import IndexSpec, IndexType, Quantization, resolve_spec
    from models.bundle.vectors.space import Space

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    docs = np.asarray(np.load(args.inputs / "vectors.f16.npy", mmap_mode="r")[:n], dtype=np.float32)
    q = student_queries(args.student, args.queries) if args.student else queries_like(args.reference, args.queries,
                                                                                        seed=n + 7)
    truth = exact_top(docs, q)
    space = Space.fit(n, lambda: [docs], dim=768, quantization=Quantization.BINARY, center=True, spin=True)
    rows: list[Row] = []
    flat = VectorIndex.build(docs, 768, Quantization.BINARY, IndexSpec(), center=True, spin=True)
    for oversample, r, p50, p99 in measure_index(flat, q, truth, args.oversamples, args.latency):
        rows.append(Row(n, "flat", "", 0.0, 0.0, oversample, r, p50, p99))
    del flat
    codes = first_stage_codes(docs, Quantization.BINARY, space.center, space.spin)
    spec = resolve_spec("ivf", Quantization.BINARY, n)
    assert spec.ivf_nlist is not None
    for variant in args.ivf:
        points, iterations = (int(v) for v in variant.split("x"))
        index = empty_first_stage(768, Quantization.BINARY, spec, space.calibration)
        index.cp.niter = iterations
        index.cp.max_points_per_centroid = max(points, 39)
        step = max(1, n // (points * spec.ivf_nlist))
        began = time.perf_counter()
        index.train(np.ascontiguousarray(codes[::step]))
        train_s = time.perf_counter() - began
        began = time.perf_counter()
        index.add(codes)
        add_s = time.perf_counter() - began
        index.nprobe = spec.ivf_nprobe
        vi = VectorIndex(Quantization.BINARY, 768, index, space, flat_rescore(docs, space), IndexSpec(
            type=IndexType.IVF, ivf_nlist=spec.ivf_nlist, ivf_nprobe=spec.ivf_nprobe))
        trained = min(len(codes[::step]), index.cp.max_points_per_centroid * spec.ivf_nlist)  # FAISS subsamples
        log.info("ivf %s at %d: nlist %d, %d training codes, train %.1f s, add %.1f s", variant, n, spec.ivf_nlist,
                 trained, train_s, add_s)
        for oversample, r, p50, p99 in measure_index(vi, q, truth, args.oversamples, args.latency):
            rows.append(Row(n, "ivf", f"nlist {spec.ivf_nlist}, nprobe {spec.ivf_nprobe}, {points} codes a cell "
                            f"({trained:,}), {iterations} iterations", train_s, add_s, oversample, r,
                            p50, p99))
    return rows


def flat_rescore(docs: np.ndarray, space) -> np.ndarray:
    from models.bundle.vectors.quantize import int8_encode

    return int8_encode(docs, space.calibration)


def render(args: argparse.Namespace, rows: list[Row], load: str) -> str:
    source = f"SciFact train queries encoded by the student {args.student}" if args.student else \
        "reference vectors plus covariance-shaped noise"
    lines = ["# The first stage as the corpus grows: IVF trained on a bounded sample, flat binary's rescoring depth",
             "", f"`python -m bench.index.first_stage_scale {shlex.join(args.argv)}` on {cpu_line()}, {os.cpu_count()} "
             f"cores, {datetime.now(UTC):%Y-%m-%d}, load before the run {load}. {args.queries} queries ({source}); "
             "recall@10 against exact float search over the same 768-d vectors; latency: one query at a time on "
             f"one thread, the first {args.latency}.", "",
             "| documents | index | parameters | train | add | oversample | recall@10 | p50 | p99 |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.n:,} | {r.index} | {r.params} | {r.train_s:.1f} s | {r.add_s:.1f} s | ×{r.oversample} | "
                     f"{r.recall:.3f} | {r.p50_ms:.1f} ms | {r.p99_ms:.1f} ms |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True, help="bench/index/scale_10m.py inputs (vectors.f16.npy).")
    parser.add_argument("--sizes", default="200000")
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--student", type=Path, help="Queries: SciFact train queries encoded by this student "
                        "(else reference vectors plus noise, near-duplicates of documents: too easy a test).")
    parser.add_argument("--latency", type=int, default=50)
    parser.add_argument("--oversamples", default="4,8,16,32")
    parser.add_argument("--ivf", default="256x25,39x10", help="IVF variants POINTSxITERATIONS ('' skips IVF).")
    add_output_args(parser)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.oversamples = [int(v) for v in args.oversamples.split(",")]
    args.ivf = [v for v in args.ivf.split(",") if v]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    start_logging()
    args = parse_args(argv)
    _, load = load_average()
    rows = [row for n in args.sizes.split(",") for row in run_size(args, int(n))]
    publish(args.lab, SECTION, render(args, rows, load), write=not args.no_write)


if __name__ == "__main__":
    main()
