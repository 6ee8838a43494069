"""`tandem index follow`: a root kept in step with a directory of change files, a segment per file.

Change files (`tandem index update --changes` lines) are applied in name order, so name them to sort in the
order they were written (a timestamp prefix). Every `interval` the files that arrived are applied, each as one
segment, to the root's CURRENT version, and published as one new version; what was applied is recorded in that
version's manifest (`follow`: the last file's name), so the record and the version are published in the same
atomic step. A follower killed at any point and started again applies every file exactly once: a file is either
in the version CURRENT names, or not yet applied.

When the segments pass `max_segments`, or the deleted rows pass `max_deleted` of all rows, the follower
compacts (indexer.compact) and publishes the compacted version. With `compact=False` it never does: the
segments and tombstones accumulate until an operator runs `tandem index compact`. The trade-off is in
docs/decisions.md#when-to-compact.

A bad change file stops the follower with an error naming its file and line (exit 2), before anything of it
is published; move or fix the file and start the follower again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from indexer.changes import read_changes
from indexer.compact import compact
from indexer.publish import publish
from indexer.request import VersionRequest
from indexer.segments import apply_changes, link_version
from indexer.update import finish, takes_segments, teacher_vectors
from indexer.writer import write_version_manifest
from models.bundle.manifest import BundleManifest, FollowState
from models.bundle.space import Space
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import is_bundle_root, read_current
from models.embeddings.store import SHARD_SIZE
from models.errors import InputError

log = logging.getLogger(__name__)

CHANGE_SUFFIX = ".jsonl"


@dataclass(frozen=True)
class FollowRequest:
    root: Path
    changes_dir: Path
    interval_s: float = 10.0
    max_segments: int = 8
    max_deleted: float = 0.2
    compact: bool = True
    once: bool = False
    keep: int | None = None
    teacher: Path | None = None
    batch_size: int = 32
    device: str | None = None
    store: Path | None = None
    shard_size: int = SHARD_SIZE

    @property
    def version_request(self) -> VersionRequest:
        """What each version the follower publishes is asked (a step's, a compaction's): the root's CURRENT, with
        the follower's keep, teacher and store."""
        return VersionRequest(root=self.root, keep=self.keep, teacher=self.teacher, batch_size=self.batch_size,
                              device=self.device, store=self.store, shard_size=self.shard_size)

    def check(self) -> None:
        if not is_bundle_root(self.root):
            raise InputError(f"{self.root} has no CURRENT version to follow; publish one with "
                             "`tandem index build --root`")
        if not Path(self.changes_dir).is_dir():
            raise InputError(f"--changes-dir {self.changes_dir}: not a directory")
        if self.interval_s < 0 or self.max_segments < 1 or not 0 < self.max_deleted <= 1:
            raise InputError("--interval must be ≥ 0, --compact-segments ≥ 1 and --compact-deleted in (0, 1]")


def follow(req: FollowRequest) -> int:
    """Apply change files as they arrive, until stopped (or, with `once`, until none is pending); returns how
    many files this run applied."""
    req.check()
    applied = 0
    while True:
        began = time.monotonic()
        applied += step(req)
        if req.once:
            return applied
        time.sleep(max(0.0, req.interval_s - (time.monotonic() - began)))


def pending(changes_dir: Path, state: FollowState | None) -> list[Path]:
    """The change files not yet applied, in name order."""
    last = state.last if state is not None else None
    files = sorted(p for p in Path(changes_dir).iterdir() if p.is_file() and p.name.endswith(CHANGE_SUFFIX)
                   and not p.name.startswith("."))
    return [p for p in files if last is None or p.name > last]


def step(req: FollowRequest) -> int:
    """Publish CURRENT plus every pending file (one segment each) as one version, then compact if due;
    returns the files applied."""
    current = read_current(req.root)
    base = read_bundle_manifest(current)
    files = pending(req.changes_dir, base.follow)
    if files and not takes_segments(base):
        # Built before segments: rewritten whole once, as `index update` does (a compaction, which keeps the
        # follower's state), so that its segments all have postings.
        log.info("%s was built before segments: compacting it once before its first change", current)
        compact(req.version_request)
        current = read_current(req.root)
        base = read_bundle_manifest(current)
    if files:
        base = _publish(req, current, base, files)
    if req.compact and due(base, req):
        log.info("compacting %s: %d segments, %d of %d rows deleted", req.root, len(base.parts),
                 base.deleted, sum(s.count for s in base.parts))
        compact(req.version_request)
    return len(files)


def due(manifest: BundleManifest, req: FollowRequest) -> bool:
    """Whether the version has more segments, or a larger share of deleted rows, than the follower allows."""
    rows = sum(s.count for s in manifest.parts)
    return len(manifest.parts) > req.max_segments or manifest.deleted > req.max_deleted * rows


def _publish(req: FollowRequest, current: Path, base: BundleManifest, files: list[Path]) -> BundleManifest:
    started = time.perf_counter()
    vectors = teacher_vectors(*req.version_request.teacher_for(base))
    space = Space.of(current, base)
    totals = {"added": 0, "replaced": 0, "deleted": 0, "encoded": 0}
    with publish(req.version_request.target) as (staging, version):
        assert version is not None
        link_version(current, base, staging)
        manifest = base
        for i, path in enumerate(files):
            changes = read_changes(path, None, extra_metadata=base.corpus.metadata_extra,
                                   fields=manifest.payload_fields)
            applied = apply_changes(staging, manifest, changes, name=f"{version}-{i:03d}", space=space,
                                    vectors=vectors)
            manifest = applied.manifest
            if applied.segment is not None:  # the file's segment records it
                parts = [*manifest.parts[:-1], applied.segment.model_copy(update={"changes": [path.name]})]
                manifest = manifest.model_copy(update={"segments": parts})
            for key, n in applied.changed.items():
                totals[key] += n
        done = (base.follow.files if base.follow is not None else 0) + len(files)
        manifest = finish(manifest, base, current, version, started, totals, action="follow",
                          follow=FollowState(last=files[-1].name, files=done))
        write_version_manifest(staging, manifest)
    log.info("applied %d change files (%s … %s) to %s: +%d added, %d replaced, -%d deleted; published %s",
             len(files), files[0].name, files[-1].name, base.version or current.name, totals["added"],
             totals["replaced"], totals["deleted"], version)
    return manifest
