"""Which segments `tandem index compact` rewrites: a merge policy, as Lucene's and Qdrant's segments keep.

Rewriting every segment of a version costs what the whole corpus costs (at 10M: the root written again beside
the old one and a second copy of every live teacher vector in the embedding store). Most compactions need far
less: the many small segments that updates and a follower add, and the segments whose deleted rows waste their
space. So by default a segment is kept as it is, its files, tombstones and store entry carried into the new
version as an update carries them, when it is

- large: at least `large_share` (0.5) of the rows of the version's biggest segment, and
- clean: at most `deleted_share` (0.2, Qdrant's vacuum `deleted_threshold`) of its rows deleted, the bound the
  follower's `--compact-deleted` puts on a whole version;

every other segment is merged into one new segment, scored in the space the kept ones share. The version's first
segment fixed that space (rotation, int8 calibration, binary center and spin): when it is not kept, the merge is
full and the space is fitted again on the live documents, as `--all` always does (Lucene's forceMerge).
A plan whose merge would rewrite at most one segment with no deleted row has nothing to do.
docs/decisions.md#compaction-by-a-merge-policy says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.bundle.manifest import BundleManifest, SegmentInfo
from models.errors import InputError

LARGE_SHARE = 0.5  # a segment with at least this share of the biggest segment's rows is large
DELETED_SHARE = 0.2  # a segment with more than this share of its rows deleted is rewritten (Qdrant's default)


@dataclass(frozen=True)
class MergePolicy:
    """How `compact` picks segments: `full` merges all of them; else large clean ones are kept. `max_segments`
    (a follower's bound) makes the merge full when the kept segments and the merged one would be more."""

    full: bool = False
    large_share: float = LARGE_SHARE
    deleted_share: float = DELETED_SHARE
    max_segments: int | None = None

    def check(self) -> None:
        if not 0 < self.large_share <= 1:
            raise InputError(f"--large-share must be in (0, 1], got {self.large_share}")
        if not 0 < self.deleted_share <= 1:
            raise InputError(f"--deleted-share must be in (0, 1], got {self.deleted_share}")
        if self.max_segments is not None and self.max_segments < 1:
            raise InputError(f"the segment bound must be at least 1, got {self.max_segments}")

    def plan(self, manifest: BundleManifest) -> MergePlan:
        """The segments of `manifest` this policy keeps and those it merges."""
        parts = manifest.parts
        if self.full:
            return MergePlan(kept=[], merged=list(parts), full=True)
        biggest = max(s.count for s in parts)
        kept = [s for s in parts if self.keeps(s, biggest)]
        names = {s.name for s in kept}
        merged = [s for s in parts if s.name not in names]
        root_kept = bool(kept) and kept[0] is parts[0]
        bounded = self.max_segments is None or len(kept) + 1 <= self.max_segments
        if not root_kept or not bounded:
            return MergePlan(kept=[], merged=list(parts), full=True)
        return MergePlan(kept=kept, merged=merged, full=False)

    def keeps(self, segment: SegmentInfo, biggest: int) -> bool:
        """Whether `segment` is large (against the biggest segment's `biggest` rows) and clean."""
        large = segment.count >= self.large_share * biggest
        return large and segment.deleted <= self.deleted_share * segment.count


@dataclass(frozen=True)
class MergePlan:
    kept: list[SegmentInfo]
    merged: list[SegmentInfo]
    full: bool  # every segment merged and the space fitted again

    @property
    def idle(self) -> bool:
        """Nothing to do: no segment merged, or one with no deleted row merged with none other."""
        return not self.full and (not self.merged or (len(self.merged) == 1 and not self.merged[0].deleted))

    def describe(self) -> str:
        if self.full:
            return f"all {len(self.merged)} segments merged"
        return f"{len(self.kept)} segments kept, {len(self.merged)} merged"
