"""A second `make demo` reuses the corpus, bundle and student only while their inputs are unchanged.

Real parts: a bundle built by the indexer with a tiny teacher (tests/fixtures/tiny_models.py), student manifests
written and read as the exporter does, corpus files on disk. No student is trained here: the student's key is read
from its manifest, which is what these tests write.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from indexer.build import BuildRequest, build
from models.bundle.manifest import BUNDLE_FORMAT
from models.distill.presets import PRESETS
from models.encoders.registry import load_card
from models.encoders.student_manifest import STUDENT_MANIFEST, StudentManifest, TrainedOn
from models.hashing import sha256_file
from tandem.demo_reuse import (
    bundle_key,
    changed,
    corpus_key,
    read_bundle_key,
    read_student_key,
    record_corpus,
    recorded_corpus,
    reusable,
    student_key,
)
from tests.fixtures.tiny_models import StSpec, TinyModels


@pytest.fixture(scope="module")
def tiny_teacher(tiny_models: TinyModels) -> Path:
    return tiny_models.carded(StSpec(arch="bert", pooling="mean"))


@pytest.fixture(scope="module")
def tiny_bundle(tandem_home: Path, tiny_teacher: Path, tiny_corpus: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo-reuse") / "bundle"
    build(BuildRequest(corpus=tiny_corpus, out=out, teacher=tiny_teacher))
    return out


def test_a_bundle_is_reused_only_for_the_inputs_it_was_built_from(tiny_bundle: Path, tiny_teacher: Path,
                                                                   tiny_corpus: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    corpus_sha, teacher_fp = sha256_file(tiny_corpus), load_card(tiny_teacher).fingerprint
    built = read_bundle_key(tiny_bundle)
    assert built == {"corpus_sha256": corpus_sha, "teacher": teacher_fp, "precision": "fp32",
                     "bundle_format": BUNDLE_FORMAT}
    with caplog.at_level(logging.INFO, logger="tandem.demo_reuse"):
        assert reusable("bundle", tiny_bundle, built, bundle_key(corpus_sha, teacher_fp, "fp32"))
    assert "demo bundle reused" in caplog.text
    # each input that changes the vectors or the files rebuilds, and the log names it
    assert changed(built, bundle_key(corpus_sha, teacher_fp, "bf16")) == ["precision"]
    assert changed(built, bundle_key("0" * 64, teacher_fp, "fp32")) == ["corpus_sha256"]
    assert changed(built, bundle_key(corpus_sha, "f" * 64, "fp32")) == ["teacher"]
    assert changed({**built, "bundle_format": BUNDLE_FORMAT - 1}, bundle_key(corpus_sha, teacher_fp, "fp32")) \
        == ["bundle_format"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tandem.demo_reuse"):
        assert not reusable("bundle", tiny_bundle, built, bundle_key(corpus_sha, teacher_fp, "bf16"))
    assert "precision 'fp32' changed" in caplog.text


def test_no_bundle_or_another_format_is_built(tmp_path: Path) -> None:
    assert read_bundle_key(tmp_path / "absent") is None
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "manifest.json").write_text('{"format_version": 0}')
    assert read_bundle_key(tmp_path / "old") is None
    assert changed(None, bundle_key("a", "b", "fp32")) == ["corpus_sha256", "teacher", "precision", "bundle_format"]


def _student(directory: Path, teacher: Path, corpus_sha: str, precision: str | None, preset: str) -> Path:
    card = load_card(teacher)
    manifest = StudentManifest(
        teacher=card.teacher_ref(), backbone="tiny", backbone_fingerprint="b" * 64, max_seq_length=48,
        training={"preset": PRESETS[preset].model_dump()},
        trained_on=TrainedOn(corpus="corpus.jsonl", corpus_sha256=corpus_sha, documents=3, train_texts=9,
                             train_queries=6, real_queries=0, bundle="bundle", bundle_version="bundle",
                             teacher_precision=precision))
    directory.mkdir(parents=True)
    (directory / STUDENT_MANIFEST).write_text(manifest.model_dump_json())  # as the exporter writes it
    return directory


def test_a_student_is_reused_only_for_its_corpus_teacher_precision_and_preset(tiny_teacher: Path,
                                                                              tmp_path: Path) -> None:
    fp = load_card(tiny_teacher).fingerprint
    student = _student(tmp_path / "s", tiny_teacher, "c" * 64, "fp32", "quick")
    built = read_student_key(student)
    assert not changed(built, student_key("c" * 64, fp, "fp32", PRESETS["quick"]))
    assert changed(built, student_key("c" * 64, fp, "bf16", PRESETS["quick"])) == ["precision"]
    assert changed(built, student_key("c" * 64, fp, "fp32", PRESETS["default"])) == ["preset"]
    assert changed(built, student_key("d" * 64, fp, "fp32", PRESETS["quick"])) == ["corpus_sha256"]
    assert changed(built, student_key("c" * 64, "f" * 64, "fp32", PRESETS["quick"])) == ["teacher"]
    # a student distilled before the precision was recorded is distilled again
    older = read_student_key(_student(tmp_path / "old", tiny_teacher, "c" * 64, None, "quick"))
    assert changed(older, student_key("c" * 64, fp, "fp32", PRESETS["quick"])) == ["precision"]


def test_the_corpus_is_reused_only_under_its_key_and_with_its_bytes(tmp_path: Path) -> None:
    walker = tmp_path / "walker.py"
    walker.write_text("# the walking code\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "json.loads", "title": "json.loads(s)", "text": "Deserialize s."}\n')
    key = corpus_key(3000, walker)
    assert recorded_corpus(corpus, key) is None  # never recorded
    record_corpus(corpus, key, 1)
    assert recorded_corpus(corpus, key) == 1
    assert recorded_corpus(corpus, corpus_key(10, walker)) is None  # another max_docs
    walker.write_text("# the walking code, changed\n")
    assert recorded_corpus(corpus, corpus_key(3000, walker)) is None  # another walker
    corpus.write_text(corpus.read_text() + '{"_id": "os.getcwd", "title": "os.getcwd()", "text": "The cwd."}\n')
    assert recorded_corpus(corpus, key) is None  # the bytes changed since


def test_the_demo_loads_its_teacher_once_for_build_sample_and_targets(tandem_home: Path, tiny_teacher: Path,
                                                                      tiny_corpus: Path, tmp_path: Path) -> None:
    """`tandem demo serve` builds with keep_teacher: the build's encoding, its agreement sample and the
    distillation's targets share one loaded teacher (they loaded it three times), and it is let go before serving."""
    from models.corpus import read_corpus
    from models.datasets.teacher_targets import TeacherTargets
    from models.encoders.teacher_cache import release_teacher, teacher_loads

    corpus = tmp_path / "corpus.jsonl"  # not in the embedding store yet: the build encodes it
    corpus.write_text(tiny_corpus.read_text().replace('"text": "', '"text": "Demo. ', 3))
    release_teacher()
    before = teacher_loads()
    manifest = build(BuildRequest(corpus=corpus, out=tmp_path / "bundle", teacher=tiny_teacher, keep_teacher=True))
    assert manifest.embeddings.precision == "fp32" and manifest.parts[0].name
    targets = TeacherTargets(load_card(tiny_teacher))
    queries = targets.queries([f"{d.title} demo query" for d in read_corpus(corpus)])
    assert len(queries) == len(read_corpus(corpus))
    after = teacher_loads()
    assert after.misses - before.misses == 1  # one load
    assert after.hits - before.hits >= 2  # the sample's queries and the targets reused it
    targets.release()
    assert teacher_loads().currsize == 0
