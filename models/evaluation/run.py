"""Retrieval quality of the three setups on a BEIR dataset, with pytrec_eval.

- teacher:    teacher-encoded queries (with the teacher's query prompt) against the bundle (the quality ceiling);
- asymmetric: student-encoded queries against the same bundle (what `tandem serve` does);
- student:    student-encoded queries and documents, indexed like the bundle (the baseline
              that shows what the teacher-built index buys).
Retention is each setup's nDCG@10 over the teacher's (dense).

Bundles with a lexical index add three rows, searched as the service searches (models.search):
- lexical:        BM25 alone;
- teacher_hybrid: teacher queries fused with BM25, by the bundle's recorded default fusion;
- hybrid:         student queries fused with BM25 (what `mode: hybrid` serves).

With `matrix`, the same encodings (plus the teacher's full-dimension document vectors from
the embedding store, and the student's backbone used alone in its own space, `backbone`)
are also scored at every dim and quantization (eval_matrix.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel
from tqdm.auto import tqdm

from models.bundle.manifest import FusionSpec
from models.bundle.version import Bundle
from models.bundle.versions import resolve_bundle
from models.contract import check_same_teacher
from models.datasets.beir import BeirDataset, load_beir
from models.encoders.precision import StudentPrecision
from models.encoders.registry import ModelCard, resolve
from models.encoders.student import StudentEncoder
from models.errors import ContractMismatch
from models.evaluation.matrix import Setup, evaluate_matrix
from models.evaluation.metrics import NDCG, RECALL, TOP_K, Run, run_from_rows, score_run
from models.search import DEFAULT_OVERSAMPLE, Mode, SearchOptions, VectorIndex, dense_hits, search

log = logging.getLogger(__name__)

SETUPS = ("teacher", "asymmetric", "student")
HYBRID_SETUPS = ("lexical", "teacher_hybrid", "hybrid")
STUDENT_DOC_BATCH = 32
# Queries go through the student one per call, as `POST /search` encodes a single query: the
# int8 graph quantizes activations over each call's whole tensor, so batching queries together
# (with their padding) changes their vectors. On SciFact with the full preset's student, int8
# asymmetric nDCG@10 was 0.6394 encoded one by one and 0.6337 in batches of 64 (fp32: 0.6413 both).
STUDENT_QUERY_BATCH = 1


class EvalRequest(BaseModel):
    """What `tandem eval` was asked: a BEIR directory, the bundle built from its corpus, the student to score."""

    data: Path
    index: Path
    student: Path
    split: str = "test"
    teacher: Path | None = None
    backbone: Path | None = None
    precision: StudentPrecision = "int8"
    device: str | None = None
    matrix: bool = False


def bundle_search_run(bundle: Bundle, qids: Sequence[str], queries: np.ndarray) -> Run:
    """The run of query vectors against a bundle, searched as the service searches it (top TOP_K)."""
    hits = dense_hits(bundle, queries, TOP_K)
    return {qid: {h.doc.id: h.score for h in row} for qid, row in zip(qids, hits, strict=True)}


def mode_run(bundle: Bundle, qids: Sequence[str], texts: list[str], vectors: np.ndarray | None, mode: Mode,
             fusion: FusionSpec | None = None) -> Run:
    """The run of one search mode over a bundle, through the service's own search path."""
    opts = SearchOptions(top_k=TOP_K, mode=mode)
    if fusion is not None:
        bundle.fusion = fusion
    found = search(bundle, vectors, texts, opts, DEFAULT_OVERSAMPLE)
    return {qid: {h.doc.id: h.score for h in row} for qid, row in zip(qids, found.hits, strict=True)}


