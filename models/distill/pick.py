"""Which of a version's segments a refresh trains on when none is named: those its student disagrees with.

Each segment the student has not been trained on (refresh.new_segments) is scored as `tandem index check` scores it
(models.agreement: the sample the indexer keeps per segment, the student's top-10 against the teacher's) and judged
against the student's home segments; the unseen segments below the threshold are picked. A segment whose agreement
is unknown (written before the indexer kept samples, or no home segment with a sample to compare with) cannot be
judged: it is returned apart, for the caller's fallback (`tandem distill --from` trains on it, as it did before
agreement was measured; the follower only when the unknown segments hold enough documents).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from models.agreement.score import THRESHOLD, SegmentAgreement, home_segments, judge, reference, score_segments
from models.bundle.manifest import BundleManifest
from models.bundle.version import Bundle
from models.encoders.student import StudentEncoder, read_student_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pick:
    """The unseen segments judged: below the threshold, agreeing, and unknown (no sample to judge by)."""

    below: list[str]
    agree: list[str]
    unknown: list[str]
    scores: list[SegmentAgreement]  # the unseen segments' judged scores
    home_overlap: float | None
    threshold: float

    def describe(self) -> str:
        """One line for the log: each unseen segment's overlap and the bar it was judged by."""
        figures = ", ".join(f"{s.segment} {s.overlap:.3f}" if s.overlap is not None else f"{s.segment} unknown"
                            for s in self.scores)
        bar = ("no bar: no home segment with a sample" if self.home_overlap is None else
               f"bar {self.threshold:.2f} × home {self.home_overlap:.3f} = {self.threshold * self.home_overlap:.3f}")
        return (f"top-10 overlap with the teacher on the unseen segments: {figures or 'none'} ({bar}); below: "
                f"{', '.join(self.below) or 'none'}; unknown (no sample): {', '.join(self.unknown) or 'none'}")


def pick_segments(version_dir: Path, manifest: BundleManifest, student_dir: Path, unseen: Sequence[str], *,
                  threshold: float = THRESHOLD,
                  scored: MutableMapping[str, SegmentAgreement] | None = None) -> Pick:
    """Judge the `unseen` segments of the version at `version_dir` for the student at `student_dir`.

    `scored` caches raw scores by segment name for one student (the follower keeps it between versions, so a segment
    is scored once): only the segments missing from it (the unseen ones and the home ones they are judged against)
    are scored."""
    home = home_segments(manifest, read_student_manifest(student_dir))
    cache: MutableMapping[str, SegmentAgreement] = {} if scored is None else scored
    missing = (home | set(unseen)) - set(cache)
    if missing:  # the graph is loaded only to score: a follower whose segments are all scored skips it
        student = StudentEncoder(student_dir, "int8", threads=1)
        bundle = Bundle(version_dir, lexical=False)
        try:
            bundle.check_student(student.teacher)
            for score in score_segments(bundle, student, only=missing):
                cache[score.segment] = score
        finally:
            bundle.close()
    order = [s.name for s in manifest.parts if s.name in cache and (s.name in home or s.name in unseen)]
    judged = judge([cache[n] for n in order], home, threshold)
    mine = [s for s in judged if s.segment in unseen]
    return Pick(below=[s.segment for s in mine if s.below], agree=[s.segment for s in mine if s.below is False],
                unknown=[n for n in unseen if n not in {s.segment for s in mine if s.below is not None}],
                scores=mine, home_overlap=reference(judged, home).overlap, threshold=threshold)
