"""`tandem index follow`: a root kept in step with a directory of change files, a segment per file.

Change files (`tandem index update --changes` lines) are applied in name order, so name them to sort in the
order they were written (a timestamp prefix), and write each under a name starting with a dot (never read), then
rename it into place: a file is read only once whole. Every `interval` the files that arrived are applied, each as
one segment, to the root's CURRENT version and published as one new version; what was applied is recorded in that
version's manifest (`follow`: the last file's name), so the record and the version are published in the same
atomic step. A follower killed at any point and started again applies every file exactly once: a file is either
in the version CURRENT names, or not yet applied. A file that appears sorting at or before the last applied name
is never applied: the follower says so loudly (a warning naming it, and `FollowReport.late`).

A backlog is applied in batches, one version each, published one after another without waiting for the interval:
at most `max_files` files (`--batch-files`, 16), and while the follower compacts, no more than the segments its
base has room for under `max_segments`. When the segments would pass `max_segments`, the follower compacts
(indexer.versions.compact) before publishing the batch, and after it when the segments or the deleted rows
(`max_deleted` of all rows) pass their bounds; so a version it publishes has at most max(`max_segments`, 2) segments. It
compacts by the default merge policy (`merge_policy`: the large clean segments kept, the rest merged), with a
segment's deleted share bounded by `max_deleted` and a full merge when the kept segments leave no room. With
`compact=False` it never compacts: each version adds at most `max_files` segments and they accumulate until an
operator runs `tandem index compact`. The trade-off is in docs/decisions.md#when-to-compact.

With `after_publish` (`--refresh-student`, tandem/student_refresh.py), each step that published a version ends by
handing CURRENT to it, outside the root's lock; the follower applies no file meanwhile (files that arrive wait
and are applied as a backlog after it).

A bad change file stops the follower with an error naming its file and line (exit 2), before anything of it
is published; move or fix the file and start the follower again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from indexer.publish import publish
from indexer.rootlock import LockTimeout, root_lock
from indexer.sample import add_samples
from indexer.versions.changes import read_changes
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.next_version import finish, teacher_vectors, with_changes, with_segments
from indexer.versions.request import VersionRequest
from indexer.versions.segments import Batch, link_version
from indexer.writer import write_version_manifest
from models.bundle.legacy import takes_segments
from models.bundle.manifest import BundleManifest, FollowState
from models.bundle.vectors.space import Space
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import is_bundle_root, read_current
from models.embeddings.store import SHARD_SIZE
from models.errors import InputError

log = logging.getLogger(__name__)

CHANGE_SUFFIX = ".jsonl"
BATCH_FILES = 16  # change files per version at most (--batch-files): a segment each, so a bound on segments


@dataclass(frozen=True)
class FollowRequest:
    root: Path
    changes_dir: Path
    interval_s: float = 10.0
    max_segments: int = 8
    max_deleted: float = 0.2
    compact: bool = True
    max_files: int = BATCH_FILES
    once: bool = False
    keep: int | None = None
    teacher: Path | None = None
    batch_size: int = 32
    device: str | None = None
    store: Path | None = None
    shard_size: int = SHARD_SIZE
    precision: str | None = None  # the teacher's for the files' texts (indexer.versions.request.version_precision)
    after_publish: Callable[[Path], object] | None = None  # called with CURRENT after each step that published

    @property
    def version_request(self) -> VersionRequest:
        """What each version the follower publishes is asked (a step's, a compaction's): the root's CURRENT, with
        the follower's keep, teacher and store."""
        return VersionRequest(root=self.root, keep=self.keep, teacher=self.teacher, batch_size=self.batch_size,
                              device=self.device, store=self.store, shard_size=self.shard_size,
                              precision=self.precision)

    def check(self) -> None:
        if not is_bundle_root(self.root):
            raise InputError(f"{self.root} has no CURRENT version to follow; publish one with "
                             "`tandem index build --root`")
        if not Path(self.changes_dir).is_dir():
            raise InputError(f"--changes-dir {self.changes_dir}: not a directory")
        if self.interval_s < 0 or self.max_segments < 1 or not 0 < self.max_deleted <= 1 or self.max_files < 1:
            raise InputError("--interval must be ≥ 0, --compact-segments ≥ 1, --compact-deleted in (0, 1] and "
                             "--batch-files ≥ 1")