def _check_corpus(bundle: Bundle, dataset: BeirDataset) -> None:
    bundle_ids, corpus_ids = set(bundle.ids()), {d.id for d in dataset.corpus}
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
    """Evaluate teacher, asymmetric and student setups (and the matrix); returns a JSON-ready report."""
    precision = req.precision
    dataset = load_beir(req.data, req.split)
    bundle = Bundle(resolve_bundle(req.index))  # a bundle root: its CURRENT version, as serve does
    try:
        _check_corpus(bundle, dataset)
        student = StudentEncoder(req.student, precision=precision, threads=os.cpu_count() or 1)
        bundle.check_student(student.teacher)
        from models.encoders.teacher import TeacherEncoder  # torch: imported only once the inputs check out

        teacher = TeacherEncoder(resolve("teacher", req.teacher), device=req.device)
        check_same_teacher(teacher.card.teacher_ref(), bundle.teacher, what="teacher model")
        dim, quantization = bundle.manifest.dim, bundle.manifest.quantization
        qids, texts = list(dataset.queries), list(dataset.queries.values())
        doc_ids, passages = [d.id for d in dataset.corpus], [d.passage() for d in dataset.corpus]
        vectors: dict[str, np.ndarray] = {}

        def bundle_run(name: str, encode: Callable[[list[str]], np.ndarray]) -> Run:
            vectors[name] = encode(texts)
            return bundle_search_run(bundle, qids, vectors[name])

        def student_run() -> Run:
            vectors["student_docs"] = encode_passages(student, passages)
            index = VectorIndex.build(vectors["student_docs"], dim, quantization)
            scores, rows = index.search(vectors["asymmetric"], TOP_K)
            return run_from_rows(qids, scores, rows, doc_ids)

        seconds: dict[str, float] = {}
        runs = {
            "teacher": _timed("teacher", seconds, lambda: bundle_run("teacher", teacher.encode_queries)),
            "asymmetric": _timed("asymmetric", seconds, lambda: bundle_run(
                "asymmetric", lambda queries: student.encode(queries, batch_size=STUDENT_QUERY_BATCH))),
            "student": _timed("student", seconds, student_run),
        }
        if bundle.lexical is not None:
            runs["lexical"] = _timed("lexical", seconds, lambda: mode_run(bundle, qids, texts, None, Mode.LEXICAL))
            runs["teacher_hybrid"] = _timed("teacher_hybrid", seconds, lambda: mode_run(
                bundle, qids, texts, vectors["teacher"], Mode.HYBRID))
            runs["hybrid"] = _timed("hybrid", seconds, lambda: mode_run(
                bundle, qids, texts, vectors["asymmetric"], Mode.HYBRID))
        else:
            log.warning("bundle %s has no lexical index: no lexical or hybrid rows", bundle.directory)
        fusion = bundle.fusion
    finally:
        bundle.close()
    report: dict = {name: score_run(dataset.qrels, run) for name, run in runs.items()}
    base = report["teacher"][NDCG]
    report["retention"] = {
        name: (report[name][NDCG] / base if base > 0 else None) for name in runs if name != "teacher"
    }
    if req.matrix:
        started = time.perf_counter()
        teacher_docs = _teacher_documents(teacher.card, dataset, req.device)
        backbone_queries, backbone_docs = _backbone_vectors(req.backbone, texts, passages, req.device)
        setups = [
            Setup("teacher", vectors["teacher"], teacher_docs),
            Setup("asymmetric", vectors["asymmetric"], teacher_docs),
            Setup("student", vectors["asymmetric"], vectors["student_docs"]),
            Setup("backbone", backbone_queries, backbone_docs),
        ]
        report["matrix"] = [cell.as_dict() for cell in evaluate_matrix(setups, qids, doc_ids, dataset.qrels)]
        seconds["matrix"] = round(time.perf_counter() - started, 2)
    report["meta"] = {
        "data": str(dataset.directory.resolve()),
        "split": dataset.split,
        "n_queries": len(qids),
        "n_docs": len(dataset.corpus),
        "index": str(bundle.directory.resolve()),
        "student": str(student.directory),
        "teacher": teacher.card.name,
        "dim": dim,
        "quantization": quantization.value,
        "precision": precision,
        "top_k": TOP_K,
        "student_query_batch": STUDENT_QUERY_BATCH,
        "fusion": fusion.model_dump(mode="json") if "hybrid" in runs else None,
        "seconds": seconds,
    }
    return report


def _teacher_documents(card: ModelCard, dataset: BeirDataset, device: str | None) -> np.ndarray:
    """The teacher's full-dimension document vectors: the indexer's embedding-store entry, else encoded once."""
    from models.datasets.teacher_targets import TeacherTargets

    targets = TeacherTargets(card, device)
    try:
        return targets.documents(dataset.corpus)
    finally:
        targets.release()


def _backbone_vectors(
    backbone: Path | None, queries: list[str], passages: list[str], device: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """The student's backbone alone, un-distilled, in its own space: what skipping the teacher gives."""
    from models.encoders.teacher import TeacherEncoder

    encoder = TeacherEncoder(resolve("backbone", backbone), device=device)
    log.info("backbone %s alone: encoding %d queries and %d documents", encoder.card.name, len(queries),
             len(passages))
    return encoder.encode_queries(queries), encoder.encode_documents(passages, progress=True)


def format_table(report: dict) -> str:
    meta = report["meta"]
    lines = [
        f"{meta['data']} [{meta['split']}]: {meta['n_queries']} queries, {meta['n_docs']} docs; "
        f"index {meta['dim']}-d {meta['quantization']}, student {meta['precision']}",
        f"{'setup':<16}{'nDCG@10':>9}{'R@100':>9}{'retention':>11}{'seconds':>9}",
    ]
    for name in (*SETUPS, *HYBRID_SETUPS):
        if name not in report:
            continue
        retention = 1.0 if name == "teacher" else report["retention"][name]
        shown = "n/a" if retention is None else f"{retention:.1%}"
        lines.append(
            f"{name:<16}{report[name][NDCG]:>9.4f}{report[name][RECALL]:>9.4f}{shown:>11}"
            f"{meta['seconds'][name]:>9.1f}"
        )
    if meta.get("fusion"):
        f = meta["fusion"]
        how = f"convex, alpha {f['alpha']} (dense)" if f["method"] == "convex" else f"rrf, k {f['rrf_k']}"
        lines.append(f"hybrid rows: the bundle's default fusion, {how}, {f['depth']} candidates a side")
    return "\n".join(lines)
