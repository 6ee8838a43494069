"""A student's agreement with its teacher per segment of a bundle version, for issue 45's refresh acceptance.

For each segment, queries are cut from a sample of its live documents by the distillation's own generator
(models.distill.texts.data.pseudo_queries) with the titles left out and under a seed no training run uses, so no query
is a text a student trained on verbatim (a sentence or a span of a document it saw, as real queries often are).
Each student's int8 graph encodes them one call per query, as `POST /search` does; the figure is the mean share
of the teacher's top 10 over the whole version (every live document, the teacher's vectors) that the student's
top 10 shares, and beside it the share of queries whose source document each model ranks in its top 10.

    python -m bench.quality.refresh_domain --index ROOT --student served=/work/bench/student --student refreshed=DIR

`--union-corpus OUT` instead writes the version's live documents as one corpus (what a from-scratch distillation
on the union reads), and puts the teacher's vectors of it, concatenated from its segments' embedding-store
entries, under that corpus's store key: a from-scratch run then finds its document targets as the refresh does.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.harness.record import cpu_line, start_logging

log = logging.getLogger("bench.refresh_domain")

SEED = "refresh-bench"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="bundle version or root (CURRENT)")
    parser.add_argument("--student", action="append", default=[], help="NAME=DIR (repeat)")
    parser.add_argument("--docs", type=int, default=300, help="documents sampled per segment, one query each")
    parser.add_argument("--union-corpus", type=Path, help="write the live documents here (and seed their targets)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start_logging()
    import torch

    from models.bundle.version import read_bundle_manifest
    from models.bundle.versions import resolve_bundle
    from models.corpus import Document
    from models.datasets.teacher_targets import TeacherTargets
    from models.distill.refresh import segment_documents
    from models.distill.texts.data import pseudo_queries
    from models.distill.training.scores import overlap_at_k, top_k
    from models.encoders.registry import load_card, resolve
    from models.encoders.student import StudentEncoder

    version = resolve_bundle(args.index)
    manifest = read_bundle_manifest(version)
    card = load_card(resolve("teacher", None))
    targets = TeacherTargets(card)
    segments = [(s.name, segment_documents(version, manifest, [s.name])) for s in manifest.parts]
    docs = [d for _, seg in segments for d in seg]
    bank_np = np.concatenate([targets.documents(seg) for _, seg in segments])
    if args.union_corpus is not None:
        _seed_union(args.union_corpus, docs, bank_np, targets)
        return
    bank = torch.from_numpy(np.ascontiguousarray(bank_np, dtype=np.float32))
    print(f"CPU: {cpu_line()}")
    print(f"version {version}: {len(docs)} live documents in {len(segments)} segments")
    results: dict[str, dict[str, dict[str, float]]] = {}
    start = 0
    for name, seg in segments:
        rng = random.Random(f"{SEED}:{name}")
        picked = sorted(rng.sample(range(len(seg)), min(args.docs, len(seg))))
        queries, sources = [], []
        for row in picked:
            doc = seg[row]
            cut = pseudo_queries(Document(doc.id, "", doc.text), 1, random.Random(f"{SEED}:{doc.id}"))
            if cut:
                queries.append(cut[0])
                sources.append(start + row)
        start += len(seg)
        teacher = targets.queries(queries)
        found = {"teacher_source_at_10": _source_share(top_k(teacher, bank, 10), sources)}
        results[name] = {"queries": {"n": float(len(queries))}, "teacher": found}
        for spec in args.student:
            label, path = spec.split("=", 1)
            encoder = StudentEncoder(Path(path), precision="int8", threads=2)
            mine = np.concatenate([encoder.encode([q]) for q in queries])
            results[name][label] = {"overlap_at_10": overlap_at_k(mine, teacher, bank),
                                    "source_at_10": _source_share(top_k(mine, bank, 10), sources)}
        print(f"segment {name} ({len(seg)} documents, {len(queries)} queries): "
              + "; ".join(f"{k} {v}" for k, v in results[name].items() if k != "queries"))
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu_line(), "version": str(version), "segments": results},
                                        indent=2) + "\n")


def _source_share(top: np.ndarray, sources: list[int]) -> float:
    return float(np.mean([s in row for row, s in zip(top, sources, strict=True)]))


def _seed_union(out: Path, docs: list, vectors: np.ndarray, targets: object) -> None:
    from models.corpus import corpus_key
    from models.embeddings.store import EmbeddingStore, store_key

    card = targets.card  # type: ignore[attr-defined]
    out.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs))
    key = store_key(card.fingerprint, card.max_seq_length, corpus_key(docs))
    EmbeddingStore().put(key, vectors, {"source": "bench/quality/refresh_domain.py: the segments' entries, "
                                                   "concatenated",
                                        "teacher": card.fingerprint, "max_seq_length": card.max_seq_length})
    print(f"wrote {out} ({len(docs)} documents) and its targets under store key {key}")


if __name__ == "__main__":
    sys.exit(main())
