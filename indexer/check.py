"""`tandem index check`: how well a student agrees with the teacher on each segment of a version (issue 45).

Each segment's agreement sample (indexer.sample) is scored as the service would search it (models.agreement):
the share of the teacher's top-10 the student's top-10 holds, and the share of queries whose source document each
ranks in its top 10; then the version's overall figure, and which segments fall below the threshold relative to the
student's home segments (those of the version it was distilled against).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from models.agreement.score import Verdict, score_segments, verdict
from models.bundle.version import Bundle
from models.bundle.versions import resolve_bundle
from models.encoders.student import StudentEncoder


class CheckReport(Verdict):
    """What `tandem index check --json` prints: the verdict, and on what."""

    bundle: str = Field(description="the version directory checked")
    version: str | None
    student: str


def check(path: Path, student_dir: Path, threads: int = 1) -> CheckReport:
    """Score every segment of `path` (a bundle root's CURRENT version, or a bundle directory) for the student."""
    directory = resolve_bundle(Path(path))
    student = StudentEncoder(Path(student_dir), "int8", threads=threads)
    bundle = Bundle(directory, lexical=False)
    try:
        bundle.check_student(student.teacher)
        judged = verdict(score_segments(bundle, student), bundle.manifest, student.manifest)
    finally:
        bundle.close()
    return CheckReport(bundle=str(directory), version=bundle.manifest.version, student=str(student.directory),
                       **judged.model_dump())


def _share(value: float | None) -> str:
    return "   -" if value is None else f"{value:.3f}"


def describe(report: CheckReport) -> list[str]:
    """The report as lines for a terminal."""
    lines = [f"{report.bundle} (version {report.version or '-'}), student {report.student}",
             f"{'segment':<32} {'queries':>7} {'overlap@10':>10} {'student hit@10':>14} {'teacher hit@10':>14}  note"]
    for s in [*report.segments, report.overall]:
        note = "unknown: no sample" if not s.known else ("home" if s.home else "") + (" BELOW" if s.below else "")
        lines.append(f"{s.segment:<32} {s.queries:>7} {_share(s.overlap):>10} {_share(s.student_hit):>14} "
                     f"{_share(s.teacher_hit):>14}  {note.strip()}")
    if report.home.overlap is None:
        lines.append("no home segment scored (the version the student was distilled against is not in this one, or "
                     "has no sample): no segment is judged")
    else:
        lines.append(f"threshold: overlap under {report.threshold:.2f} × the home segments' {report.home.overlap:.3f} "
                     f"= {report.threshold * report.home.overlap:.3f}")
    if report.below:
        lines.append(f"warning: {len(report.below)} segment(s) below the threshold: {', '.join(report.below)}; the "
                     "student ranks their documents unlike the teacher (distill it on them)")
    return lines
