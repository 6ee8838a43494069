"""How closely students rank like their teacher, without labels: overlap@10 over the corpus, by kind of query.

Why: training validates on the overlap@10 of held-out pseudo-queries and held-out real train-split
queries together, and SciFact's 300 judged queries move nDCG@10 by ±0.004 between runs that agree on
that figure. Splitting it by kind shows where a recipe changes the student; the test queries'
overlap (their judgments unused) shows whether the change reaches real queries of the benchmark, and
the held-out passages, encoded as queries, whether it costs long queries (some BEIR sets have them).
It is a diagnostic, never a criterion that picks an epoch or a preset.

For each student the validation texts of its own run are rebuilt from its student.json (preset, seed,
corpus, and the dataset's train-split queries if it trained on them); its int8 graph encodes each
query alone, as `POST /search` does. Teacher vectors of the validation texts come from the target
cache (`tandem distill` put them there); the test queries are encoded by the teacher here.

    python -m bench.quality.agreement --data ../shared/data/scifact --index .tandem/bundles/scifact-768-float \
        .tandem/students/scifact-full-b32 .tandem/students/scifact-full-b16
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.harness.record import command_line, cpu_line, parse_with_output, publish, start_logging

log = logging.getLogger("bench.agreement")

SECTION = "student-agreement"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("students", type=Path, nargs="+", help="student directories (tandem distill --out)")
    parser.add_argument("--data", type=Path, required=True, help="BEIR dataset directory (corpus, queries, qrels)")
    parser.add_argument("--index", type=Path, required=True, help="bundle built from the dataset's corpus")
    parser.add_argument("--split", default="test", help="qrels split whose queries are scored (labels unused)")
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start_logging()
    import torch

    from models.bundle.version import Bundle
    from models.contract import check_same_teacher
    from models.datasets.beir import QUERIES_FILE, load_beir
    from models.datasets.teacher_targets import TeacherTargets
    from models.distill.presets import Preset
    from models.distill.texts.data import build_training_data
    from models.distill.texts.queries import read_train_queries
    from models.distill.training.scores import overlap_at_k
    from models.encoders.registry import load_card, resolve
    from models.encoders.student import StudentEncoder, read_student_manifest
    from models.encoders.teacher import TeacherEncoder
    from models.errors import TandemError

    try:
        bundle = Bundle(args.index)
        card = load_card(resolve("teacher"))
        check_same_teacher(card.teacher_ref(), bundle.teacher, what="teacher model")
        dataset = load_beir(args.data, args.split)
        manifests = [read_student_manifest(s) for s in args.students]
        # read once, and only if a student trained on train-split queries: it must have used these
        trained_on_queries = any(m.training["texts"]["train_queries"] for m in manifests)
        train_queries = read_train_queries(args.data / QUERIES_FILE) if trained_on_queries else []
    except TandemError as exc:
        log.error("%s", exc)
        sys.exit(2)
    docs, test = dataset.corpus, list(dataset.queries.values())
    targets = TeacherTargets(card)
    bank = torch.from_numpy(np.ascontiguousarray(targets.documents(docs), dtype=np.float32))
    test_teacher = TeacherEncoder(card.path).encode_queries(test)
    rows = []
    for directory, manifest in zip(args.students, manifests, strict=True):
        training = manifest.training
        preset = Preset.model_validate(training["preset"])
        real = train_queries if training["texts"]["train_queries"] else []
        if len(real) != training["texts"]["train_queries"]:
            sys.exit(f"{directory} trained on {training['texts']['train_queries']} train-split queries, "
                     f"{args.data / QUERIES_FILE} has {len(real)}: not this student's data")
        val = build_training_data(docs, preset, int(training["seed"]), real).val
        encoder = StudentEncoder(directory, precision="int8", threads=2)
        val_teacher, n_pseudo = targets.queries(val.queries), len(val.queries) - val.real
        kinds = {  # texts and their teacher vectors; val.queries holds the pseudo-queries, then the real ones
            "pseudo": (val.queries[:n_pseudo], val_teacher[:n_pseudo]),
            "real": (val.queries[n_pseudo:], val_teacher[n_pseudo:]),
            "test": (test, test_teacher),
            "passages": ([docs[row].passage() for row in val.passages], bank[val.passages].numpy()),
        }
        overlap = {
            name: overlap_at_k(np.concatenate([encoder.encode([text]) for text in texts]), teacher, bank)
            for name, (texts, teacher) in kinds.items()
        }
        cells = " | ".join(f"{overlap[name]:.4f} ({len(texts)})" for name, (texts, _) in kinds.items())
        per_epoch = "all" if preset.passages_per_epoch is None else preset.passages_per_epoch
        recipe = f"{preset.members} × {preset.epochs} | {per_epoch} | {preset.batch_size} | {preset.real_query_repeats}"
        rows.append(f"| `{directory.name}` | {recipe} | {cells} |")
        log.info("%s: %s", directory, overlap)
    command = command_line(argv)
    text = "\n".join([
        "# Students' agreement with the teacher, by kind of query",
        "",
        f"Command: `{command}`; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {cpu_line()}. overlap@10 of the int8 "
        f"student's top 10 (one query per call) with the teacher's, over the {len(docs):,} documents, on each "
        f"run's held-out pseudo-queries and held-out real train-split queries, on the `{args.split}` queries "
        "(judgments unused), and on the run's held-out passages used as long queries (each is itself in the corpus, "
        "so both top 10s usually hold it); query counts in brackets.",
        "",
        "| student | members × epochs | passages per epoch | batch | real-query repeats | held-out pseudo-queries "
        "| held-out real queries | test queries | held-out passages |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])
    bundle.close()
    publish(args.lab, SECTION, text, write=not args.no_write)


if __name__ == "__main__":
    main()
