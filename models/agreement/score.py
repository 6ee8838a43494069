"""How well a student agrees with its teacher on each segment of a version: the public API of issue 45.

Each segment's sample (models.bundle.sample) holds pseudo-queries of its documents and the teacher's vectors of them.
`score_segments` searches the version as served (models.search.dense_hits: the same first stage, rescoring and
oversampling as /search) once with the teacher's vectors and once with the student's (its int8 graph, each query
encoded alone as /search encodes a single request), and compares:

- `overlap`: the share of the teacher's top-10 that the student's top-10 holds, averaged over the queries;
- `student_hit` and `teacher_hit`: the share of queries whose source document each ranks in its top 10.

The teacher's top-10 is searched again rather than read from the sample: a later version (more segments, deletions)
has other documents to rank, and the comparison must be over the version asked about.

A student is judged against itself: `reference` is its overlap on its *home* segments (those of the version it was
distilled against, `home_segments`), and a segment is below the threshold when its overlap is under `THRESHOLD` ×
that reference (`below_threshold`). Why relative: the overlap a good student reaches depends on the corpus (how
crowded its neighbourhoods are), so an absolute bar would either flag a dense corpus the student knows or pass a
sparse one it does not; its own training corpus is the one place its agreement is known to be good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from pydantic import BaseModel, Field

from models.bundle.manifest import BundleManifest
from models.bundle.sample import read_sample
from models.bundle.vectors.index import DEFAULT_OVERSAMPLE
from models.bundle.version import Bundle, read_bundle_manifest
from models.encoders.student_manifest import StudentManifest
from models.errors import TandemError
from models.search.query import dense_hits

log = logging.getLogger(__name__)

TOP_K = 10
# A segment is below when its top-10 overlap is under this share of the home segments' (why this value:
# docs/lab/2026-11-26-agreement.md).
THRESHOLD = 0.80
VERSION = "version"  # the name of the version-level aggregate


class Encoder(Protocol):
    def encode(self, texts: Sequence[str], batch_size: int = ...) -> np.ndarray: ...


class SegmentAgreement(BaseModel):
    """One segment's agreement (or the version's, `segment` = "version"); figures are None without a sample."""

    segment: str
    queries: int = Field(description="sample queries scored (0: the segment has no sample, agreement unknown)")
    overlap: float | None = Field(default=None, description="mean share of the teacher's top-10 in the student's")
    student_hit: float | None = Field(default=None, description="share of queries whose source document the "
                                      "student ranks in its top 10")
    teacher_hit: float | None = Field(default=None, description="the same share for the teacher")
    home: bool = Field(default=False, description="a segment of the version the student was distilled against")
    below: bool | None = Field(default=None, description="below the threshold (None: unknown, no sample or no "
                               "home segment to compare with)")

    @property
    def known(self) -> bool:
        return self.queries > 0


def score_segments(bundle: Bundle, student: Encoder, *, only: Collection[str] | None = None,
                   deadline: float | None = None, oversample: int = DEFAULT_OVERSAMPLE,
                   stop: Callable[[], bool] | None = None) -> list[SegmentAgreement]:
    """Each segment's agreement (those named in `only`, else all), in the version's order.

    A segment without a sample is reported with `queries` 0. Past `deadline` (time.monotonic()), or once `stop()`
    is true, the segment being scored is dropped and no other is started: those are left out of the list, for a
    later call to score."""
    out: list[SegmentAgreement] = []

    def over() -> bool:
        return (deadline is not None and time.monotonic() > deadline) or (stop is not None and stop())

    for info in bundle.manifest.parts:
        if only is not None and info.name not in only:
            continue
        if over():
            break
        sample = read_sample(bundle.directory, bundle.manifest, info)
        if sample is None or not len(sample):
            out.append(SegmentAgreement(segment=info.name, queries=0))
            continue
        score = score_sample(bundle, student, info.name, sample.record.queries, sample.record.sources,
                             sample.vectors, oversample=oversample, stop=over)
        if score is None:
            break
        out.append(score)
    left = sum(1 for s in bundle.manifest.parts if only is None or s.name in only) - len(out)
    if left:
        log.debug("agreement: out of time; %d segment(s) left unscored", left)  # a caller with a deadline says more
    return out


def score_sample(bundle: Bundle, student: Encoder, name: str, queries: Sequence[str], sources: Sequence[str],
                 teacher_vectors: np.ndarray, *, oversample: int = DEFAULT_OVERSAMPLE,
                 stop: Callable[[], bool] | None = None) -> SegmentAgreement | None:
    """The agreement on one set of queries (a segment's sample, or any other draw): the student encodes each alone,
    as /search encodes a request; both searches are the version's as served. None once `stop()` is true."""
    if not len(queries):
        return SegmentAgreement(segment=name, queries=0)
    taught = []
    for q in queries:
        if stop is not None and stop():
            return None
        taught.append(student.encode([q]))
    teacher = [[h.doc.id for h in hits] for hits in dense_hits(bundle, teacher_vectors, TOP_K, oversample)]
    pupil = [[h.doc.id for h in hits] for hits in dense_hits(bundle, np.concatenate(taught), TOP_K, oversample)]
    return _compare(name, list(sources), teacher, pupil)


def _compare(name: str, sources: list[str], teacher: list[list[str]], student: list[list[str]]) -> SegmentAgreement:
    overlap = [len(set(t) & set(s)) / len(t) for t, s in zip(teacher, student, strict=True) if t]
    return SegmentAgreement(
        segment=name, queries=len(sources), overlap=float(np.mean(overlap)) if overlap else None,
        student_hit=float(np.mean([src in s for src, s in zip(sources, student, strict=True)])),
        teacher_hit=float(np.mean([src in t for src, t in zip(sources, teacher, strict=True)])))


def _weighted(scores: Sequence[SegmentAgreement], name: str) -> SegmentAgreement:
    known = [s for s in scores if s.known and s.overlap is not None]
    n = sum(s.queries for s in known)
    if not n:
        return SegmentAgreement(segment=name, queries=0)

    def mean(field: str) -> float | None:
        have = [(getattr(s, field), s.queries) for s in known if getattr(s, field) is not None]
        weight = sum(q for _, q in have)
        return sum(v * q for v, q in have) / weight if weight else None

    return SegmentAgreement(segment=name, queries=n, overlap=mean("overlap"), student_hit=mean("student_hit"),
                            teacher_hit=mean("teacher_hit"))


def version_agreement(scores: Sequence[SegmentAgreement]) -> SegmentAgreement:
    """The version's figure: its segments' (those with a sample), weighted by their sample queries."""
    return _weighted([s for s in scores if s.segment != VERSION], VERSION)


def home_segments(manifest: BundleManifest, student: StudentManifest) -> set[str]:
    """The segments of `manifest` the student was distilled on: those of the version it records (`trained_on`),
    and the first segment when its corpus is the one the student was trained on (sha256, or for students older than
    `trained_on`, the corpus path its training recorded)."""
    names: set[str] = set()
    trained = student.trained_on
    if trained is not None:
        try:
            names |= {s.name for s in read_bundle_manifest(Path(trained.bundle)).parts}
        except (TandemError, OSError):  # that version was pruned: its name is its first segment's
            names.add(trained.bundle_version)
        if trained.corpus_sha256 == manifest.corpus.sha256:
            names.add(manifest.parts[0].name)
    elif str(student.training.get("corpus", "")) == manifest.corpus.path:
        names.add(manifest.parts[0].name)
    return names & {s.name for s in manifest.parts}


def reference(scores: Sequence[SegmentAgreement], home: Collection[str]) -> SegmentAgreement:
    """The home segments' agreement, weighted by their sample queries (`queries` 0: none is known)."""
    return _weighted([s for s in scores if s.segment in home], "home")


def below_threshold(score: SegmentAgreement, home: SegmentAgreement, threshold: float = THRESHOLD) -> bool | None:
    """Whether `score`'s top-10 overlap is under `threshold` × the home segments' (None: either is unknown)."""
    if score.overlap is None or home.overlap is None:
        return None
    return score.overlap < threshold * home.overlap


def judge(scores: Sequence[SegmentAgreement], home: Collection[str],
          threshold: float = THRESHOLD) -> list[SegmentAgreement]:
    """`scores` with `home` and `below` filled in against the home segments' reference."""
    ref = reference(scores, home)
    return [s.model_copy(update={"home": s.segment in home, "below": below_threshold(s, ref, threshold)})
            for s in scores]


def flagged(scores: Sequence[SegmentAgreement]) -> list[str]:
    """The names of the judged segments below the threshold."""
    return [s.segment for s in scores if s.below]


class Verdict(BaseModel):
    """A version's segments judged: what `tandem index check` prints and /admin/status shows."""

    threshold: float = Field(description="a segment is below when its overlap is under this × the home segments'")
    home: SegmentAgreement = Field(description="the student's home segments together (queries 0: none known)")
    overall: SegmentAgreement = Field(description="the version's figure, over every segment with a sample")
    segments: list[SegmentAgreement]
    below: list[str] = Field(description="the segments below the threshold")


def verdict(scores: Sequence[SegmentAgreement], manifest: BundleManifest, student: StudentManifest,
            threshold: float = THRESHOLD) -> Verdict:
    """`scores` (of `manifest`'s segments) judged against the student's home segments."""
    home = home_segments(manifest, student)
    judged = judge(scores, home, threshold)
    return Verdict(threshold=threshold, home=reference(judged, home), overall=version_agreement(judged),
                   segments=judged, below=flagged(judged))
