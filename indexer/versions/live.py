"""A version's live documents and their teacher vectors, read in chunks: what a new version is made from.

`index update`, `compact`, `merge` and the rewrite of an old bundle (indexer.versions) read the rows they keep
through here, and `tandem index export` (indexer.export) writes them out. Vectors come from the embedding-store
entry the manifest names (or, for a 768-d float bundle without rotation, from the index itself), streamed with
the docstore's rows: memory holds one chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from models.bundle.manifest import BundleManifest, SegmentInfo
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore
from models.bundle.vectors.index import float_vectors
from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.rotation import Rotation
from models.bundle.version import in_segment, read_bundle_manifest, tombstone_masks
from models.corpus import Document
from models.embeddings.store import EmbeddingStore
from models.errors import InputError

log = logging.getLogger(__name__)

CHUNK = 4096


def stored_key(segment: SegmentInfo, store: EmbeddingStore) -> str | None:
    """The segment's embedding-store entry, if the store holds it whole."""
    key = segment.embeddings.store_key if segment.embeddings is not None else None
    return key if key and store.complete(key) else None


class StoredRows:
    """Rows of a complete embedding-store entry picked by number (an update's unchanged texts, a rewrite's kept
    rows), gathered from the entry's memory-mapped files (EmbeddingStore.take): memory grows with the rows asked
    for, not with the entry's shard size (an import is one file of all the rows)."""

    def __init__(self, store: EmbeddingStore, key: str, dim: int) -> None:
        self.store, self.key, self.dim = store, key, dim

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The float32 vectors of `rows` (any order), in that order."""
        if not len(rows):
            return np.empty((0, self.dim), dtype=np.float32)
        return self.store.take(self.key, rows)


def _index_holds_vectors(manifest: BundleManifest) -> bool:
    """A full-dimension float index without rotation stores the teacher's vectors as they were."""
    full = manifest.dim == manifest.teacher.dim
    return manifest.quantization is Quantization.FLOAT and full and manifest.rotation is Rotation.NONE


def has_vectors(manifest: BundleManifest, segment: SegmentInfo, store: EmbeddingStore) -> bool:
    """Whether `segment_vectors` can read the segment's vectors (without reading any)."""
    return stored_key(segment, store) is not None or _index_holds_vectors(manifest)


def segment_vectors(directory: Path, manifest: BundleManifest, segment: SegmentInfo,
                    store: EmbeddingStore) -> Iterator[np.ndarray]:
    """Every row's full-dimension teacher vector of one segment, deleted rows included, in row order: from its
    embedding-store entry, else (a first segment of a 768-d float index without rotation) from the index."""
    key = stored_key(segment, store)
    if key is not None:
        yield from store.iter_chunks(key)
        return
    if _index_holds_vectors(manifest):
        yield from float_vectors(directory / segment.path, segment.count, CHUNK)
        return
    key = segment.embeddings.store_key if segment.embeddings is not None else None
    raise InputError(f"{directory}: the full-dimension teacher vectors of segment {segment.name} are not in the "
                     f"embedding store at {store.root} (key {key}), and its index is {manifest.dim}-d "
                     f"{manifest.quantization.value}; run this where the bundle was built, or set TANDEM_HOME to "
                     "that store")


def live_documents(directory: Path, manifest: BundleManifest) -> Iterator[list[Document]]:
    """The live documents of a version, in chunks, segment by segment, in row order."""
    for segment, deleted in zip(manifest.parts, tombstone_masks(directory, manifest), strict=True):
        docs = DocStore(directory / in_segment(segment, DOCSTORE_FILE))
        try:
            for start in range(0, segment.count, CHUNK):
                got = docs.range(start, min(start + CHUNK, segment.count))
                yield [d for d, gone in zip(got, deleted[start : start + len(got)], strict=True) if not gone]
        finally:
            docs.close()


def live_vectors(directory: Path, manifest: BundleManifest, store: EmbeddingStore) -> Iterator[np.ndarray]:
    """The float32 teacher vectors of a version's live rows, in chunks, segment by segment, in row order (those of
    `rows`, without reading a document); `manifest` may name other embedding-store entries for its segments."""
    for segment, deleted in zip(manifest.parts, tombstone_masks(directory, manifest), strict=True):
        start = 0
        for chunk in segment_vectors(directory, manifest, segment, store):
            yield np.asarray(chunk[~deleted[start : start + len(chunk)]], dtype=np.float32)
            start += len(chunk)
        _check_count(directory, segment, start)


def _check_count(directory: Path, segment: SegmentInfo, vectors: int) -> None:
    if vectors != segment.count:
        raise InputError(f"{directory}: {vectors} vectors for segment {segment.name}, the manifest counts "
                         f"{segment.count}")


def rows(directory: Path, store: EmbeddingStore | None = None) -> Iterator[tuple[list[Document], np.ndarray]]:
    """(live documents, float32 vectors) chunks of a version, segment by segment, in row order."""
    manifest = read_bundle_manifest(directory)
    store = store or EmbeddingStore()
    for segment, deleted in zip(manifest.parts, tombstone_masks(directory, manifest), strict=True):
        docs = DocStore(directory / in_segment(segment, DOCSTORE_FILE))
        try:
            start = 0
            for chunk in segment_vectors(directory, manifest, segment, store):
                got = docs.range(start, start + len(chunk))
                live = ~deleted[start : start + len(chunk)]
                yield [d for d, keep in zip(got, live, strict=True) if keep], np.asarray(chunk[live], dtype=np.float32)
                start += len(chunk)
            _check_count(directory, segment, start)
        finally:
            docs.close()
