"""The int8 student, quantized several ways: its distance from fp32, its speed, and its retrieval.

Why: the served student is int8, and two things move its vectors that no test shows. Dynamic
quantization scales activations per ONNX call, so a query encoded with 63 others (and their
padding) gets another vector than the same query alone, which is how `POST /search` encodes it.
And without VNNI, ORT's uint8 × int8 kernel sums product pairs into int16 and can saturate, which
7-bit weights (reduce_range) or uint8 weights avoid. Each variant re-quantizes the student's own
fp32 graph; all run in one process, on the same queries:

- cosine to fp32, each query encoded alone (label-free);
- encode ms per query alone, `--threads` threads;
- asymmetric nDCG@10 against the bundle, queries encoded alone and in batches of 64.

    python -m bench.encoding.int8_variants --student .tandem/students/scifact-full-qat \
        --data ../shared/data/scifact --index .tandem/bundles/scifact-768-float
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.harness.record import (
    command_line,
    load_average,
    machine,
    parse_with_output,
    publish,
    start_logging,
)

log = logging.getLogger("bench.int8_variants")

SECTION = "int8-variants"
BATCH = 64


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="BEIR dataset directory (queries, qrels)")
    parser.add_argument("--index", type=Path, required=True, help="bundle built from the dataset's corpus")
    parser.add_argument("--split", default="test")
    parser.add_argument("--threads", type=int, default=1)
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start_logging()
    from onnxruntime.quantization import QuantType

    from models.bundle.version import Bundle
    from models.datasets.beir import QRELS_DIR, QUERIES_FILE, read_qrels, read_queries
    from models.distill.exporting.export import quantize_onnx
    from models.encoders.student import StudentEncoder, read_student_manifest
    from models.errors import TandemError
    from models.evaluation.metrics import NDCG, TOP_K, score_run
    from models.evaluation.run import bundle_search_run

    variants = {  # name: (reduce_range, weight type)
        "int8 weights, 7 bits (exported)": (True, QuantType.QInt8),
        "int8 weights, 8 bits": (False, QuantType.QInt8),
        "uint8 weights, 8 bits": (False, QuantType.QUInt8),
    }
    try:
        manifest = read_student_manifest(args.student)
        qrels, _ = read_qrels(args.data / QRELS_DIR / f"{args.split}.tsv")
        all_queries = read_queries(args.data / QUERIES_FILE)
        qids = [q for q in qrels if q in all_queries]
        texts = [all_queries[q] for q in qids]
        bundle = Bundle(args.index)
    except TandemError as exc:
        log.error("%s", exc)
        sys.exit(2)

    def ndcg(vectors: np.ndarray) -> float:
        return float(score_run(qrels, bundle_search_run(bundle, qids, vectors))[NDCG])

    def alone(encoder: StudentEncoder) -> tuple[np.ndarray, float]:
        encoder.encode(texts[:10], batch_size=1)  # warm-up
        started = time.perf_counter()
        vectors = encoder.encode(texts, batch_size=1)
        return vectors, (time.perf_counter() - started) / len(texts) * 1e3

    _, load_before = load_average()
    fp32 = StudentEncoder(args.student, precision="fp32", threads=args.threads)
    reference, fp32_ms = alone(fp32)
    rows = [("fp32", 1.0, fp32_ms, ndcg(reference), ndcg(fp32.encode(texts, batch_size=BATCH)))]
    with tempfile.TemporaryDirectory() as tmp:
        kept_fp32 = manifest.parity.int8_fp32_nodes if manifest.parity else []
        for name, (reduce_range, weight_type) in variants.items():
            copy = Path(tmp) / "student"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(args.student, copy)
            quantize_onnx(copy / manifest.onnx_fp32, copy / manifest.onnx_int8, kept_fp32, reduce_range, weight_type)
            encoder = StudentEncoder(copy, precision="int8", threads=args.threads)
            vectors, ms = alone(encoder)
            cosine = float(np.mean(np.sum(vectors * reference, axis=1)))
            rows.append((name, cosine, ms, ndcg(vectors), ndcg(encoder.encode(texts, batch_size=BATCH))))
            log.info("%s: cosine %.5f, %.2f ms, nDCG@10 %.4f alone, %.4f batched", name, *rows[-1][1:])
    bundle.close()

    table = [
        "| student graph | cosine to fp32 (each query alone) | encode ms/query | nDCG@10, queries alone "
        f"(as served) | nDCG@10, batches of {BATCH} |",
        "|---|---:|---:|---:|---:|",
        *(f"| {n} | {c:.5f} | {ms:.2f} | {a:.4f} | {b:.4f} |" for n, c, ms, a, b in rows),
    ]
    command = command_line()
    section = "\n".join([
        "# The int8 student, quantized several ways",
        "",
        f"Command: `{command}`",
        "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}; load average {load_before} before the run",
        f"- Setup: student `{args.student}` (its fp32 graph re-quantized per row, per-channel dynamic); "
        f"{len(texts)} {args.split} queries of {args.data.name}; bundle `{args.index}`, top {TOP_K}; "
        f"{args.threads} onnxruntime thread(s); cosine and timing over each query encoded alone.",
        "",
        *table,
    ])
    publish(args.lab, SECTION, section, write=not args.no_write)


if __name__ == "__main__":
    main()
