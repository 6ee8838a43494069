"""Ranking metrics with pytrec_eval: nDCG@10 and Recall@100, the figures every report quotes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytrec_eval

from models.datasets.beir import Qrels

TOP_K = 100
NDCG, RECALL = "ndcg@10", "recall@100"
_MEASURES = {"ndcg_cut.10": NDCG, "recall.100": RECALL}

Run = dict[str, dict[str, float]]


def score_run(qrels: Qrels, run: Run) -> dict[str, float]:
    """Mean nDCG@10 and Recall@100 over every judged query; a query without results scores 0."""
    per_query = pytrec_eval.RelevanceEvaluator(qrels, set(_MEASURES)).evaluate(run)
    out = {}
    for measure, name in _MEASURES.items():
        key = measure.replace(".", "_")
        out[name] = float(np.mean([per_query.get(qid, {}).get(key, 0.0) for qid in qrels]))
    return out


def run_from_rows(qids: Sequence[str], scores: np.ndarray, rows: np.ndarray, doc_ids: Sequence[str]) -> Run:
    """pytrec_eval run from FAISS-style (scores, rows) where rows index `doc_ids`; -1 rows are padding."""
    return {
        qid: {doc_ids[r]: float(s) for s, r in zip(srow, rrow, strict=True) if r >= 0}
        for qid, srow, rrow in zip(qids, scores, rows, strict=True)
    }
