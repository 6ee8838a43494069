"""Writing a bundle's files into a staging directory: vectors, docstore, optional corpus, manifest last.

Vectors arrive as a re-iterable source of row-ordered chunks (the embedding store's shards), so a
build holds the first stage plus one chunk, whatever the corpus size: one pass fits the PCA
rotation (a running covariance), one calibrates int8 (running min/max), one trains IVF on a
stride of rows, and the last fills the index. Each pass gives what the in-memory path would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.bundle.docstore import DOCSTORE_FILE, DocStore, write_docstore
from models.bundle.fields import PayloadField
from models.bundle.first_stage import spin_matrix
from models.bundle.index_spec import IndexSpec, Quantization
from models.bundle.lexical import build_lexical
from models.bundle.manifest import BUNDLE_MANIFEST, BaseInfo, BundleManifest, CorpusInfo, EmbeddingSource
from models.bundle.payload_writer import write_payload
from models.bundle.quantize import Int8Calibration
from models.bundle.rotation import ROTATION_FILE, PcaAccumulator, Rotation
from models.bundle.vector_index import CALIBRATION_FILE, CENTER_FILE, SPIN_FILE, IndexWriter
from models.contract import truncate
from models.corpus import Document
from models.encoders.registry import ModelCard, sha256_file
from models.search.fusion import DEFAULT_FUSION
from models.search.query import rotate

CORPUS_FILE = "corpus.jsonl"

# Full-dimension float32 unit vectors in row order, one chunk at a time; called once per pass.
VectorSource = Callable[[], Iterable[np.ndarray]]


def write_corpus(path: Path, docs: Iterable[Document]) -> int:
    """BEIR JSONL that models.corpus reads back into the very same documents (and corpus key)."""
    count = 0
    with path.open("w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d.to_json(), ensure_ascii=False) + "\n")
            count += 1
    return count


def write_doc_indexes(staging: Path, count: int, fields: Sequence[PayloadField] = ()) -> tuple[dict[str, object],
                                                                                           list[str]]:
    """The lexical and payload indexes over the staging docstore, and the manifest fields that describe the
    documents: lexical parameters, the default fusion, the metadata keys present and the payload schema
    (`fields` with their types, every other key inferred: models.bundle.payload_writer)."""
    docs = DocStore(staging / DOCSTORE_FILE)
    try:
        info, names = build_lexical(staging, docs, count)
        keys = docs.metadata_fields()
        payload, payload_names = write_payload(staging, docs, count, fields)
    finally:
        docs.close()
    described = {"lexical": info, "fusion": DEFAULT_FUSION, "metadata_fields": keys, "payload": payload}
    return described, names + payload_names


@dataclass(frozen=True)
class Space:
    """What makes scores comparable across a version's segments: fitted on the first segment's vectors (a build,
    a compaction), then shared by every later one (an update), whose vectors are scored in it unchanged
    (docs/decisions.md#segments-share-the-first-segments-space)."""

    rotation: np.ndarray | None = None  # pca: [768, 768]
    calibration: Int8Calibration | None = None  # int8 and binary
    center: np.ndarray | None = None  # binary: the first segment's mean
    spin: np.ndarray | None = None  # binary

    def save(self, staging: Path) -> list[str]:
        names = []
        for name, array in ((ROTATION_FILE, self.rotation), (CENTER_FILE, self.center), (SPIN_FILE, self.spin)):
            if array is not None:
                np.save(staging / name, array)
                names.append(name)
        if self.calibration is not None:
            np.save(staging / CALIBRATION_FILE, self.calibration.to_array())
            names.append(CALIBRATION_FILE)
        return names

    @classmethod
    def of(cls, bundle: Path, manifest: BundleManifest) -> Space:
        """The space a published version's segments share (its top-level files)."""
        def load(name: str, wanted: bool) -> np.ndarray | None:
            return np.asarray(np.load(bundle / name), dtype=np.float32) if wanted else None

        cal = None
        if manifest.quantization is not Quantization.FLOAT:
            cal = Int8Calibration.from_array(np.load(bundle / CALIBRATION_FILE))
        return cls(rotation=load(ROTATION_FILE, manifest.rotation is not Rotation.NONE), calibration=cal,
                   center=load(CENTER_FILE, manifest.binary_center), spin=load(SPIN_FILE, manifest.binary_spin))

    def truncated(self, chunks: Iterable[np.ndarray], dim: int) -> Iterator[np.ndarray]:
        """Full-dimension unit vectors as the index stores them: rotated, then MRL-truncated."""
        for chunk in chunks:
            yield np.ascontiguousarray(truncate(rotate(chunk, self.rotation), dim), dtype=np.float32)


def fit_space(count: int, source: VectorSource, *, dim: int, quantization: Quantization, rotation: Rotation,
              center: bool = False, spin: bool = False) -> Space:
    """Fit the space on streamed vectors: the PCA rotation (one pass), the int8 calibration (one pass) and, for
    binary, the mean the codes leave out (`center`, one pass) and the seeded spin."""
    matrix = None
    if rotation is Rotation.PCA:
        acc = PcaAccumulator()
        for chunk in source():
            acc.add(chunk)
        matrix = acc.matrix()
    fitted = Space(rotation=matrix)
    cal = None if quantization is Quantization.FLOAT else Int8Calibration.fit_stream(
        fitted.truncated(source(), dim))
    mean = None
    if center and quantization is Quantization.BINARY:
        total = np.zeros(dim, dtype=np.float64)
        for chunk in fitted.truncated(source(), dim):
            total += chunk.sum(axis=0, dtype=np.float64)
        mean = (total / max(1, count)).astype(np.float32)
    turn = spin_matrix(dim) if spin and quantization is Quantization.BINARY else None
    return Space(rotation=matrix, calibration=cal, center=mean, spin=turn)


def write_index(directory: Path, count: int, source: VectorSource, *, dim: int, quantization: Quantization,
                index: IndexSpec, space: Space) -> list[str]:
    """The first stage (and, binary, its rescoring codes) of streamed vectors in a given space; returns the
    names written (the space's own files are not among them)."""
    writer = IndexWriter(directory, count, dim, quantization, index, space.calibration, space.center, space.spin)
    try:
        if writer.train_step is not None:
            writer.train(space.truncated(source(), dim))
        for chunk in space.truncated(source(), dim):
            writer.add(chunk)
        return writer.finish()
    finally:
        writer.close()


def write_vectors(
    staging: Path, count: int, source: VectorSource, *, dim: int, quantization: Quantization,
    rotation: Rotation, index: IndexSpec, center: bool = False, spin: bool = False,
) -> list[str]:
    """Write a one-segment bundle's vectors from streamed ones: its space (rotation.npy for pca, the int8
    calibration, the binary center and spin) and its index; returns the names.

    `center` (binary only): one more pass takes the corpus mean, which the codes leave out; `spin` (binary
    only): the codes are taken after a random orthogonal rotation (models.bundle.first_stage.sign_codes)."""
    space = fit_space(count, source, dim=dim, quantization=quantization, rotation=rotation, center=center, spin=spin)
    names = space.save(staging)
    return names + write_index(staging, count, source, dim=dim, quantization=quantization, index=index,
                               space=space)


def write_manifest(staging: Path, names: list[str], **fields: object) -> BundleManifest:
    """The manifest last, listing the sha256 of every file written before it."""
    manifest = BundleManifest.model_validate({**fields, "files": {n: sha256_file(staging / n) for n in names}})
    write_version_manifest(staging, manifest)
    return manifest


def write_version_manifest(staging: Path, manifest: BundleManifest) -> None:
    """The manifest last: a new segment's files carry the sha256 computed as they were written, a linked
    file's is its base's (indexer.segments)."""
    (staging / BUNDLE_MANIFEST).write_text(manifest.model_dump_json(indent=2, exclude_none=True) + "\n")


def write_bundle(
    staging: Path,
    docs: list[Document],
    vectors: np.ndarray,
    *,
    dim: int,
    quantization: Quantization,
    card: ModelCard,
    source: EmbeddingSource,
    started: float,
    corpus: CorpusInfo | None = None,
    version: str | None = None,
    base: BaseInfo | None = None,
    rotation: Rotation = Rotation.NONE,
    index: IndexSpec | None = None,
    fields: Sequence[PayloadField] = (),
) -> BundleManifest:
    """Write every file of an in-memory corpus, then the manifest (small corpora, tests, evaluation).

    Without `corpus` the documents are materialized as corpus.jsonl inside the bundle, so later
    updates, `tandem eval` and `tandem distill` can use it.
    """
    names = write_vectors(staging, len(docs), lambda: [vectors], dim=dim, quantization=quantization,
                          rotation=rotation, index=index or IndexSpec())
    write_docstore(staging / DOCSTORE_FILE, docs)
    names.append(DOCSTORE_FILE)
    described, lexical_names = write_doc_indexes(staging, len(docs), fields)
    names += lexical_names
    if corpus is None:
        write_corpus(staging / CORPUS_FILE, docs)
        names.append(CORPUS_FILE)
        corpus = CorpusInfo(path=CORPUS_FILE, sha256=sha256_file(staging / CORPUS_FILE), count=len(docs))
    return write_manifest(staging, names, teacher=card.teacher_ref(), dim=dim, quantization=quantization,
                          count=len(docs), build_seconds=round(time.perf_counter() - started, 3), corpus=corpus,
                          embeddings=source, version=version, base=base, rotation=rotation,
                          index=index or IndexSpec(), **described)
