"""Retrieval quality of the three setups on a BEIR dataset, with pytrec_eval.

- teacher:    teacher-encoded queries against the bundle (the quality ceiling);
- asymmetric: student-encoded queries against the same bundle (what `tandem serve` does);
- student:    student-encoded queries and documents, indexed like the bundle (the baseline
              that shows what the teacher-built index buys).
Retention is each setup's nDCG@10 over the teacher's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytrec_eval
from pydantic import BaseModel
from tqdm.auto import tqdm

from models.beir import BeirDataset, Qrels, load_beir
from models.bundle import Bundle
from models.contract import check_same_teacher
from models.errors import ContractMismatch, InputError
from models.registry import resolve
from models.student import Precision, StudentEncoder
from models.vector_index import VectorIndex

log = logging.getLogger(__name__)

TOP_K = 100
NDCG, RECALL = "ndcg@10", "recall@100"
_MEASURES = {"ndcg_cut.10": NDCG, "recall.100": RECALL}
PRECISIONS: tuple[Precision, ...] = ("int8", "fp32")
SETUPS = ("teacher", "asymmetric", "student")
STUDENT_DOC_BATCH = 32

Run = dict[str, dict[str, float]]


class EvalRequest(BaseModel):
    data: Path
    index: Path
    student: Path
    split: str = "test"
    teacher: Path | None = None
    precision: str = "int8"
    device: str | None = None


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


def _bundle_run(bundle: Bundle, qids: Sequence[str], queries: np.ndarray) -> Run:
    hits = bundle.search(queries, TOP_K)
    return {qid: {h.doc.id: h.score for h in row} for qid, row in zip(qids, hits, strict=True)}


def _check_corpus(bundle: Bundle, dataset: BeirDataset) -> None:
    bundle_ids, corpus_ids = set(bundle.docs.ids()), {d.id for d in dataset.corpus}
    if bundle_ids != corpus_ids:
        only_bundle, only_corpus = sorted(bundle_ids - corpus_ids), sorted(corpus_ids - bundle_ids)
        raise ContractMismatch(
            f"bundle {bundle.directory} was not built from {dataset.directory}: "
            f"{len(only_bundle)} ids only in the bundle (e.g. {only_bundle[:3]}), "
            f"{len(only_corpus)} only in the corpus (e.g. {only_corpus[:3]})"
        )
    unjudgeable = {d for judged in dataset.qrels.values() for d in judged} - corpus_ids
    if unjudgeable:
        log.warning("%d judged documents are not in the corpus; they count as never retrieved",
                    len(unjudgeable))


def encode_passages(student: StudentEncoder, texts: Sequence[str]) -> np.ndarray:
    """Student vectors for many documents; length-sorted batches keep padding small."""
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = np.empty((len(texts), student.dim), dtype=np.float32)
    with tqdm(total=len(texts), desc="student docs", unit="doc") as bar:
        for start in range(0, len(order), STUDENT_DOC_BATCH):
            idx = order[start : start + STUDENT_DOC_BATCH]
            out[idx] = student.encode([texts[i] for i in idx], batch_size=STUDENT_DOC_BATCH)
            bar.update(len(idx))
    return out


def _timed(name: str, seconds: dict[str, float], fn: Callable[[], Run]) -> Run:
    start = time.perf_counter()
    run = fn()
    seconds[name] = round(time.perf_counter() - start, 2)
    log.info("%s setup: %.1f s", name, seconds[name])
    return run


def run_eval(req: EvalRequest) -> dict:
    """Evaluate teacher, asymmetric and student setups; returns the report as a JSON-ready dict."""
    if req.precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {req.precision!r}")
    precision: Precision = "int8" if req.precision == "int8" else "fp32"
    dataset = load_beir(req.data, req.split)
    bundle = Bundle(req.index)
    try:
        _check_corpus(bundle, dataset)
        student = StudentEncoder(req.student, precision=precision, threads=os.cpu_count() or 1)
        bundle.check_student(student.teacher)
        from models.teacher import TeacherEncoder  # torch: imported only once the inputs check out

        teacher = TeacherEncoder(resolve("teacher", req.teacher), device=req.device)
        check_same_teacher(teacher.card.teacher_ref(), bundle.teacher, what="teacher model")
        dim, quantization = bundle.manifest.dim, bundle.manifest.quantization
        qids, texts = list(dataset.queries), list(dataset.queries.values())

        def student_run() -> Run:
            vectors = encode_passages(student, [d.passage() for d in dataset.corpus])
            scores, rows = VectorIndex.build(vectors, dim, quantization).search(student.encode(texts), TOP_K)
            return run_from_rows(qids, scores, rows, [d.id for d in dataset.corpus])

        seconds: dict[str, float] = {}
        runs = {
            "teacher": _timed("teacher", seconds, lambda: _bundle_run(bundle, qids, teacher.encode(texts))),
            "asymmetric": _timed(
                "asymmetric", seconds, lambda: _bundle_run(bundle, qids, student.encode(texts))
            ),
            "student": _timed("student", seconds, student_run),
        }
    finally:
        bundle.close()
    report: dict = {name: score_run(dataset.qrels, runs[name]) for name in SETUPS}
    base = report["teacher"][NDCG]
    report["retention"] = {
        name: (report[name][NDCG] / base if base > 0 else None) for name in ("asymmetric", "student")
    }
    report["meta"] = {
        "data": str(dataset.directory.resolve()),
        "split": dataset.split,
        "n_queries": len(qids),
        "n_docs": len(dataset.corpus),
        "index": str(Path(req.index).resolve()),
        "student": str(student.directory),
        "teacher": teacher.card.name,
        "dim": dim,
        "quantization": quantization.value,
        "precision": precision,
        "top_k": TOP_K,
        "seconds": seconds,
    }
    return report


def format_table(report: dict) -> str:
    meta = report["meta"]
    lines = [
        f"{meta['data']} [{meta['split']}]: {meta['n_queries']} queries, {meta['n_docs']} docs; "
        f"index {meta['dim']}-d {meta['quantization']}, student {meta['precision']}",
        f"{'setup':<12}{'nDCG@10':>9}{'R@100':>9}{'retention':>11}{'seconds':>9}",
    ]
    for name in SETUPS:
        retention = 1.0 if name == "teacher" else report["retention"][name]
        shown = "n/a" if retention is None else f"{retention:.1%}"
        lines.append(
            f"{name:<12}{report[name][NDCG]:>9.4f}{report[name][RECALL]:>9.4f}{shown:>11}"
            f"{meta['seconds'][name]:>9.1f}"
        )
    return "\n".join(lines)
