"""`tandem index follow --refresh-student ROOT`: refresh the served student when its index outgrows it.

After each version the follower publishes, a trigger looks at the segments the student has not been trained on
(those its `trained_on` version lacks, models.distill.refresh.new_segments) and says which to refresh on; if any,
`tandem distill --from` runs on them (models.distill.refresh) into a new directory under the student root, which
is then published by moving the root's CURRENT pointer (models.encoders.student_root), atomically: the service
serving `--student ROOT` loads it at its next reload. The indexer never imports training; this module, in the
CLI's layer, joins the two.

The trigger until per-segment agreement is measured (issue 45, items 1–2): the unseen segments hold at least
`min_documents` live documents. A refresh that fails (a parity miss, a missing model) is logged and not tried
again for the same segments; the student in service stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from models.bundle.version import read_bundle_manifest
from models.bundle.versions import new_version_name
from models.distill.refresh import RefreshRequest, new_segments, run_refresh, segment_documents
from models.encoders.student import read_student_manifest
from models.encoders.student_root import current_student, is_student_root, set_current_student
from models.errors import InputError, TandemError

log = logging.getLogger(__name__)

Trigger = Callable[[Path, Path], list[str]]  # (version, student directory) → the segments to refresh on


def unseen_documents(min_documents: int) -> Trigger:
    """Refresh on every unseen segment once they hold `min_documents` live documents or more."""

    def trigger(version: Path, student: Path) -> list[str]:
        bundle = read_bundle_manifest(version)
        names = new_segments(version, bundle, read_student_manifest(student), None)
        count = len(segment_documents(version, bundle, names)) if names else 0
        log.info("%d live documents in %d segments the student has not seen (refresh at %d)", count, len(names),
                 min_documents)
        return names if count >= min_documents else []

    return trigger


@dataclass
class StudentRefresher:
    """Called by the follower with each version it published; refreshes and publishes the student when triggered."""

    root: Path
    trigger: Trigger
    teacher: Path | None = None
    backbone: Path | None = None
    device: str | None = None
    attempted: set[tuple[str, ...]] = field(default_factory=set)  # segment sets a failed refresh was tried on

    def check(self) -> None:
        if not is_student_root(self.root):
            raise InputError(f"--refresh-student {self.root}: not a student root (a directory of students and a "
                             "CURRENT file naming the one in service; docs/operations.md#refreshing-the-student)")
        if read_student_manifest(current_student(self.root)).trained_on is None:
            raise InputError(f"{current_student(self.root)} records no trained_on (distilled before it was recorded): "
                             "which segments it has not seen cannot be told; refresh it once with `tandem distill "
                             "--from DIR --segment NAME`, or distill it again")

    def __call__(self, version: Path) -> Path | None:
        """The new student's directory, if this version triggered a refresh that succeeded."""
        student = current_student(self.root)
        names = self.trigger(version, student)
        if not names or tuple(names) in self.attempted:
            return None
        name = new_version_name()
        log.info("refreshing %s on segments %s of %s into %s", student, ", ".join(names), version, self.root / name)
        try:
            run_refresh(RefreshRequest(student=student, index=version, out=self.root / name, segments=names,
                                       teacher=self.teacher, backbone=self.backbone, device=self.device))
        except TandemError as exc:
            self.attempted.add(tuple(names))
            log.error("refreshing %s failed, it stays in service: %s", student, exc)
            return None
        set_current_student(self.root, name)
        log.info("published student %s: %s/CURRENT names it", name, self.root)
        return self.root / name
