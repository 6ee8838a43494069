"""Bundles built before segments: every branch that reads them, and the one test of whether a writer converts them.

What it converts. A bundle written before segments existed (issue 37) differs from today's in four ways:

- its manifest lists no `segments`: its own top level is its one segment (`BundleManifest.parts` stands one in,
  in models.bundle.manifest, where the field lives);
- its payload index, when it has one, is recorded as the manifest's `payload`, not its first segment's
  (`segment_payload`); older still, it has none, and a filter is evaluated by its docstore's SQL
  (`has_payload_index`);
- its lexical index is bm25s's, scores precomputed with that bundle's own statistics (`lexical.engine: bm25s`),
  served as the version's whole lexical index (`open_lexical`, `whole_bm25s`); older still, it has none (dense
  search only);
- so it cannot take a segment (`takes_segments` is False): its first `tandem index update` rewrites it whole
  (indexer.versions.rewrite, which asks `takes_segments`), and `tandem index follow` compacts it once before its first
  change file.

When it can go: once no root serves a version built before segments, i.e. every such root was updated, followed,
compacted or rebuilt once since (each writes a version with `segments` and postings). Then this module,
`models.bundle.lexical.postings.Bm25sIndex`, indexer/versions/rewrite.py and the bm25s dependency go together, and
`BundleManifest.segments` becomes required.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeGuard

from models.bundle.lexical.postings import LEXICAL_DIR, Bm25sIndex, PostingsIndex
from models.bundle.manifest import BundleManifest, SegmentInfo
from models.bundle.payload.fields import PayloadInfo
from models.bundle.payload.index import PayloadIndex


def takes_segments(manifest: BundleManifest) -> bool:
    """Whether a version can take a new segment: every segment's lexical index is postings. One built before
    segments has bm25s's or, older still, none (dense only): a writer rewrites it whole first."""
    kinds = {s.lexical.engine if s.lexical is not None else None for s in manifest.parts}
    return kinds == {"postings"}


def segment_payload(manifest: BundleManifest, segment: SegmentInfo) -> PayloadInfo | None:
    """The payload index a segment holds: its own, or for a version's first segment the manifest's (bundles made
    before segments held one payload index, the bundle's)."""
    if segment.payload is not None or segment.path != ".":
        return segment.payload
    return manifest.payload


def has_payload_index(payload: PayloadIndex | None) -> TypeGuard[PayloadIndex]:
    """Whether a segment's filters run on its payload index; without one (built before payload indexes) they run
    as SQL over its docstore."""
    return payload is not None


def open_lexical(directory: Path, info: SegmentInfo) -> PostingsIndex | Bm25sIndex | None:
    """A segment's lexical index: postings, or bm25s's in a bundle built before segments, or none."""
    if info.lexical is None or not (directory / LEXICAL_DIR).is_dir():
        return None
    if info.lexical.engine == "postings":
        return PostingsIndex(directory, info.lexical)
    return Bm25sIndex(directory, info.lexical)


def whole_bm25s(indexes: Sequence[PostingsIndex | Bm25sIndex | None]) -> Bm25sIndex | None:
    """The version's lexical index when it is one segment built before segments, served by bm25s as before."""
    if len(indexes) == 1 and isinstance(indexes[0], Bm25sIndex):
        return indexes[0]
    return None
