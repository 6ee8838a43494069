"""A student's agreement with its teacher per segment (issue 45): its own corpus against another domain's update.

A root is built from a corpus the student was distilled on (SciFact, from the teacher's reference vectors), then
`tandem index update` adds documents of another domain (the demo corpus: the standard library's docstrings);
`tandem index check` scores each segment's agreement sample. To choose the threshold, each segment is scored again
on `--draws` other samples of the same size (other seeds), which shows how much a sample's figure moves by chance:
a threshold must sit below the home segments' figure by more than that, and above the other domain's.

    python -m bench.quality.segment_agreement --corpus ../shared/data/scifact/corpus.jsonl \
        --embeddings ../shared/data/scifact/reference/all-mpnet-base-v2.corpus.f16.npy \
        --ids ../shared/data/scifact/reference/all-mpnet-base-v2.corpus.ids.json \
        --student ../bench/student --work /tmp/segment-agreement
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.harness.record import command_line, cpu_line, parse_with_output, publish, start_logging
from indexer.build import BuildRequest, build
from indexer.check import check, describe
from indexer.sample import sample_size
from indexer.versions.update import UpdateRequest, update
from models.agreement.draw import draw_queries, draw_rows
from models.agreement.score import THRESHOLD, score_sample
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore
from models.bundle.version import Bundle, in_segment
from models.bundle.versions import read_current
from models.corpus import read_corpus
from models.distill.presets import Preset
from models.distill.texts.data import build_training_data
from models.encoders.registry import load_card, resolve
from models.encoders.student import StudentEncoder, read_student_manifest
from models.encoders.teacher import TeacherEncoder
from tandem.demo_corpus import write_demo_corpus

log = logging.getLogger("bench.segment_agreement")
HELDOUT = "held out"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="The corpus the student was distilled on.")
    parser.add_argument("--embeddings", type=Path, help="Its teacher vectors, imported (else encoded).")
    parser.add_argument("--ids", type=Path, help="The ids of --embeddings' rows.")
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="Scratch directory (the root is rebuilt there).")
    parser.add_argument("--other-docs", type=int, default=800, help="Demo-corpus documents the update adds.")
    parser.add_argument("--draws", type=int, default=10, help="Other samples per segment, for the spread.")
    return parse_with_output(parser, argv)


def heldout_rows(corpus: Path, student: Path, store: DocStore) -> list[int]:
    """The home segment's rows of the documents the student's distillation held out for validation: none of their
    text was trained on (models.distill.texts.data), so they stand for unseen documents of the student's own domain."""
    training = read_student_manifest(student).training
    docs = read_corpus(corpus)
    val = build_training_data(docs, Preset.model_validate(training["preset"]), int(str(training["seed"]))).val
    found = store.rows_of([docs[row].id for row in val.passages])
    return sorted(found.values())


def spread(bundle: Bundle, student: StudentEncoder, teacher: TeacherEncoder, draws: int,
           rows_of: dict[str, list[int] | None]) -> dict[str, list[float]]:
    """Each named segment's top-10 overlap on `draws` samples of the indexer's size, drawn with other seeds (from
    the rows given, else all its rows)."""
    size = sample_size()
    out: dict[str, list[float]] = {}
    for label, only in rows_of.items():
        segment = bundle.segments[0] if only is not None else next(s for s in bundle.segments if s.info.name == label)
        info = segment.info
        store = DocStore(bundle.directory / in_segment(info, DOCSTORE_FILE))
        try:
            figures = []
            for k in range(draws):
                seed = f"{label}/draw-{k}"
                rows = draw_rows(info.count, size, seed) if only is None else \
                    [only[i] for i in draw_rows(len(only), size, seed)]
                queries, sources = draw_queries(rows, store.get, seed)
                vectors = teacher.encode_queries(queries).astype(np.float16).astype(np.float32)
                score = score_sample(bundle, student, info.name, queries, sources, vectors)
                assert score is not None and score.overlap is not None
                figures.append(score.overlap)
        finally:
            store.close()
        out[label] = figures
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start_logging()
    command = command_line(argv)
    root = args.work / "root"
    shutil.rmtree(root, ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    build(BuildRequest(corpus=args.corpus, root=root, embeddings=args.embeddings, ids=args.ids))
    build_s = time.perf_counter() - began
    other = args.work / "other.jsonl"
    write_demo_corpus(other, max_docs=args.other_docs)
    began = time.perf_counter()
    update(UpdateRequest(changes=other, root=root))
    update_s = time.perf_counter() - began
    began = time.perf_counter()
    report = check(root, args.student)
    check_s = time.perf_counter() - began
    student = StudentEncoder(args.student, "int8")
    teacher = TeacherEncoder(Path(load_card(resolve("teacher", None)).path), precision="fp32")
    bundle = Bundle(read_current(root), lexical=False)
    try:
        first = bundle.segments[0]
        store = DocStore(bundle.directory / in_segment(first.info, DOCSTORE_FILE))
        try:
            heldout = heldout_rows(args.corpus, args.student, store)
        finally:
            store.close()
        wanted: dict[str, list[int] | None] = {s.segment: None for s in report.segments}
        wanted[HELDOUT] = heldout
        figures = spread(bundle, student, teacher, args.draws, wanted)
    finally:
        bundle.close()
    home = report.home.overlap or float("nan")
    rows = []
    for s in report.segments:
        f = np.array(figures[s.segment])
        rows.append(f"| {s.segment} | {'home' if s.home else 'update: ' + str(args.other_docs) + ' demo docs'} | "
                    f"{s.queries} | {s.overlap:.3f} | {s.student_hit:.3f} | {s.teacher_hit:.3f} | "
                    f"{f.mean():.3f} ± {f.std(ddof=1):.3f} ({f.min():.3f}–{f.max():.3f}) | "
                    f"{(s.overlap or 0) / home:.2f} | {'yes' if s.below else 'no'} |")
    f = np.array(figures[HELDOUT])
    rows.append(f"| {report.segments[0].segment}, held out | the {len(heldout)} documents the distillation held out "
                f"(none of their text trained on) | | | | | {f.mean():.3f} ± {f.std(ddof=1):.3f} "
                f"({f.min():.3f}–{f.max():.3f}) | {f.mean() / home:.2f} | |")
    o = report.overall
    text = "\n".join([
        f"# {datetime.now(UTC):%Y-%m-%d}: a student's agreement per segment, its own corpus and another domain's",
        "",
        f"Command: `{command}`; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {cpu_line()}.",
        "",
        f"Root built from `{args.corpus}` (imported teacher vectors: {build_s:.1f} s, the sample included), then "
        f"`tandem index update` with the first {args.other_docs} documents of the demo corpus ({update_s:.1f} s, "
        f"the teacher encoding them and the sample's queries); `tandem index check` with `{args.student}` took "
        f"{check_s:.1f} s. Samples of {sample_size()} queries per segment; the int8 student encodes each query alone.",
        "",
        "| segment | what | queries | overlap@10 | student hit@10 | teacher hit@10 | overlap over "
        f"{args.draws} other samples: mean ± sd (min–max) | overlap / home | below {THRESHOLD} × home |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        f"| version | all | {o.queries} | {o.overlap:.3f} | {o.student_hit:.3f} | {o.teacher_hit:.3f} | | | |",
        "",
        "`tandem index check` printed:",
        "",
        "```",
        *describe(report),
        "```",
    ])
    publish(args.lab, "agreement", text, write=not args.no_write)


if __name__ == "__main__":
    main()
