"""`tandem index update`: a new version from a base version plus upserts and deletes, in one new segment.

The new version hard-links every file of its base and adds one segment holding the added and replaced
documents (only those go through the teacher) with tombstones for the rows they replace and the deleted ones
(indexer.segments). Its time, memory and new disk space follow the number of changes, not the corpus: nothing
of the base is read but the rows the changes name, by id, in each segment's docstore.

A bundle built before segments is rewritten whole by its first update (indexer.rewrite): its lexical index
cannot take another segment. Every later update is a segment; `tandem index compact` merges them back into one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

import numpy as np

from indexer.changes import read_changes
from indexer.encode import TeacherRun, encode_into, local_teacher
from indexer.export import StoredRows, stored_key
from indexer.publish import publish
from indexer.request import UpdateRequest, base_dir
from indexer.rewrite import rewrite
from indexer.segments import Vectors, apply_changes, link_version
from indexer.writer import write_version_manifest
from models.bundle.manifest import BaseInfo, BundleManifest, EmbeddingSource, SegmentInfo
from models.bundle.space import Space
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import new_version_name
from models.corpus import Document, corpus_key
from models.embeddings.store import EmbeddingStore, store_key
from models.encoders.registry import ModelCard
from models.manifest_io import utc_now

log = logging.getLogger(__name__)


def takes_segments(manifest: BundleManifest) -> bool:
    """Whether a version can take a new segment: every segment's lexical index is postings. One built before
    segments has bm25s's or, older still, none (dense only); its first update rewrites it, with postings."""
    kinds = {s.lexical.engine if s.lexical is not None else None for s in manifest.parts}
    return kinds == {"postings"}


def update(req: UpdateRequest) -> BundleManifest:
    started = time.perf_counter()
    req.check()
    source_dir = base_dir(req)
    base = read_bundle_manifest(source_dir)
    if not takes_segments(base):
        log.warning("%s was built before segments: this update rewrites it whole, once; later updates add segments",
                    source_dir)
        return rewrite(req, source_dir)
    # Change lines are parsed as the base corpus was: with --metadata-extra, a line's other keys stay metadata; and
    # the version's payload schema is kept, so a value of one of its fields must have the field's type.
    changes = read_changes(req.changes, req.delete_ids, extra_metadata=base.corpus.metadata_extra,
                           fields=base.payload_fields)
    card, store, run = req.teacher_for(base)
    with publish(req.target) as (staging, version):
        link_version(source_dir, base, staging)
        applied = apply_changes(staging, base, changes, name=version or new_version_name(),
                                space=Space.of(source_dir, base),
                                vectors=teacher_vectors(card, store, run))
        manifest = finish(applied.manifest, base, source_dir, version, started, applied.changed)
        write_version_manifest(staging, manifest)
    c = applied.counts
    log.info("update of %s: %d added, %d replaced, %d deleted, %d unchanged; encoded %d; published %s in %.1fs",
             source_dir, c["added"], c["replaced"], c["deleted"], c["unchanged"], applied.encoded,
             req.target.describe(version), time.perf_counter() - started)
    return manifest


def finish(manifest: BundleManifest, base: BundleManifest, source_dir: Path, version: str | None, started: float,
           changed: dict[str, int], action: Literal["update", "follow"] = "update", **more: object) -> BundleManifest:
    """The new version's manifest: what it started from, which `action` made it and what changed (`changed`:
    Applied.changed), with `more` of its fields (a follower's state)."""
    info = BaseInfo(action=action, version=base.version or source_dir.name, build_time=base.build_time,
                    count=base.count, **changed)
    return manifest.model_copy(update={
        "version": version, "base": info, "build_time": utc_now(),
        "build_seconds": round(time.perf_counter() - started, 3), **more})


def teacher_vectors(card: ModelCard, store: EmbeddingStore, run: TeacherRun) -> Vectors:
    """How a new segment gets its vectors: the teacher encodes the fresh texts; a document whose text did not
    change keeps its vector from its segment's embedding-store entry (else the teacher encodes it again).
    The segment's vectors are kept in the store under its own key, for `tandem index compact`."""

    def vectors(fresh: list[Document], reused: list[Document],
                rows: list[tuple[SegmentInfo, int]]) -> tuple[np.ndarray, EmbeddingSource, int]:
        kept = _stored(store, rows, card.dim) if rows else None
        encode = fresh if kept is not None else fresh + reused  # not in the store: encoded again
        x = np.zeros((0, card.dim), dtype=np.float32)
        if encode:
            key = store_key(card.fingerprint, card.max_seq_length, corpus_key(encode))
            texts = [d.passage() for d in encode]
            if not store.complete(key):  # a change applied before (a follower's retry) is not encoded again
                encode_into(store, key, len(texts), local_teacher(texts, card, run, "fp32"), card, run, "fp32")
            x = np.concatenate(list(store.iter_chunks(key)))
        if kept is not None:
            x = np.concatenate([x, kept])
        key = store_key(card.fingerprint, card.max_seq_length, corpus_key(fresh + reused))
        if not store.complete(key):
            store.put_stream(key, [x], {"source": "updated", "teacher": card.fingerprint,
                                        "max_seq_length": card.max_seq_length, "precision": "fp32"})
        return x, EmbeddingSource(kind="encoded", store_key=key, precision="fp32", device=run.device or "cpu",
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
