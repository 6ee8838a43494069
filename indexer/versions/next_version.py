"""The next version: its manifest, made from its base's, and the steps `index update`, `follow` and `compact` share.

A writer that changes a published version (an update's segment, a follower's batch, a compaction) describes the
version it publishes in the base's terms: which version it started from and what changed (`base_info`), when it was
built, its segments and their deletions (`with_segments`, `with_tombstones`), the payload fields a new segment
brought (`with_fields`), and a follower's state (`finish`). Each of those is written here once, so the three
commands import this module and never each other's internals. The teacher vectors of a new segment
(`teacher_vectors`) are shared too: an unchanged text keeps its stored vector, a fresh one is encoded once.

Whether a base can take a segment at all is models.bundle.legacy.takes_segments (bundles built before segments
are rewritten whole first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

from indexer.encoding.encode import TeacherRun, encode_into, local_teacher
from indexer.versions.live import StoredRows, stored_key
from models.bundle.manifest import BaseInfo, BundleManifest, EmbeddingSource, SegmentInfo
from models.bundle.payload.fields import PayloadInfo
from models.corpus import Document, corpus_key
from models.embeddings.store import EmbeddingStore, store_key
from models.encoders.registry import ModelCard
from models.manifest_io import utc_now

Action = Literal["update", "follow", "compact"]

# vectors(fresh documents, documents whose text did not change, their old (segment, row)s) → the full-dimension
# unit vectors of both, fresh ones first; where they came from; how many texts the teacher encoded
Vectors = Callable[[list[Document], list[Document], list[tuple[SegmentInfo, int]]],
                   tuple[np.ndarray, EmbeddingSource, int]]


def base_info(base: BundleManifest, source_dir: Path, action: Action, **changed: int) -> BaseInfo:
    """What the next version records of the one it was made from (`changed`: added, replaced, deleted, encoded)."""
    return BaseInfo(action=action, version=base.version or source_dir.name, build_time=base.build_time,
                    count=base.count, **changed)


def with_segments(manifest: BundleManifest, segments: list[SegmentInfo], **fields: object) -> BundleManifest:
    """`manifest` whose segments are `segments`, with `fields` (count, files, payload, metadata_fields) replaced."""
    return manifest.model_copy(update={"segments": segments, **fields})


def with_tombstones(segment: SegmentInfo, deleted: int, name: str) -> SegmentInfo:
    """`segment` as of the next version: `deleted` rows, listed in tombstones file `name`."""
    return segment.model_copy(update={"deleted": deleted, "tombstones": name})


def with_changes(segment: SegmentInfo, names: list[str]) -> SegmentInfo:
    """`segment`, recording the change files it holds (a follower's)."""
    return segment.model_copy(update={"changes": names})


def with_fields(version: PayloadInfo | None, segment: PayloadInfo | None) -> PayloadInfo | None:
    """The version's payload schema once a segment joined it: its fields, then any the segment's documents brought
    (a filter on such a field reads an older segment's docstore, which has no column for it)."""
    if version is None or segment is None:
        return version
    known = {f.name for f in version.fields} | set(version.unindexed)
    new = [f for f in segment.fields if f.name not in known]
    unindexed = sorted(set(version.unindexed) | set(segment.unindexed))
    return version.model_copy(update={"fields": [*version.fields, *new], "unindexed": unindexed})


def finish(manifest: BundleManifest, base: BundleManifest, source_dir: Path, version: str | None, started: float,
           changed: dict[str, int], action: Action = "update", **more: object) -> BundleManifest:
    """The next version's manifest: what it started from, which `action` made it and what changed (`changed`:
    indexer.versions.segments.Applied.changed), its build time, with `more` of its fields (a follower's state)."""
    return manifest.model_copy(update={
        "version": version, "base": base_info(base, source_dir, action, **changed), "build_time": utc_now(),
        "build_seconds": round(time.perf_counter() - started, 3), **more})


def stored_precision(segments: list[SegmentInfo]) -> str | None:
    """The precision the teacher encoded the segments' vectors in (a compaction's new entry records it); None when
    every segment's were imported (they have none of ours: a later update's or follower's `--precision auto` then
    picks its own)."""
    sources = [s.embeddings for s in segments]
    kinds = {"fp32" if e is None else e.precision or "fp32" for e in sources if e is None or e.kind != "imported"}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "mixed"


def teacher_vectors(card: ModelCard, store: EmbeddingStore, run: TeacherRun, keep: bool = False) -> Vectors:
    """How a new segment gets its vectors: the teacher encodes the fresh texts; a document whose text did not
    change keeps its vector from its segment's embedding-store entry (else the teacher encodes it again).
    The segment's vectors are kept in the store under its own key, for `tandem index compact`. `keep`: the teacher
    stays loaded for the next step (encode.local_teacher)."""

    def vectors(fresh: list[Document], reused: list[Document],
                rows: list[tuple[SegmentInfo, int]]) -> tuple[np.ndarray, EmbeddingSource, int]:
        kept = _stored(store, rows, card.dim) if rows else None
        encode = fresh if kept is not None else fresh + reused  # not in the store: encoded again
        x = np.zeros((0, card.dim), dtype=np.float32)
        precision = run.precision or "fp32"
        if encode:
            key = store_key(card.fingerprint, card.max_seq_length, corpus_key(encode), precision)
            texts = [d.passage() for d in encode]
            if not store.complete(key):  # a change applied before (a follower's retry) is not encoded again
                encode_into(store, key, len(texts), local_teacher(texts, card, run, precision, keep), card, run,
                            precision)
            x = np.concatenate(list(store.iter_chunks(key)))
        if kept is not None:
            x = np.concatenate([x, kept])
        key = store_key(card.fingerprint, card.max_seq_length, corpus_key(fresh + reused), precision)
        if not store.complete(key):
            store.put_stream(key, [x], {"source": "updated", "teacher": card.fingerprint,
                                        "max_seq_length": card.max_seq_length, "precision": precision})
        return x, EmbeddingSource(kind="encoded", store_key=key, precision=precision, device=run.device or "cpu",
                                  engine="local"), len(encode)

    return vectors


def _stored(store: EmbeddingStore, rows: list[tuple[SegmentInfo, int]], dim: int) -> np.ndarray | None:
    """Full vectors of (segment, row)s from their segments' embedding-store entries; None if one is missing."""
    readers: dict[str, StoredRows] = {}
    for segment, _ in rows:
        if segment.name not in readers:
            key = stored_key(segment, store)
            if key is None:
                return None
            readers[segment.name] = StoredRows(store, key, dim)
    out = np.empty((len(rows), dim), dtype=np.float32)
    names = np.array([segment.name for segment, _ in rows])
    numbers = np.array([row for _, row in rows], dtype=np.int64)
    for name, reader in readers.items():
        pick = names == name
        out[pick] = reader.take(numbers[pick])
    return out
