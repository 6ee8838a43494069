"""The quality–cost curve: each query encoder's nDCG@10 beside its encode p50 (one query per call, one thread),
every encode timed in one run, taking turns.

Why: which student to serve is a trade between what a query costs and what it finds, and the two only compare
when measured together: the encode times of one run on one machine, the quality from `tandem eval` on one split.
Rows (issue 56): the students (static and transformer, served as `tandem serve` loads them, int8), the teacher
(torch fp32), MiniLM alone (all-MiniLM-L6-v2 un-distilled, in its own space: queries against its own document
vectors, not the teacher's), and BM25 (no encode).

- quality: each student's asymmetric and hybrid nDCG@10, scored here by `tandem eval`'s own functions on the
  teacher's bundle (--index), or read from its `tandem eval --json` report (--eval NAME=JSON); the teacher's and
  BM25's from one `tandem eval --json` report on the same bundle and split (--teacher-report); MiniLM alone's is
  scored here the same way against a bundle the indexer built with MiniLM as its teacher (--minilm-bundle),
  dense and hybrid with that bundle's default fusion;
- cost: encode_latency.measure, the encoders taking turns block by block, each call one query on one thread;
  MiniLM alone is timed twice: in torch fp32 (the encoder its quality row used) and as the plain int8 ONNX
  export a new user would serve (encode_profile.export_plain).

    python -m bench.encoding.curve --index BUNDLE --teacher-report EVAL.json --student static=DIR \
        --student 6=DIR --layers 6=6 --reference 6 [--eval static=EVAL.json] [--minilm-bundle BUNDLE]

The ratio column is each encode p50 over the --reference student's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.encoding.encode_latency import DEFAULT_SCIFACT, Result, load_queries, measure, versions
from bench.harness.record import LoadSpan, command_line, machine, parse_with_output, publish, start_logging

log = logging.getLogger("bench.curve")

SECTION = "quality-cost-curve"
TEACHER = "teacher"
MINILM = "MiniLM alone (torch fp32)"
MINILM_PLAIN = "MiniLM alone (plain int8 ONNX)"


@dataclass(frozen=True)
class Quality:
    """nDCG@10 of one row: dense (asymmetric for a student) and hybrid (None where the row has none)."""

    dense: float | None
    hybrid: float | None


def named_paths(values: Sequence[str], flag: str) -> dict[str, Path]:
    """NAME=PATH pairs, in the order given."""
    out: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{flag} {value!r}: expected NAME=PATH")
        out[name] = Path(path)
    return out


def report_quality(path: Path) -> tuple[Quality, Quality, Quality]:
    """The asymmetric, teacher and BM25 rows of one `tandem eval --json` report."""
    report = json.loads(path.read_text())

    def ndcg(name: str) -> float | None:
        return report.get(name, {}).get("ndcg@10")

    return (Quality(ndcg("asymmetric"), ndcg("hybrid")), Quality(ndcg("teacher"), ndcg("teacher_hybrid")),
            Quality(ndcg("lexical"), None))


def student_quality(student: object, bundle_dir: Path, data: Path, split: str) -> Quality:
    """A student's asymmetric and hybrid nDCG@10 as `tandem eval` scores them (the same functions: queries encoded
    one per call, searched as the service searches), without its teacher and student-document setups: the curve
    needs neither, and on a shared 2-core machine the student's pass over the corpus is most of an eval's cost."""
    from models.evaluation.run import STUDENT_QUERY_BATCH

    return _scored(bundle_dir, data, split,
                   lambda texts: student.encode(texts, batch_size=STUDENT_QUERY_BATCH))  # type: ignore[attr-defined]


def _scored(bundle_dir: Path, data: Path, split: str, encode: Callable[[list[str]], object]) -> Quality:
    """Dense and hybrid (the bundle's default fusion) nDCG@10 of query vectors against a bundle, searched as the
    service searches."""
    from models.bundle.version import Bundle
    from models.bundle.versions import resolve_bundle
    from models.datasets.beir import load_beir
    from models.evaluation.metrics import NDCG, score_run
    from models.evaluation.run import bundle_search_run, mode_run
    from models.search import Mode

    dataset = load_beir(data, split)
    bundle = Bundle(resolve_bundle(bundle_dir))
    try:
        qids, texts = list(dataset.queries), list(dataset.queries.values())
        vectors = encode(texts)
        dense = score_run(dataset.qrels, bundle_search_run(bundle, qids, vectors))[NDCG]  # type: ignore[arg-type]
        hybrid = None
        if bundle.lexical is not None:
            hybrid = score_run(dataset.qrels, mode_run(bundle, qids, texts, vectors, Mode.HYBRID))[NDCG]  # type: ignore[arg-type]
    finally:
        bundle.close()
    return Quality(dense, hybrid)


def minilm_quality(bundle_dir: Path, data: Path, split: str, encode: Callable[[list[str]], object]) -> Quality:
    """MiniLM alone on its own documents: its queries against a bundle built with it as the teacher."""
    return _scored(bundle_dir, data, split, encode)


def _pct(value: float | None, base: float | None) -> str:
    return "" if value is None or not base else f"{value / base:.1%}"


def _num(value: float | None, fmt: str = ".4f") -> str:
    return "—" if value is None else format(value, fmt)


def render(rows: list[tuple[str, str, Quality, Result | None]], teacher: Quality, reference: Result,
           command: str, setup: str, load: str) -> str:
    lines = [
        "| model | layers | asym nDCG@10 | hybrid nDCG@10 | % of teacher (asym / hybrid) | encode p50 ms | p90 ms "
        "| ratio to reference |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, layers, quality, timing in rows:
        pct = f"{_pct(quality.dense, teacher.dense)} / {_pct(quality.hybrid, teacher.dense) or '—'}"
        cost = ("—", "—", "—") if timing is None else (
            f"{timing.p50:.3f}", f"{timing.p90:.3f}", f"{timing.p50 / reference.p50:.3f}×")
        lines.append(f"| {name} | {layers} | {_num(quality.dense)} | {_num(quality.hybrid)} | {pct} | "
                     f"{' | '.join(cost)} |")
    return "\n".join([
        "# The quality–cost curve",
        "",
        f"Command: `{command}`",
        "",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {machine()}; {versions()}; load average {load}",
        f"- Setup: {setup}",
        "",
        *lines,
        "",
        f"% of teacher: each nDCG@10 over the teacher's dense {teacher.dense:.4f}; ratio: encode p50 over "
        f"{reference.name}'s {reference.p50:.3f} ms.",
    ])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Quality against encode cost, every encoder timed in one run.")
    parser.add_argument("--student", action="append", default=[], required=True,
                        help="NAME=DIR of an exported student; repeat it (the order is the table's).")
    parser.add_argument("--layers", action="append", default=[], help="NAME=TEXT: the layers column of a student.")
    parser.add_argument("--eval", action="append", default=[],
                        help="NAME=JSON: take the student's quality from its `tandem eval` report, not --index.")
    parser.add_argument("--index", type=Path, required=True, help="The teacher's bundle of --data's corpus.")
    parser.add_argument("--teacher-report", type=Path, required=True,
                        help="A `tandem eval --json` report on --index and --split: the teacher and BM25 rows.")
    parser.add_argument("--reference", required=True, help="The student NAME the ratio column divides by.")
    parser.add_argument("--minilm-bundle", type=Path, default=None,
                        help="A bundle of the same corpus built with MiniLM as teacher: scores MiniLM alone.")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)),
                        help="BEIR directory: the queries timed (its test split) and, with --minilm-bundle, scored.")
    parser.add_argument("--split", default="test")
    parser.add_argument("--teacher", type=Path, default=None, help="Teacher HF directory (default: provisioned).")
    parser.add_argument("--backbone", type=Path, default=None, help="MiniLM HF directory (default: provisioned).")
    parser.add_argument("--no-plain", action="store_true", help="Skip timing MiniLM's plain int8 ONNX export.")
    parser.add_argument("--no-torch", action="store_true",
                        help="Skip timing the torch encoders (teacher, MiniLM fp32): a run of the fast ones alone.")
    parser.add_argument("-n", "--num-queries", type=int, default=300, help="Timed queries per encoder.")
    parser.add_argument("--warmup", type=int, default=30, help="Untimed queries per encoder first.")
    parser.add_argument("--rounds", type=int, default=6, help="Blocks each encoder's queries are split into.")
    args = parse_with_output(parser, argv)
    if min(args.num_queries, args.rounds) < 1 or args.warmup < 0 or args.rounds > args.num_queries:
        parser.error("--num-queries and --rounds must be >= 1 (rounds <= queries), --warmup >= 0")
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

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    paths, layers = named_paths(args.student, "--student"), {k: str(v) for k, v in
                                                              named_paths(args.layers, "--layers").items()}
    if args.reference not in paths:
        raise SystemExit(f"--reference {args.reference!r} is not a --student NAME ({', '.join(paths)})")
    reports = named_paths(args.eval, "--eval")
    _, teacher_q, bm25_q = report_quality(args.teacher_report)
    try:
        queries, described = load_queries(args.data, args.num_queries)
        students = {name: StudentEncoder(path, precision="int8", threads=1) for name, path in paths.items()}
        teacher = TeacherEncoder(resolve("teacher", args.teacher), device="cpu")
        backbone_dir = resolve("backbone", args.backbone)
        minilm = TeacherEncoder(backbone_dir, device="cpu")
    except TandemError as exc:
        log.error("%s", exc)
        sys.exit(2)
    students_q = {name: report_quality(reports[name])[0] if name in reports else
                  student_quality(s, args.index, args.data, args.split) for name, s in students.items()}
    for name, q in students_q.items():
        log.info("student %s: asymmetric %.4f, hybrid %s", name, q.dense, q.hybrid)
    minilm_q = Quality(None, None)
    if args.minilm_bundle is not None:
        minilm_q = minilm_quality(args.minilm_bundle, args.data, args.split,
                                  lambda texts: minilm.encode_queries(texts))
        log.info("MiniLM alone on its own documents: dense %.4f, hybrid %s", minilm_q.dense, minilm_q.hybrid)
    encoders: dict[str, Callable[[list[str]], object]] = {name: s.encode for name, s in students.items()}
    if not args.no_torch:
        encoders[TEACHER] = lambda texts: teacher.encode_queries(texts, batch_size=1)
        encoders[MINILM] = lambda texts: minilm.encode_queries(texts, batch_size=1)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_plain:
            from bench.encoding.encode_profile import Plain, export_plain

            plain = Plain(export_plain(backbone_dir, Path(tmp)), backbone_dir / "tokenizer.json",
                          minilm.card.max_seq_length)
            encoders[MINILM_PLAIN] = plain.encode
        log.info("queries: %s", described)
        span = LoadSpan()
        results = {r.name: r for r in measure(encoders, queries, args.warmup, args.rounds, 1)}
        load = span.text()
    for r in results.values():
        log.info("%-34s p50 %8.3f ms  p90 %8.3f ms  mean %8.3f ms", r.name, r.p50, r.p90, r.mean)
    rows: list[tuple[str, str, Quality, Result | None]] = [
        (f"student `{name}`", layers.get(name, ""), students_q[name], results[name])
        for name in paths
    ]
    rows += [
        (f"teacher {teacher.card.name} (torch fp32)", "12", teacher_q, results.get(TEACHER)),
        (f"{minilm.card.name} alone, own documents (torch fp32)", "6", minilm_q, results.get(MINILM)),
    ]
    if MINILM_PLAIN in results:
        rows.append((f"{minilm.card.name} alone, plain int8 ONNX", "6", Quality(None, None), results[MINILM_PLAIN]))
    rows.append(("BM25 (the bundle's lexical index)", "", bm25_q, None))
    setup = (
        f"one query per encode() call, one thread for every encoder (onnxruntime intra-op 1; torch 1 intra-op, 1 "
        f"inter-op), students int8 as served; {args.warmup} warm-up queries each, then {len(queries)} timed "
        f"queries each in {args.rounds} rounds of blocks, encoders taking turns. Queries: {described}. Quality: "
        f"nDCG@10 on the {args.split} split (students scored by `tandem eval`'s functions or read from its "
        f"reports; the teacher and BM25 from {args.teacher_report}; MiniLM alone on its own documents, "
        f"{args.minilm_bundle})."
    )
    section = render(rows, teacher_q, results[args.reference], command_line(args.argv), setup, load)
    publish(args.lab, SECTION, section, write=not args.no_write)


if __name__ == "__main__":
    main()
