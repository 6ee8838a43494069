"""models.agreement: comparing top-10s, the version's figure, the home segments and the threshold (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.agreement.draw import draw_queries, draw_rows
from models.agreement.score import (
    THRESHOLD,
    SegmentAgreement,
    _compare,
    below_threshold,
    flagged,
    home_segments,
    judge,
    reference,
    version_agreement,
)
from models.bundle.manifest import BundleManifest, CorpusInfo, EmbeddingSource, SegmentInfo
from models.bundle.vectors.index_spec import Quantization
from models.contract import TeacherRef
from models.corpus import Document
from models.encoders.student_manifest import StudentManifest, TrainedOn

TEACHER = TeacherRef(name="t", fingerprint="f" * 64, dim=8)


def _manifest(segments: list[str], corpus: str = "/data/corpus.jsonl", sha: str = "a" * 64) -> BundleManifest:
    parts = [SegmentInfo(name=n, path="." if i == 0 else f"segments/{n}", count=1) for i, n in enumerate(segments)]
    return BundleManifest(teacher=TEACHER, dim=8, quantization=Quantization.FLOAT, count=len(parts),
                          corpus=CorpusInfo(path=corpus, sha256=sha, count=1),
                          embeddings=EmbeddingSource(kind="encoded"), segments=parts, version=segments[-1])


def _student(trained_on: TrainedOn | None = None, corpus: str | None = None) -> StudentManifest:
    return StudentManifest(teacher=TEACHER, backbone="b", backbone_fingerprint="b", max_seq_length=32,
                           trained_on=trained_on, training={"corpus": corpus} if corpus else {})


def test_compare_counts_the_teachers_top_the_student_keeps_and_each_ones_source_hits() -> None:
    teacher = [["a", "b", "c", "d"], ["e", "f", "g", "h"]]
    student = [["a", "b", "x", "y"], ["e", "f", "g", "h"]]
    score = _compare("s", ["a", "z"], teacher, student)
    assert score.queries == 2
    assert score.overlap == pytest.approx((2 / 4 + 4 / 4) / 2)
    assert score.student_hit == 0.5 and score.teacher_hit == 0.5


def test_the_version_figure_weighs_segments_by_their_queries_and_skips_unknown_ones() -> None:
    scores = [SegmentAgreement(segment="a", queries=30, overlap=0.9, student_hit=0.8, teacher_hit=0.9),
              SegmentAgreement(segment="b", queries=10, overlap=0.5, student_hit=0.4, teacher_hit=0.7),
              SegmentAgreement(segment="c", queries=0)]
    overall = version_agreement(scores)
    assert (overall.segment, overall.queries) == ("version", 40)
    assert overall.overlap == pytest.approx((0.9 * 30 + 0.5 * 10) / 40)
    assert version_agreement([SegmentAgreement(segment="c", queries=0)]).overlap is None


def test_a_segment_is_below_under_the_threshold_times_the_home_segments_overlap() -> None:
    home = SegmentAgreement(segment="home", queries=10, overlap=0.8)
    assert below_threshold(SegmentAgreement(segment="x", queries=5, overlap=0.8 * THRESHOLD - 0.01), home)
    assert below_threshold(SegmentAgreement(segment="x", queries=5, overlap=0.8 * THRESHOLD + 0.01), home) is False
    assert below_threshold(SegmentAgreement(segment="x", queries=0), home) is None
    assert below_threshold(home, SegmentAgreement(segment="home", queries=0)) is None


def test_judge_marks_home_segments_and_flags_the_ones_below() -> None:
    scores = [SegmentAgreement(segment="v1", queries=20, overlap=0.8),
              SegmentAgreement(segment="v2", queries=20, overlap=0.78),
              SegmentAgreement(segment="v3", queries=20, overlap=0.3),
              SegmentAgreement(segment="v4", queries=0)]
    judged = judge(scores, {"v1"})
    assert [s.home for s in judged] == [True, False, False, False]
    assert [s.below for s in judged] == [False, False, True, None]
    assert flagged(judged) == ["v3"]
    assert reference(judged, {"v1"}).overlap == 0.8
    assert flagged(judge(scores, set())) == []  # no home: nothing is judged


def test_home_segments_are_the_trained_on_versions_and_the_first_when_its_corpus_is_the_students(
        tmp_path: Path) -> None:
    manifest = _manifest(["v1", "v2", "v3"])
    trained = TrainedOn(corpus="/data/corpus.jsonl", corpus_sha256="a" * 64, documents=1, train_texts=1,
                        train_queries=1, real_queries=0, bundle=str(tmp_path / "gone" / "v2"), bundle_version="v2")
    assert home_segments(manifest, _student(trained)) == {"v1", "v2"}  # v2 pruned: its name stands for it
    other = trained.model_copy(update={"corpus_sha256": "b" * 64})
    assert home_segments(manifest, _student(other)) == {"v2"}
    assert home_segments(manifest, _student(corpus="/data/corpus.jsonl")) == {"v1"}  # older student: the path
    assert home_segments(manifest, _student(corpus="/elsewhere.jsonl")) == set()


def test_draws_are_seeded_by_the_segment_name_and_give_one_query_per_document() -> None:
    assert draw_rows(100, 10, "seg") == draw_rows(100, 10, "seg")
    assert draw_rows(100, 10, "seg") != draw_rows(100, 10, "other")
    assert draw_rows(5, 10, "seg") == [0, 1, 2, 3, 4]
    docs = {i: Document(id=f"d{i}", title=f"Title {i}", text="A sentence long enough to be a query here.")
            for i in range(5)}
    queries, sources = draw_queries([0, 2, 4], lambda rows: [docs[r] for r in rows], "seg")
    assert sources == ["d0", "d2", "d4"] and len(queries) == 3
    assert draw_queries([0, 2, 4], lambda rows: [docs[r] for r in rows], "seg") == (queries, sources)