@dataclass
class FollowReport:
    """What a follower run did: change files applied, versions published (batches and compactions), and the files
    it saw arrive sorting at or before the last applied one, which it never applies."""

    applied: int = 0
    versions: int = 0
    late: list[str] = field(default_factory=list)


def follow(req: FollowRequest) -> FollowReport:
    """Apply change files as they arrive, until stopped (or, with `once`, until none is pending). A backlog is
    applied in batches (`next_batch`), one version each, the next batch at once rather than after the interval."""
    req.check()
    report = FollowReport()
    directory = ChangeDir(Path(req.changes_dir))
    while True:
        began = time.monotonic()
        more = False
        published = report.versions
        try:
            more = step(req, directory, report)
        except LockTimeout as exc:
            if req.once:
                raise
            log.warning("%s; trying again in %g s", exc, req.interval_s)  # another writer's long step
        if req.after_publish is not None and report.versions > published:
            req.after_publish(read_current(req.root))  # outside the root lock: an operator's update need not wait
        if more:
            continue
        if req.once:
            return report
        time.sleep(max(0.0, req.interval_s - (time.monotonic() - began)))


@dataclass
class ChangeDir:
    """A directory of change files, and the names this follower has seen sort at or before the last applied one."""

    path: Path
    seen: set[str] | None = None  # None until the first scan

    def pending(self, state: FollowState | None) -> tuple[list[Path], list[str]]:
        """The change files not yet applied, in name order; and the files that arrived since the last scan sorting
        at or before the last applied name (never applied: a producer that renamed them in late), logged."""
        files = sorted(p for p in self.path.iterdir() if p.is_file() and p.name.endswith(CHANGE_SUFFIX)
                       and not p.name.startswith("."))
        if state is None:
            self.seen = set()
            return files, []
        behind = {p.name for p in files if p.name <= state.last}
        late = sorted(behind - self.seen) if self.seen is not None else []
        if self.seen is None and len(behind) > state.files:
            log.warning("%s holds %d change files sorting at or before %s, the last applied, but the root applied "
                        "%d: a file that arrived after a later name was applied is never applied. Name change files "
                        "to sort as they are written, and write each under a dot-name, then rename it "
                        "(docs/operations.md#a-continuous-feed)", self.path, len(behind), state.last, state.files)
        for name in late:
            log.warning("%s sorts at or before %s, the last change file applied: it is NEVER applied. Write change "
                        "files under a dot-name and rename them into place in name order "
                        "(docs/operations.md#a-continuous-feed)", self.path / name, state.last)
        self.seen = behind
        return [p for p in files if p.name > state.last], late

    def applied(self, files: list[Path]) -> None:
        """Files this follower applied: at or before the last applied name from now on, and not late."""
        if self.seen is not None:
            self.seen.update(p.name for p in files)


def step(req: FollowRequest, directory: ChangeDir, report: FollowReport) -> bool:
    """Publish CURRENT plus the next batch of pending files (one segment each) as one version, compacting before it
    when the version has no room for the batch and after it when due; returns whether files are still pending.
    Under the root's writer lock (indexer.rootlock) from reading CURRENT to the last publish: an operator's update
    meanwhile waits for it, then starts from what it published."""
    with root_lock(req.root):
        current = read_current(req.root)
        base = read_bundle_manifest(current)
        files, late = directory.pending(base.follow)
        report.late += late
        if files and not takes_segments(base):
            # Built before segments: rewritten whole once, as `index update` does (a compaction, which keeps the
            # follower's state), so that its segments all have postings.
            log.info("%s was built before segments: compacting it once before its first change", current)
            current, base = _compact(req, report)
        elif files and req.compact and (due(base, req) or len(base.parts) >= req.max_segments):
            current, base = _compact(req, report)  # before publishing: the batch's segments would pass the bound
        batch = files[:next_batch(base, req)]
        if batch:
            base = _publish(req, current, base, batch)
            directory.applied(batch)
            report.applied += len(batch)
            report.versions += 1
        if req.compact and due(base, req):
            _compact(req, report)
        return len(files) > len(batch)


