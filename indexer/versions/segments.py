"""Changes applied as segments: what `tandem index update` and `tandem index follow` share.

A new version starts as hard links to every file of the version it changes (`link_version`: never a copy, so
it costs what the changes cost, not what the corpus holds). `apply_changes` then adds one segment with the added
and replaced documents, and rewrites the tombstones of the segments whose rows were replaced or deleted. Files
of the base are never opened for writing: a rewritten tombstones file replaces its link by rename, so the base
version keeps its own (docs/decisions.md#segments-and-tombstones).
"""

from __future__ import annotations

import errno
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.versions.changes import Changes
from indexer.versions.next_version import Vectors, with_fields, with_segments, with_tombstones
from indexer.writer import write_index
from models.atomic import atomic_write
from models.bundle.lexical.postings import build_lexical
from models.bundle.manifest import SEGMENTS_DIRECTORY, BundleManifest, EmbeddingSource, SegmentInfo
from models.bundle.payload.writer import write_payload
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore, write_docstore
from models.bundle.vectors.index_spec import IndexSpec, IndexType, resolve_spec
from models.bundle.vectors.space import Space, VectorSource
from models.bundle.version import check_own_directories, in_segment, tombstone_masks, tombstones_name
from models.corpus import Document
from models.errors import InputError
from models.hashing import sha256_file
from models.manifest_io import utc_now

log = logging.getLogger(__name__)

FLAT_SEGMENT_ROWS = 100_000  # a new segment up to this size is searched exactly, whatever the version's index type


def link_version(source: Path, manifest: BundleManifest, staging: Path) -> None:
    """Hard-link every file `manifest` lists from `source` into `staging`."""
    check_own_directories(source, manifest)  # never a link through a directory that leads out of the version
    for name in manifest.files:
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / name, target)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise InputError(f"cannot hard-link {source / name} into {staging.parent} ({exc.strerror}): a new "
                                 "version shares its base's segments by hard links, never by copy, so it must be "
                                 "published on the base's file system (under its --root, or an --out beside it)"
                                 ) from None
            raise


def segment_spec(manifest: BundleManifest, count: int) -> IndexSpec:
    """A new segment's index: exact up to FLAT_SEGMENT_ROWS rows, else the version's type with its parameters."""
    spec = manifest.index
    if count <= FLAT_SEGMENT_ROWS or spec.type is IndexType.FLAT:
        return IndexSpec()
    if spec.type is IndexType.HNSW:
        return spec
    return resolve_spec(spec.type.value, manifest.quantization, count)


@dataclass
class Applied:
    manifest: BundleManifest
    counts: dict[str, int] = field(default_factory=dict)  # added, replaced, deleted, unchanged
    encoded: int = 0
    segment: SegmentInfo | None = None  # the segment added (none when no document was added or replaced)

    @property
    def changed(self) -> dict[str, int]:
        """What the new version's manifest records of the change (models.bundle.manifest.BaseInfo)."""
        c = self.counts
        return {"added": c["added"], "replaced": c["replaced"], "deleted": c["deleted"], "encoded": self.encoded}


OPENED: Counter[str] = Counter()  # segment docstores opened to apply changes, by segment name (tests read it)


def apply_changes(staging: Path, manifest: BundleManifest, changes: Changes, *, name: str, space: Space,
                  vectors: Vectors) -> Applied:
    """Apply `changes` to the version in `staging` (described by `manifest`, whose files it holds): one new
    segment `name` for the added and replaced documents, tombstones for the rows they replace and the deleted
    ones. Returns the new manifest (not yet written) and what changed. One change set: a batch of them is
    `Batch.apply`, which opens the version once."""
    with Batch(staging, manifest) as batch:
        return batch.apply(manifest, changes, name=name, space=space, vectors=vectors)


