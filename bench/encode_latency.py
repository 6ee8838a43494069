"""Single-query encoding latency: student ONNX (int8, fp32) vs the teacher in torch, on CPU.

Why: the point of the student is cheaper queries. This measures the cost the service pays per
request (batch size 1, same thread count for all encoders, all in one process and one run) and
records the result in docs/BENCHMARKS.md.

    python bench/encode_latency.py --student .tandem/students/scifact
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from benchdoc import BENCHMARKS_MD, REPO, cpu_model, load_average, markers, write_section

log = logging.getLogger("bench.encode_latency")

DEFAULT_SCIFACT = REPO.parent / "shared" / "data" / "scifact"
SECTION = "encode-latency"
BLOCK_SETTLE = 3  # untimed calls at the start of each block
BEGIN, END = markers(SECTION)

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
    times_ms: list[float]

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
    from models.beir import QRELS_DIR, QUERIES_FILE, read_qrels, read_queries

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
    encoders: dict[str, Callable[[str], object]], queries: Sequence[str], warmup: int, rounds: int
) -> list[Result]:
    """Time each encoder on each query (batch of one).

    Encoders take turns in blocks, one block of queries per round, so slow drifts in machine
    load hit them alike. They are not interleaved query by query: onnxruntime and OpenMP
    threads spin after a call and would slow whichever encoder runs next (measured: the
    teacher's p50 rose from ~50 to ~84 ms when alternated with the student). A few untimed
    calls open each block for the same reason.
    """
    for name, encode in encoders.items():
        log.info("warming up %s (%d queries)", name, warmup)
        for text in queries[:warmup]:
            encode(text)
    times: dict[str, list[float]] = {name: [] for name in encoders}
    blocks = [list(queries[r::rounds]) for r in range(rounds)]
    for r, block in enumerate(blocks, start=1):
        for name, encode in encoders.items():
            for text in block[:BLOCK_SETTLE]:
                encode(text)
            for text in block:
                start = time.perf_counter()
                encode(text)
                times[name].append((time.perf_counter() - start) * 1000)
        log.info("round %d/%d done", r, rounds)
    return [Result(name, t) for name, t in times.items()]


def versions() -> str:
    import onnxruntime
    import torch

    return f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, torch {torch.__version__}"


def render_section(
    command: str, results: list[Result], teacher: str, setup: str, load: str, note: str | None
) -> str:
    by_name = {r.name: r for r in results}
    rows = [
        "| encoder | p50 ms | p90 ms | mean ms |",
        "|---|---:|---:|---:|",
        *(f"| {r.name} | {r.p50:.2f} | {r.p90:.2f} | {r.mean:.2f} |" for r in results),
    ]
    base = by_name[teacher]
    speedups = [
        f"- {r.name}: {base.p50 / r.p50:.1f}× at p50, {base.mean / r.mean:.1f}× on the mean"
        for r in results
        if r.name != teacher
    ]
    return "\n".join(
        [
            BEGIN,
            "## Query encoding latency (CPU, batch size 1)",
            "",
            f"Command: `{command}`",
            "",
            f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- Machine: {cpu_model()}, {os.cpu_count()} cores visible; {versions()}; load average {load}",
            f"- Setup: {setup}",
            "",
            *([note, ""] if note else []),
            *rows,
            "",
            "Speed-up over the teacher (teacher time ÷ student time):",
            "",
            *speedups,
            END,
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
    parser.add_argument("--student", type=Path, required=True, help="Exported student directory.")
    parser.add_argument("--teacher", type=Path, default=None, help="Teacher HF directory (default: provisioned).")
    parser.add_argument(
        "--queries",
        type=Path,
        default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)),
        help="BEIR directory or queries JSONL (default: $TANDEM_SCIFACT_DIR or ../shared/data/scifact).",
    )
    parser.add_argument("-n", "--num-queries", type=int, default=300, help="Timed queries per encoder.")
    parser.add_argument("--warmup", type=int, default=20, help="Untimed queries per encoder first.")
    parser.add_argument("--threads", type=int, default=2, help="Threads for every encoder.")
    parser.add_argument("--rounds", type=int, default=5, help="Blocks each encoder's queries are split into.")
    parser.add_argument("--out", type=Path, default=BENCHMARKS_MD, help="Markdown file to update.")
    parser.add_argument("--no-write", action="store_true", help="Only log the results.")
    args = parser.parse_args(argv)
    if min(args.num_queries, args.threads, args.rounds) < 1 or args.warmup < 0:
        parser.error("--num-queries, --threads and --rounds must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from models.errors import TandemError
    from models.registry import resolve
    from models.student import StudentEncoder
    from models.teacher import TeacherEncoder

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    try:
        queries, described = load_queries(args.queries, args.num_queries)
        students = {p: StudentEncoder(args.student, precision=p, threads=args.threads) for p in ("int8", "fp32")}
        teacher = TeacherEncoder(resolve("teacher", args.teacher), device="cpu")
    except TandemError as exc:
        log.error("%s", exc)
        sys.exit(2)
    teacher_name = f"teacher {teacher.card.name} (torch fp32)"
    encoders: dict[str, Callable[[str], object]] = {
        f"student int8 (ONNX, {students['int8'].manifest.backbone})": lambda t: students["int8"].encode([t]),
        f"student fp32 (ONNX, {students['fp32'].manifest.backbone})": lambda t: students["fp32"].encode([t]),
        teacher_name: lambda t: teacher.encode([t], batch_size=1),
    }
    log.info("queries: %s", described)
    busy, load_before = load_average()
    note = busy_note(busy, args.threads)
    if note:
        log.warning("%s", note.removeprefix("> Warning: "))
    results = measure(encoders, queries, args.warmup, args.rounds)
    for r in results:
        log.info("%-50s p50 %7.2f ms  p90 %7.2f ms  mean %7.2f ms", r.name, r.p50, r.p90, r.mean)
    setup = (
        f"{args.threads} threads for every encoder (onnxruntime intra-op threads; torch intra-op threads, "
        f"1 inter-op), batch size 1, teacher in fp32. {args.warmup} warm-up queries per encoder, then "
        f"{len(queries)} timed queries each, in {args.rounds} rounds of blocks (encoders take turns "
        f"block by block; {BLOCK_SETTLE} untimed calls open each block). Times are whole `encode()` calls, "
        f"tokenization included. Queries: {described}."
    )
    command = shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    load = f"{load_before} before, {load_average()[1]} after"
    section = render_section(command, results, teacher_name, setup, load, note)
    if not args.no_write:
        write_section(args.out, SECTION, section)
        log.info("updated %s", args.out)


if __name__ == "__main__":
    main()