def next_batch(base: BundleManifest, req: FollowRequest) -> int:
    """How many pending files the next version takes: at most `max_files`, and when the follower compacts, no
    more than the segments `base` has room for under `max_segments` (at least one)."""
    if not req.compact:
        return req.max_files
    return max(1, min(req.max_files, req.max_segments - len(base.parts)))


def _compact(req: FollowRequest, report: FollowReport) -> tuple[Path, BundleManifest]:
    """Compact CURRENT (under the follower's lock); the version published."""
    base = read_bundle_manifest(read_current(req.root))
    log.info("compacting %s: %d segments, %d of %d rows deleted", req.root, len(base.parts), base.deleted,
             sum(s.count for s in base.parts))
    if compact(req.version_request, merge_policy(req)) is not None:
        report.versions += 1
    current = read_current(req.root)
    return current, read_bundle_manifest(current)


def merge_policy(req: FollowRequest) -> MergePolicy:
    """How the follower compacts: the default merge policy, a segment rewritten once its deleted share reaches the
    follower's bound (so that a compaction due to deletions drops them), and every segment merged when the kept ones
    would leave no room for the next batch's segment under `max_segments`."""
    return MergePolicy(deleted_share=req.max_deleted, max_segments=max(1, req.max_segments - 1))


def due(manifest: BundleManifest, req: FollowRequest) -> bool:
    """Whether the version has more segments, or a larger share of deleted rows, than the follower allows."""
    rows = sum(s.count for s in manifest.parts)
    return len(manifest.parts) > req.max_segments or manifest.deleted > req.max_deleted * rows


def _publish(req: FollowRequest, current: Path, base: BundleManifest, files: list[Path]) -> BundleManifest:
    started = time.perf_counter()
    card, store, run = req.version_request.teacher_for(base)
    vectors = teacher_vectors(card, store, run, keep=True)  # loaded once for the follower's steps
    added: list[str] = []
    space = Space.of(current, base)
    totals = {"added": 0, "replaced": 0, "deleted": 0, "encoded": 0}
    with publish(req.version_request.target, what="follow step") as (staging, version):
        assert version is not None
        link_version(current, base, staging)
        manifest = base
        with Batch(staging, base) as batch:  # each segment opened once for the batch's files
            for i, path in enumerate(files):
                changes = read_changes(path, None, extra_metadata=base.corpus.metadata_extra,
                                       fields=manifest.payload_fields)
                applied = batch.apply(manifest, changes, name=f"{version}-{i:03d}", space=space, vectors=vectors)
                manifest = applied.manifest
                if applied.segment is not None:  # the file's segment records it
                    added.append(applied.segment.name)
                    manifest = with_segments(manifest, [*manifest.parts[:-1],
                                                        with_changes(applied.segment, [path.name])])
                for key, n in applied.changed.items():
                    totals[key] += n
        done = (base.follow.files if base.follow is not None else 0) + len(files)
        manifest = finish(manifest, base, current, version, started, totals, action="follow",
                          follow=FollowState(last=files[-1].name, files=done))
        manifest = add_samples(staging, manifest, added, card, run.device, keep_teacher=True,
                               precision=run.precision or "fp32", batch_tokens=run.batch_tokens)
        write_version_manifest(staging, manifest)
    log.info("applied %d change files (%s … %s) to %s: +%d added, %d replaced, -%d deleted; published %s",
             len(files), files[0].name, files[-1].name, base.version or current.name, totals["added"],
             totals["replaced"], totals["deleted"], version)
    return manifest