class Batch:
    """The version being made in `staging`, open while a batch of change sets is applied to it one after another
    (a follower's batch: a segment each). Each segment's docstore is opened and its tombstones read once, when the
    batch opens or when the batch writes the segment, and kept: K change files over S segments open each segment
    once, not K times; a batch holds one docstore open per segment of the version it makes."""

    def __init__(self, staging: Path, manifest: BundleManifest) -> None:
        self.staging = staging
        self.names: list[str] = []
        self.stores: list[DocStore] = []
        self.masks = tombstone_masks(staging, manifest)
        try:
            for segment in manifest.parts:
                self._hold(segment, DocStore(staging / in_segment(segment, DOCSTORE_FILE)))
        except BaseException:
            self.close()
            raise

    def _hold(self, segment: SegmentInfo, store: DocStore) -> None:
        OPENED[segment.name] += 1
        self.names.append(segment.name)
        self.stores.append(store)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.stores = []

    def apply(self, manifest: BundleManifest, changes: Changes, *, name: str, space: Space,
              vectors: Vectors) -> Applied:
        """`apply_changes` on the open version: `manifest` describes it as the batch's last change left it (the
        segments the batch holds, in order). On an error nothing the batch holds changes."""
        if [s.name for s in manifest.parts] != self.names:
            raise ValueError(f"the manifest's segments {[s.name for s in manifest.parts]} are not the batch's "
                             f"{self.names}")
        stores, masks = self.stores, [m.copy() for m in self.masks]
        located = _locate(stores, masks, [d.id for d in changes.upserts] + list(changes.deletes))
        counts = {"added": 0, "replaced": 0, "deleted": 0, "unchanged": 0}
        for doc_id, where in changes.deletes.items():
            if doc_id not in located:
                raise InputError(f"{where}: cannot delete {doc_id!r}: no such document in the base version")
            seg, row = located[doc_id]
            masks[seg][row] = True
            counts["deleted"] += 1
        fresh: list[Document] = []
        reused: list[Document] = []
        reuse_rows: list[tuple[SegmentInfo, int]] = []
        for doc in changes.upserts:
            if doc.id not in located:
                fresh.append(doc)
                counts["added"] += 1
                continue
            seg, row = located[doc.id]
            (old,) = stores[seg].get([row])
            if old == doc:
                counts["unchanged"] += 1
                continue
            masks[seg][row] = True
            counts["replaced"] += 1
            if old.passage() == doc.passage():  # only the metadata changed: the vector stays
                reused.append(doc)
                reuse_rows.append((manifest.parts[seg], row))
            else:
                fresh.append(doc)
        new = fresh + reused
        live = sum(int((~m).sum()) for m in masks) + len(new)
        if not live:
            raise InputError("the update would delete every document; build a new bundle instead")
        parts = list(manifest.parts)
        files = dict(manifest.files)
        for i, (segment, mask) in enumerate(zip(manifest.parts, masks, strict=True)):
            deleted = int(mask.sum())
            if deleted != segment.deleted:
                parts[i] = _tombstone(self.staging, segment, mask, files)
        metadata_fields = set(manifest.metadata_fields)
        payload = manifest.payload
        encoded = 0
        info: SegmentInfo | None = None
        if new:
            x, source, encoded = vectors(fresh, reused, reuse_rows)
            info, names, store = write_segment(self.staging / SEGMENTS_DIRECTORY / name, new, x, manifest, space,
                                               name, source)
            self._hold(info, store)  # the batch's next change sets look documents up in it too
            masks.append(np.zeros(info.count, dtype=bool))
            parts.append(info)
            files.update({f"{info.path}/{n}": sha256_file(self.staging / info.path / n) for n in names})
            metadata_fields.update(k for d in new for k in d.meta())
            payload = with_fields(manifest.payload, info.payload)
        self.masks = masks
        updated = with_segments(manifest, parts, count=live, files=files, payload=payload,
                                metadata_fields=sorted(metadata_fields))
        return Applied(updated, counts, encoded, info)


def _locate(stores: list[DocStore], masks: list[np.ndarray], ids: list[str]) -> dict[str, tuple[int, int]]:
    """(segment, row) of each id's live document; ids with none are absent."""
    found: dict[str, tuple[int, int]] = {}
    for i, (store, mask) in enumerate(zip(stores, masks, strict=True)):
        for doc_id, row in store.rows_of(ids).items():
            if not mask[row]:
                found[doc_id] = (i, row)
    return found


def _tombstone(staging: Path, segment: SegmentInfo, mask: np.ndarray, files: dict[str, str]) -> SegmentInfo:
    """Write the segment's tombstones as of the new version (replacing, by rename, the link to the base's)."""
    name = tombstones_name(segment)
    path = staging / name
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = np.flatnonzero(mask).astype(np.int64)
    atomic_write(path, lambda fh: np.save(fh, rows))
    if segment.tombstones is not None and segment.tombstones != name:
        files.pop(segment.tombstones, None)
    files[name] = sha256_file(path)
    return with_tombstones(segment, len(rows), name)


def write_segment(directory: Path, docs: list[Document], vectors: np.ndarray, manifest: BundleManifest,
                  space: Space, name: str, source: EmbeddingSource) -> tuple[SegmentInfo, list[str], DocStore]:
    """A segment's files in `directory`, scored in the version's `space`; its info, the file names and its docstore,
    open (the caller closes it)."""
    directory.mkdir(parents=True)
    write_docstore(directory / DOCSTORE_FILE, docs)
    return segment_indexes(directory, len(docs), lambda: [vectors], manifest, space, name, source)


def segment_indexes(directory: Path, count: int, vectors: VectorSource, manifest: BundleManifest, space: Space,
                    name: str, source: EmbeddingSource, spec: IndexSpec | None = None
                    ) -> tuple[SegmentInfo, list[str], DocStore]:
    """The rest of a segment whose docstore (`count` rows) is written in `directory`: its first stage over the
    streamed `vectors` in the version's `space` (`spec`, else `segment_spec`'s), its lexical and payload indexes;
    as `write_segment` returns. A compaction's merged segment is written by this too, its vectors streamed from the
    embedding store; a build's later segments (indexer.split) too, with the build's index type."""
    spec = spec or segment_spec(manifest, count)
    names = write_index(directory, count, vectors, dim=manifest.dim, quantization=manifest.quantization,
                        index=spec, space=space)
    names.append(DOCSTORE_FILE)
    lexical = payload = None
    store = DocStore(directory / DOCSTORE_FILE)
    try:
        if manifest.lexical is not None:
            lexical, lexical_names = build_lexical(directory, store, count, manifest.lexical)
            names += lexical_names
        if manifest.payload is not None:  # the version's fields keep their types; new keys are inferred
            payload, payload_names = write_payload(directory, store, count, manifest.payload.fields,
                                                   manifest.payload.unindexed)
            names += payload_names
    except BaseException:
        store.close()
        raise
    log.info("segment %s: %d documents", name, count)
    return SegmentInfo(name=name, path=f"{SEGMENTS_DIRECTORY}/{name}", count=count, index=spec, lexical=lexical,
                       payload=payload, embeddings=source, build_time=utc_now()), names, store
