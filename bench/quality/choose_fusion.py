"""Choose the served hybrid fusion (RRF, or convex and its alpha) on a BEIR *train* split, never on test.

Each query is searched once on each side (student vectors against the bundle, BM25), at the bundle's
fusion depth, through the service's own candidate functions; then every fusion is scored on the same
candidate lists. The output is a markdown table and a JSON file; the chosen default goes into
models/fusion_default.py, which every new bundle records.

    python -m bench.quality.choose_fusion --data ../shared/data/scifact --index .tandem/bundles/scifact-768-float \
        --student .tandem/students/scifact-quick --split train --json docs/results/fusion-scifact-train.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import numpy as np

from models.bundle.manifest import FusionMethod, FusionSpec
from models.bundle.version import Bundle
from models.datasets.beir import load_beir
from models.encoders.student import StudentEncoder
from models.evaluation.metrics import NDCG, score_run
from models.search import DEFAULT_OVERSAMPLE
from models.search.fusion import fuse
from models.search.query import allowed_rows, dense_candidates, documents, lexical_candidates

log = logging.getLogger("bench.choose_fusion")
ALPHAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--precision", default="int8", choices=["int8", "fp32"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.split == "test":
        parser.error("the fusion default is never chosen on test queries; use the train split")
    dataset = load_beir(args.data, args.split)
    bundle = Bundle(args.index)
    student = StudentEncoder(args.student, precision=args.precision, threads=os.cpu_count() or 1)
    bundle.require_lexical()
    depth = bundle.fusion.depth
    qids = list(dataset.queries)
    everywhere = allowed_rows(bundle, None)  # the live rows, as the service searches
    dense, sparse = [], []
    for qid in qids:
        text = dataset.queries[qid]
        vector = student.encode([text], batch_size=1)[0]
        dense.append(dense_candidates(bundle, vector, depth, everywhere, DEFAULT_OVERSAMPLE))
        sparse.append(lexical_candidates(bundle, text, depth, everywhere))
    # Every fusion ranks rows of these lists: their ids, read from the docstores once.
    seen = np.unique(np.concatenate([rows for _, rows in dense + sparse]))
    ids = {int(row): doc.id for row, doc in zip(seen, documents(bundle, seen), strict=True)}
    specs = {"dense": None, "lexical": None, "rrf": FusionSpec(method=FusionMethod.RRF, depth=depth)}
    specs |= {f"convex {a}": FusionSpec(method=FusionMethod.CONVEX, alpha=a, depth=depth) for a in ALPHAS}
    results: dict[str, float] = {}
    for name, spec in specs.items():
        run = {}
        for qid, d, s in zip(qids, dense, sparse, strict=True):
            scores, rows = d if name == "dense" else s if name == "lexical" else fuse(d, s, spec)  # type: ignore[arg-type]
            run[qid] = {ids[int(r)]: float(x) for r, x in zip(rows[:100], scores[:100], strict=True)}
        results[name] = score_run(dataset.qrels, run)[NDCG]
    best = max((n for n in results if n not in ("dense", "lexical")), key=lambda n: results[n])
    print(f"{args.data.name} [{args.split}], {len(qids)} queries, student {args.student.name} ({args.precision})")
    print("| fusion (asymmetric: student queries + BM25) | nDCG@10 |\n|---|---:|")
    for name, value in results.items():
        print(f"| {name}{' (best)' if name == best else ''} | {value:.4f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"data": str(args.data), "split": args.split, "n_queries": len(qids),
                                         "student": str(args.student), "ndcg@10": results, "best": best},
                                        indent=2) + "\n")
    bundle.close()


if __name__ == "__main__":
    main()
