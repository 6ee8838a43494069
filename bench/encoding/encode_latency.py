"""Query encoding latency and throughput: student ONNX (int8, fp32) vs the teacher in torch, on CPU.

Why: the point of the student is cheaper queries. This measures the cost the service pays per
request (batch size 1) and per micro-batch (batch size 16, what concurrent requests share), with
the same thread count for all encoders, all in one process and one run, and records the result in
the lab notebook (docs/lab/<date>-encode-latency.md).

    python -m bench.encoding.encode_latency --student .tandem/students/scifact --batch-sizes 1,16

Repeat --student to measure several students (say, both student families) in the same run.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
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

log = logging.getLogger("bench.encode_latency")

DEFAULT_SCIFACT = REPO.parent / "shared" / "data" / "scifact"
SECTION = "encode-latency"
BLOCK_SETTLE = 3  # untimed calls at the start of each block

FALLBACK_QUERIES = [
    "how do vaccines train the immune system",
    "what causes ocean tides",
    "parse a JSON string into a python object",
    "does vitamin D supplementation reduce the risk of fractures",
    "symptoms of type 2 diabetes in adults",
    "how does a TCP connection get established",
    "best way to store bread so it stays fresh",
    "which hormone regulates blood glucose",
    "effects of sleep deprivation on memory",
    "why do volcanoes erupt",
    "difference between a list and a tuple in python",
    "how are solar panels made",
    "is coffee bad for the heart",
    "gene mutations associated with breast cancer",
    "how do antibiotics kill bacteria",
    "what is the role of microglia in the brain",
]


@dataclass(frozen=True)
class Result:
    name: str
    batch: int
    times_ms: list[float]  # per encode() call of `batch` queries

    @property
    def per_second(self) -> float:
        """Queries encoded per second, from the mean call time."""
        return self.batch * 1000 / self.mean

    @property
    def p50(self) -> float:
        return float(np.percentile(self.times_ms, 50))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.times_ms, 90))

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times_ms)


def load_queries(source: Path, n: int) -> tuple[list[str], str]:
    """Up to `n` real query texts and a description of where they came from."""
    from models.datasets.beir import QRELS_DIR, QUERIES_FILE, read_qrels, read_queries

    if source.is_dir() and (source / QUERIES_FILE).is_file():
        queries = read_queries(source / QUERIES_FILE)
        qrels_path = source / QRELS_DIR / "test.tsv"
        if qrels_path.is_file():
            qrels, _ = read_qrels(qrels_path)
            texts = [queries[q] for q in qrels if q in queries]
            return texts[:n], f"{min(n, len(texts))} test queries of {source.name} ({source})"
        return list(queries.values())[:n], f"{min(n, len(queries))} queries of {source / QUERIES_FILE}"
    if source.is_file():
        queries = read_queries(source)
        return list(queries.values())[:n], f"{min(n, len(queries))} queries of {source}"
    log.warning("%s not found; using %d built-in questions", source, len(FALLBACK_QUERIES))
    texts = [FALLBACK_QUERIES[i % len(FALLBACK_QUERIES)] for i in range(n)]
    return texts, f"{n} built-in questions (cycling {len(FALLBACK_QUERIES)}); SciFact was not found"


def measure(
    encoders: dict[str, Callable[[list[str]], object]], queries: Sequence[str], warmup: int, rounds: int,
    batch: int,
) -> list[Result]:
    """Time each encoder on consecutive batches of `batch` queries.

    Encoders take turns in blocks, one block of queries per round, so slow drifts in machine
    load hit them alike. They are not interleaved query by query: onnxruntime and OpenMP
    threads spin after a call and would slow whichever encoder runs next (measured: the
    teacher's p50 rose from ~50 to ~84 ms when alternated with the student). A few untimed
    calls open each block for the same reason.
    """
    batches = [list(queries[i : i + batch]) for i in range(0, len(queries) - batch + 1, batch)]
    for name, encode in encoders.items():
        log.info("warming up %s (%d batches of %d)", name, warmup, batch)
        for texts in batches[:warmup]:
            encode(texts)
    times: dict[str, list[float]] = {name: [] for name in encoders}
    blocks = [batches[r::rounds] for r in range(rounds)]
    for r, block in enumerate(blocks, start=1):
        for name, encode in encoders.items():
            for texts in block[:BLOCK_SETTLE]:
                encode(texts)
            for texts in block:
                start = time.perf_counter()
                encode(texts)
                times[name].append((time.perf_counter() - start) * 1000)
        log.info("batch %d: round %d/%d done", batch, r, rounds)
    return [Result(name, batch, t) for name, t in times.items()]


def versions() -> str:
    import onnxruntime
    import torch

    return f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, torch {torch.__version__}"


def render_section(
    command: str, results: list[Result], teacher: str, setup: str, load: str, note: str | None
) -> str:
    base = {r.batch: r for r in results if r.name == teacher}
    rows = [
        "| encoder | batch | p50 ms per call | p90 ms | mean ms | queries/s |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {r.name} | {r.batch} | {r.p50:.2f} | {r.p90:.2f} | {r.mean:.2f} | {r.per_second:.0f} |"
          for r in results),
    ]
    speedups = [
        f"- {r.name}, batch {r.batch}: {base[r.batch].p50 / r.p50:.1f}× at p50, "
        f"{r.per_second / base[r.batch].per_second:.1f}× the throughput"
        for r in results
        if r.name != teacher
    ]
    return "\n".join(
        [
            "# Query encoding latency and throughput (CPU)",
            "",
            f"Command: `{command}`",
            "",
            f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- Machine: {machine()}; {versions()}; load average {load}",
            f"- Setup: {setup}",
            "",
            *([note, ""] if note else []),
            *rows,
            "",
            "Speed-up over the teacher at the same batch size:",
            "",
            *speedups,
        ]
    )


def busy_note(load: float, threads: int) -> str | None:
    """Torch's OpenMP threads wait on each other at every op, so a shared CPU slows the teacher far
    more than the student (measured here: ~50 ms idle, ~1.3 s at load 4 on 2 cores)."""
    cores = os.cpu_count() or 1
    if load + threads <= cores + 0.5:
        return None
    return (
        f"> Warning: the machine was busy before the run (1-min load {load:.1f} on {cores} cores), so these "
        "times are inflated, the teacher's most of all; rerun on an idle machine for reference numbers."
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Single-query encoding latency: student ONNX vs teacher torch.")
    parser.add_argument("--student", type=Path, action="append", required=True,
                        help="Exported student directory; repeat it to measure several side by side.")
    parser.add_argument("--teacher", type=Path, default=None, help="Teacher HF directory (default: provisioned).")
    parser.add_argument(
        "--queries",
        type=Path,
        default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)),
        help="BEIR directory or queries JSONL (default: $TANDEM_SCIFACT_DIR or ../shared/data/scifact).",
    )
    parser.add_argument("-n", "--num-queries", type=int, default=300, help="Timed queries per encoder.")
    parser.add_argument("--batch-sizes", default="1,16", help="Comma-separated queries per encode() call.")
    parser.add_argument("--warmup", type=int, default=20, help="Untimed batches per encoder first.")
    parser.add_argument("--threads", type=int, default=2, help="Threads for every encoder.")
    parser.add_argument("--rounds", type=int, default=5, help="Blocks each encoder's queries are split into.")
    add_output_args(parser)
    args = parser.parse_args(argv)
    if min(args.num_queries, args.threads, args.rounds) < 1 or args.warmup < 0:
        parser.error("--num-queries, --threads and --rounds must be >= 1, --warmup >= 0")
    try:
        args.batch_list = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        parser.error(f"--batch-sizes {args.batch_sizes!r}: expected comma-separated integers")
    if min(args.batch_list) < 1 or max(args.batch_list) * args.rounds > args.num_queries:
        parser.error("--batch-sizes must be >= 1, with --rounds batches of each within --num-queries")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start_logging()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from models.encoders.registry import resolve
    from models.encoders.student import StudentEncoder
    from models.encoders.teacher import TeacherEncoder
    from models.errors import TandemError

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    try:
        queries, described = load_queries(args.queries, args.num_queries)
        students = {(path, p): StudentEncoder(path, precision=p, threads=args.threads)
                    for path in args.student for p in ("int8", "fp32")}
        teacher = TeacherEncoder(resolve("teacher", args.teacher), device="cpu")
    except TandemError as exc:
        log.error("%s", exc)
        sys.exit(2)
    teacher_name = f"teacher {teacher.card.name} (torch fp32)"
    encoders: dict[str, Callable[[list[str]], object]] = {
        f"student {p} (ONNX, {s.manifest.backbone}{f'; {path.name}' if len(args.student) > 1 else ''})": s.encode
        for (path, p), s in students.items()
    }
    encoders[teacher_name] = lambda texts: teacher.encode_queries(texts, batch_size=len(texts))
    log.info("queries: %s", described)
    span = LoadSpan()
    note = busy_note(span.busy, args.threads)
    if note:
        log.warning("%s", note.removeprefix("> Warning: "))
    results = [r for b in args.batch_list for r in measure(encoders, queries, args.warmup, args.rounds, b)]
    for r in results:
        log.info("%-50s batch %2d p50 %7.2f ms  p90 %7.2f ms  mean %7.2f ms  %6.0f q/s", r.name, r.batch, r.p50,
                 r.p90, r.mean, r.per_second)
    setup = (
        f"{args.threads} threads for every encoder (onnxruntime intra-op threads; torch intra-op threads, "
        f"1 inter-op), batch sizes {args.batch_sizes}, teacher in fp32. {args.warmup} warm-up batches per "
        f"encoder, then {len(queries)} timed queries each, in {args.rounds} rounds of blocks (encoders take turns "
        f"block by block; {BLOCK_SETTLE} untimed calls open each block). Times are whole `encode()` calls, "
        f"tokenization included; queries/s is the batch size over the mean call time. Queries: {described}."
    )
    command = command_line()
    load = span.text()
    section = render_section(command, results, teacher_name, setup, load, note)
    publish(args.lab, SECTION, section, write=not args.no_write)


if __name__ == "__main__":
    main()
