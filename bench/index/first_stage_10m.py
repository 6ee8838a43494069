"""Recall@10 and latency of binary first stages (flat, IVF) with int8 rescoring, by depth, at sizes past RAM.

Why: bench/index/first_stage_scale.py holds the corpus as float32 (30 GB at 10M documents), which this 24 GB box cannot;
this one streams bench/index/scale_10m.py's float16 inputs once, keeping only what a bundle keeps (sign codes, int8
rescoring codes) and the exact top 10 of each query, and fits the space (calibration, center, spin) on the first
million rows. Queries: SciFact's *train* queries encoded by the student, as the service encodes them.

    python -m bench.index.first_stage_10m --inputs /work/scale/inputs-10000000 --nlist 4096 \
        --student /work/bench/student
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import faiss
import numpy as np

from bench.harness.record import cpu_line, start_logging
from bench.index.first_stage_scale import K, measure_index, student_queries
from models.bundle.vectors.first_stage import empty_first_stage
from models.bundle.vectors.index import VectorIndex
from models.bundle.vectors.index_spec import IndexSpec, IndexType, Quantization
from models.bundle.vectors.quantize import int8_encode
from models.bundle.vectors.space import Space

log = logging.getLogger("bench.first_stage_10m")
CHUNK = 65_536
FIT_ROWS = 1_000_000
DEPTHS = (16, 32, 64, 128, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--nlist", type=int, default=4096)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--latency", type=int, default=40)
    args = parser.parse_args()
    start_logging()
    log.info("%s", cpu_line())
    docs = np.load(args.inputs / "vectors.f16.npy", mmap_mode="r")
    n = len(docs)
    faiss.omp_set_num_threads(2)
    q = student_queries(args.student, args.queries)
    fit_rows = min(n, FIT_ROWS)
    space = Space.fit(fit_rows, lambda: [np.asarray(docs[:fit_rows], dtype=np.float32)], dim=768,
                      quantization=Quantization.BINARY, center=True, spin=True)
    assert space.calibration is not None
    codes, rescore = np.empty((n, 96), np.uint8), np.empty((n, 768), np.uint8)
    best_s, best_r = np.full((len(q), 0), -np.inf, np.float32), np.zeros((len(q), 0), np.int64)
    for start in range(0, n, CHUNK):
        x = np.asarray(docs[start : start + CHUNK], dtype=np.float32)
        scores = q @ x.T
        top = np.argpartition(-scores, K, axis=1)[:, :K]
        cs = np.concatenate([best_s, np.take_along_axis(scores, top, 1)], 1)
        cr = np.concatenate([best_r, top + start], 1)
        keep = np.argsort(-cs, 1)[:, :K]
        best_s, best_r = np.take_along_axis(cs, keep, 1), np.take_along_axis(cr, keep, 1)
        codes[start : start + len(x)] = space.sign_codes(x)
        rescore[start : start + len(x)] = int8_encode(x, space.calibration)
    flat = faiss.IndexBinaryFlat(768)
    flat.add(codes)
    log.info("flat at %d", n)
    measure_index(VectorIndex(Quantization.BINARY, 768, flat, space, rescore, IndexSpec()), q, best_r, DEPTHS,
                  args.latency)
    del flat
    faiss.omp_set_num_threads(2)  # measure_index left one thread for the latencies; k-means and adds use both
    spec = IndexSpec(type=IndexType.IVF, ivf_nlist=args.nlist, ivf_nprobe=args.nlist // 8)
    index = empty_first_stage(768, Quantization.BINARY, spec, space.calibration)
    began = time.perf_counter()
    index.train(np.ascontiguousarray(codes[:: max(1, n // (64 * args.nlist))]))
    trained = time.perf_counter() - began
    began = time.perf_counter()
    index.add(codes)
    log.info("ivf nlist %d at %d: train %.0f s, add %.0f s", args.nlist, n, trained, time.perf_counter() - began)
    index.nprobe = spec.ivf_nprobe
    measure_index(VectorIndex(Quantization.BINARY, 768, index, space, rescore, spec), q, best_r, DEPTHS,
                  args.latency)


if __name__ == "__main__":
    main()
