"""BEIR loading, metric arithmetic and the three-setup evaluation on the tiny corpus."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from models.bundle.version import read_bundle_manifest
from models.datasets.beir import load_beir
from models.errors import ContractMismatch, InputError
from models.evaluation.matrix import MATRIX_DIMS, QUANTIZATIONS
from models.evaluation.metrics import run_from_rows, score_run
from models.evaluation.report import write_report
from models.evaluation.run import EvalRequest, format_table, run_eval
from tests.fixtures.corpus import PROBES

HEADER = "query-id\tcorpus-id\tscore\n"


def write_beir(
    root: Path,
    qrels: str,
    queries: dict[str, str] | None = None,
    corpus: Path | None = None,
    split: str = "test",
) -> Path:
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "qrels" / f"{split}.tsv").write_text(qrels)
    queries = queries if queries is not None else {"q1": "first question", "q2": "second", "q3": "unjudged"}
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
    if corpus is not None:
        shutil.copy(corpus, root / "corpus.jsonl")
    else:
        docs = [{"_id": d, "title": "", "text": f"document {d}"} for d in "abc"]
        (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return root


def test_loads_only_the_judged_queries(tmp_path: Path) -> None:
    root = write_beir(tmp_path, HEADER + "q2\ta\t1\nq1\tb\t2\nq1\tc\t0\n")
    ds = load_beir(root)
    assert list(ds.queries) == ["q2", "q1"]
    assert ds.queries["q1"] == "first question"
    assert ds.qrels == {"q2": {"a": 1}, "q1": {"b": 2, "c": 0}}
    assert [d.id for d in ds.corpus] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("qrels", "line", "message"),
    [
        ("q1\ta\t1\n", 1, "header"),
        (HEADER + "q1\ta\t1\nq1\ta\n", 3, "3 tab-separated fields"),
        (HEADER + "q1\ta\tyes\n", 2, "not an integer"),
        (HEADER + "q1\ta\t1\nq1\ta\t0\n", 3, "duplicate judgement"),
        (HEADER + "q1\ta\t1\nq9\tb\t1\n", 3, "'q9' is not in"),
    ],
)
def test_bad_qrels_name_file_and_line(tmp_path: Path, qrels: str, line: int, message: str) -> None:
    root = write_beir(tmp_path, qrels)
    with pytest.raises(InputError, match=message) as info:
        load_beir(root)
    assert f"test.tsv:{line}:" in str(info.value)


def test_bad_query_line_is_named(tmp_path: Path) -> None:
    root = write_beir(tmp_path, HEADER + "q1\ta\t1\n")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "fine"}\n\n{"_id": "q2", "text": \n')
    with pytest.raises(InputError, match=r"queries\.jsonl:3: invalid JSON"):
        load_beir(root)


def test_missing_split_lists_the_available_ones(tmp_path: Path) -> None:
    root = write_beir(tmp_path, HEADER + "q1\ta\t1\n", split="train")
    with pytest.raises(InputError, match=r"no qrels for split 'test' \(available: train\)"):
        load_beir(root, "test")


def test_metrics_on_a_hand_checked_ranking() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1, "x": 0}, "q3": {"d": 1}}
    run = {
        "q1": {"z": 0.9, "a": 0.8},  # relevant at rank 2
        "q2": {"b": 0.7, "x": 0.6},  # one of two relevant, at rank 1
        # q3: nothing retrieved
    }
    ndcg_q1 = 1 / math.log2(3)
    ndcg_q2 = 1 / (1 + 1 / math.log2(3))
    metrics = score_run(qrels, run)
    assert metrics["ndcg@10"] == pytest.approx((ndcg_q1 + ndcg_q2 + 0) / 3, abs=1e-4)
    assert metrics["recall@100"] == pytest.approx((1 + 0.5 + 0) / 3)


def test_run_from_rows_drops_padding() -> None:
    scores = np.array([[0.9, 0.5, -np.inf]], dtype=np.float32)
    rows = np.array([[2, 0, -1]])
    assert run_from_rows(["q"], scores, rows, ["a", "b", "c"]) == {"q": {"c": pytest.approx(0.9), "a": 0.5}}


@pytest.fixture(scope="module")
def tiny_beir(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: Path) -> Path:
    queries = {f"p{i}": text for i, text in enumerate(PROBES)}
    qrels = HEADER + "".join(f"p{i}\t{doc}\t1\n" for i, doc in enumerate(PROBES.values()))
    return write_beir(tmp_path_factory.mktemp("beir"), qrels, queries, corpus=tiny_corpus)


@pytest.fixture(scope="module")
def root_report(tiny_beir: Path, tiny_root: Path, tiny_student: Path) -> dict[str, Any]:
    """One evaluation, with the matrix, for the two tests below: the matrix only adds to the report (its setups'
    rows are computed as without it), and each evaluation encodes the probes with the teacher and the student."""
    return run_eval(EvalRequest(data=tiny_beir, index=tiny_root, student=tiny_student, matrix=True))  # its CURRENT


@pytest.mark.slow
def test_three_setups_on_the_tiny_corpus(root_report: dict[str, Any], tiny_root: Path) -> None:
    report = root_report
    assert report["meta"]["index"] == str((tiny_root / "v1").resolve())
    for setup in ("teacher", "asymmetric", "student"):
        assert 0.0 <= report[setup]["ndcg@10"] <= 1.0
        assert report[setup]["recall@100"] == 1.0  # 20 documents: top-100 holds them all
    assert report["teacher"]["ndcg@10"] == pytest.approx(1.0)  # every probe has one obvious answer
    assert report["retention"]["asymmetric"] == pytest.approx(report["asymmetric"]["ndcg@10"])
    assert report["meta"]["n_queries"] == len(PROBES)
    assert report["meta"]["quantization"] == "float"
    assert report["meta"]["precision"] == "int8"
    table = format_table(report)
    assert "asymmetric" in table and "retention" in table
    # The tiny bundle has a lexical index: BM25 and both hybrid rows come through the service's search path.
    for setup in ("lexical", "teacher_hybrid", "hybrid"):
        assert 0.0 <= report[setup]["ndcg@10"] <= 1.0 and setup in table
        assert report["retention"][setup] == pytest.approx(report[setup]["ndcg@10"])
    fusion = read_bundle_manifest(tiny_root / "v1").fusion
    assert fusion is not None and report["meta"]["fusion"] == fusion.model_dump(mode="json")


def test_bundle_of_another_corpus_is_refused(tmp_path: Path, tiny_bundle: Path, tiny_student: Path) -> None:
    root = write_beir(tmp_path, HEADER + "q1\ta\t1\n")
    with pytest.raises(ContractMismatch, match="was not built from"):
        run_eval(EvalRequest(data=root, index=tiny_bundle, student=tiny_student))


def test_unknown_precision_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="precision"):
        EvalRequest(data=tmp_path, index=tmp_path, student=tmp_path, precision="fp16")  # type: ignore[arg-type]


@pytest.mark.slow
def test_matrix_report_on_the_tiny_corpus(root_report: dict[str, Any], tmp_path: Path) -> None:
    report = root_report
    cells = {(c["setup"], c["rotation"], c["dim"], c["quantization"]): c for c in report["matrix"]}
    for setup in ("teacher", "asymmetric", "student"):
        assert {dim for s, r, dim, _ in cells if s == setup and r == "none"} == set(MATRIX_DIMS)
        assert {dim for s, r, dim, _ in cells if s == setup and r == "pca"} == set(MATRIX_DIMS) - {768}
    assert {dim for s, r, dim, _ in cells if s == "backbone" and r == "none"} == {384, 256, 128}  # its own width
    assert {q for *_, q in cells} == set(QUANTIZATIONS)
    assert all(c["retention"] == pytest.approx(1.0) for (s, *_), c in cells.items() if s == "teacher")
    plain = {(s, dim, q): c for (s, r, dim, q), c in cells.items() if r == "none"}
    # The matrix's cell for the bundle's own setting is the bundle's own evaluation.
    for setup in ("teacher", "asymmetric", "student"):
        assert plain[setup, 768, "float"]["ndcg@10"] == pytest.approx(report[setup]["ndcg@10"], abs=1e-6)
    backbone = plain["backbone", 384, "float"]
    assert backbone["retention"] == pytest.approx(backbone["ndcg@10"] / plain["teacher", 768, "float"]["ndcg@10"])

    paths = write_report(report, tmp_path / "report")
    assert [p.name for p in paths] == ["eval.json", "setups.md", "setups.png", "matrix.md", "ndcg_vs_dim.png"]
    assert json.loads(paths[0].read_text())["matrix"] == report["matrix"]
    assert "| hybrid |" in paths[1].read_text() and "| lexical |" in paths[1].read_text()
    table = paths[3].read_text()
    assert "| asymmetric | 128 |" in table and "| asymmetric (pca) | 128 |" in table and "binary+rescore" in table
    assert paths[2].read_bytes().startswith(b"\x89PNG") and paths[4].read_bytes().startswith(b"\x89PNG")
