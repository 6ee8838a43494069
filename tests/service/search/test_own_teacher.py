"""A teacher of the user's own, end to end: a CLS-pooled teacher with a query prompt (BGE's setup), a BERT
backbone with CLS pooling: build, quick distill, serve, /search, /v1/embeddings, eval, and the refusals.

The models are tiny random-weight encoders (tests/fixtures/tiny_models.py), saved by sentence-transformers,
which is also the reference the teacher's vectors are checked against.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.verify import verify
from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.version import Bundle, read_bundle_manifest
from models.datasets.beir import load_beir
from models.datasets.teacher_targets import TeacherTargets
from models.distill.pipeline import DistillRequest, run_distill
from models.embeddings.store import EmbeddingStore
from models.encoders.encoder_setup import Overrides
from models.encoders.registry import describe, load_card, write_card
from models.encoders.student import StudentEncoder, read_student_manifest
from models.errors import ContractMismatch
from models.evaluation.metrics import NDCG, score_run
from models.evaluation.run import EvalRequest, bundle_search_run, run_eval
from service.core.loader import check_compatible
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.server import serve_app
from tests.fixtures.student import TEST_PRESET, TEST_SEED
from tests.fixtures.tiny_models import StSpec, TinyModels
from tests.service.api.test_service_refuses import altered_student, serve_cli

QUERY_PROMPT = "Represent this sentence for searching relevant passages: "
MIN_COSINE = 0.9999  # the embedding store and the targets cache hold float16


@pytest.fixture(scope="module")
def teacher(tiny_models: TinyModels) -> Path:
    return tiny_models.st(StSpec(arch="bert", pooling="cls", prompts=(("query", QUERY_PROMPT),)))


@pytest.fixture(scope="module")
def backbone(tiny_models: TinyModels) -> Path:
    return tiny_models.st(StSpec(arch="bert", pooling="cls", hidden=32))


def _build(teacher: Path, corpus: Path, out: Path) -> Path:
    build(BuildRequest(corpus=corpus, out=out, dim=64, teacher=teacher))
    return out


def _distill(bundle: Path, teacher: Path, backbone: Path, corpus: Path, out: Path) -> Path:
    run_distill(DistillRequest(corpus=corpus, index=bundle, out=out, preset=TEST_PRESET, seed=TEST_SEED,
                               teacher=teacher, backbone=backbone))
    return out


@pytest.fixture(scope="module")
def bundle(tandem_home: Path, teacher: Path, tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(teacher, tiny_corpus, tmp_path_factory.mktemp("own") / "bundle")


@pytest.fixture(scope="module")
def student(bundle: Path, teacher: Path, backbone: Path, tiny_corpus: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _distill(bundle, teacher, backbone, tiny_corpus, tmp_path_factory.mktemp("own") / "student")


def _reference(model_dir: Path, texts: list[str], prompt_name: str | None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    return model.encode(texts, prompt_name=prompt_name, normalize_embeddings=True)


def test_the_bundle_records_the_setup_and_holds_the_document_vectors(bundle: Path, teacher: Path) -> None:
    manifest = read_bundle_manifest(bundle)
    assert (manifest.teacher.pooling, manifest.teacher.query_prompt, manifest.teacher.document_prompt) == (
        "cls", QUERY_PROMPT, "")
    assert manifest.teacher.fingerprint == describe(teacher).fingerprint
    assert manifest.teacher == load_card(teacher).teacher_ref()  # the record a bundle of a teacher carries
    (line,) = verify(bundle, teacher=teacher)
    assert "matches (pooling cls, query prompt 'Represent this sentence" in line
    key = manifest.embeddings.store_key
    assert key is not None
    stored = EmbeddingStore().load(key)
    assert stored is not None
    # documents take the document prompt: this teacher has none, as sentence-transformers' encode() without one
    expected = _reference(teacher, [f"{title} {text}" for _, title, text in DOCS], None)
    assert np.sum(stored * expected, axis=1).min() >= MIN_COSINE


def test_query_targets_are_the_teachers_vectors_of_the_prompted_queries(student: Path, teacher: Path) -> None:
    texts = list(PROBES)
    targets = TeacherTargets(load_card(teacher)).queries(texts)
    prompted = _reference(teacher, texts, "query")
    plain = _reference(teacher, texts, None)
    assert np.sum(targets * prompted, axis=1).min() >= MIN_COSINE
    assert np.sum(targets * plain, axis=1).max() < 0.999  # the prompt made a difference
    manifest = read_student_manifest(student)
    assert manifest.teacher == load_card(teacher).teacher_ref()  # the record a student of a teacher carries
    assert manifest.teacher.query_prompt == QUERY_PROMPT
    assert manifest.backbone_pooling == "cls"  # the backbone's pooling, inside the graph the parity gate passed
    assert manifest.parity is not None and manifest.parity.fp32_mean_cosine >= 0.999


def test_the_service_searches_and_embeds_plain_queries(bundle: Path, student: Path) -> None:
    query = next(iter(PROBES))
    with serve_app(create_app(ServiceSettings(index=bundle, student=student, port=0))) as server:
        found = server.client.post("/search", json={"query": query, "top_k": 3})
        assert found.status_code == 200, found.text
        hits = found.json()["results"]
        assert len(hits) == 3 and {h["id"] for h in hits} <= {doc_id for doc_id, _, _ in DOCS}
        embedded = server.client.post("/v1/embeddings", json={"input": [query]})
        assert embedded.status_code == 200, embedded.text
    vector = np.array(embedded.json()["data"][0]["embedding"], dtype=np.float32)
    # the request's text is encoded as it came: the student learned raw query → prompted target
    np.testing.assert_allclose(vector, StudentEncoder(student).encode([query])[0], atol=1e-5)


def test_evals_teacher_row_encodes_queries_with_the_prompt(bundle: Path, student: Path, teacher: Path,
                                                          tiny_corpus: Path, tmp_path: Path) -> None:
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    (data / "corpus.jsonl").write_text(tiny_corpus.read_text())
    qids = {f"q{i}": (text, doc) for i, (text, doc) in enumerate(PROBES.items())}
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, (t, _) in qids.items()))
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, (_, d) in qids.items()))
    report = run_eval(EvalRequest(data=data, index=bundle, student=student, teacher=teacher, precision="fp32"))
    dataset = load_beir(data)
    queries = _reference(teacher, list(dataset.queries.values()), "query")
    reader = Bundle(bundle)
    try:
        expected = score_run(dataset.qrels, bundle_search_run(reader, list(dataset.queries), queries))
    finally:
        reader.close()
    assert report["teacher"][NDCG] == pytest.approx(expected[NDCG], abs=1e-9)


@pytest.fixture(scope="module")
def unprompted_teacher(tiny_models: TinyModels, teacher: Path) -> Path:
    """The same weights and pooling, without the query prompt (what `models add --query-prompt ''` records)."""
    copy = tiny_models.copy(teacher, "own-unprompted")
    write_card(describe(copy, overrides=Overrides(query_prompt="")))
    return copy


@pytest.fixture(scope="module")
def mean_teacher(tiny_models: TinyModels, teacher: Path) -> Path:
    """The same weights and prompt, mean-pooled."""
    copy = tiny_models.copy(teacher, "own-mean")
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 64, "pooling_mode": "mean"}))
    return copy


def test_a_student_of_the_same_weights_without_the_prompt_is_refused(
    bundle: Path, student: Path, unprompted_teacher: Path, tmp_path: Path
) -> None:
    """The student as a distillation against the unprompted teacher records it: its manifest's teacher is that
    teacher's card's reference (run_distill writes `card.teacher_ref()`, pinned for the prompted one by
    test_query_targets_are_the_teachers_vectors_of_the_prompted_queries), its weights the same. The refusal reads
    the manifests only, before loading anything heavy, so no second build and distillation are paid for it."""
    unprompted = load_card(unprompted_teacher).teacher_ref()
    assert (unprompted.query_prompt, unprompted.pooling) == ("", "cls")
    other = altered_student(student, tmp_path / "student", unprompted.model_dump())
    assert read_student_manifest(other).teacher == unprompted
    with pytest.raises(ContractMismatch, match=r"no prompts.*query prompt 'Represent"):
        check_compatible(ServiceSettings(index=bundle, student=other))
    result = serve_cli(bundle, other)
    assert result.returncode == 2, result.stderr
    assert "fingerprint" in result.stderr and "another embedding space" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bundle_of_the_same_weights_pooled_otherwise_is_refused(
    bundle: Path, student: Path, mean_teacher: Path, teacher: Path, backbone: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    """The bundle as a build by the mean-pooled teacher records it: its manifest's teacher is that teacher's card's
    reference (a build writes `card.teacher_ref()`, pinned for the CLS one by
    test_the_bundle_records_the_setup_and_holds_the_document_vectors). Both refusals read the manifests before
    any vector, so no second build is paid for them."""
    assert describe(mean_teacher).weights_sha256 == describe(teacher).weights_sha256
    mean_bundle = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    manifest = json.loads((mean_bundle / BUNDLE_MANIFEST).read_text())
    manifest["teacher"] = load_card(mean_teacher).teacher_ref().model_dump()
    (mean_bundle / BUNDLE_MANIFEST).write_text(json.dumps(manifest))
    assert read_bundle_manifest(mean_bundle).teacher.pooling == "mean"
    with pytest.raises(ContractMismatch, match=r"pooling cls.*pooling mean"):
        check_compatible(ServiceSettings(index=mean_bundle, student=student))
    with pytest.raises(ContractMismatch, match=r"pooling mean.*pooling cls"):  # and distill against it, before training
        run_distill(DistillRequest(corpus=tiny_corpus, index=mean_bundle, out=tmp_path / "s", preset=TEST_PRESET,
                                   teacher=teacher, backbone=backbone))
