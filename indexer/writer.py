"""Writing a bundle's files into a staging directory: vectors, docstore, optional corpus, manifest last.

Vectors arrive as a re-iterable source of row-ordered chunks (the embedding store's shards), so a
build holds the first stage plus one chunk, whatever the corpus size: one pass fits the PCA
rotation (a running covariance), one calibrates int8 (running min/max), one trains IVF on a
stride of rows, and the last fills the index. Each pass gives what the in-memory path would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from models.bundle.lexical.postings import build_lexical
from models.bundle.manifest import BUNDLE_MANIFEST, BaseInfo, BundleManifest, CorpusInfo, EmbeddingSource
from models.bundle.payload.fields import PayloadField
from models.bundle.payload.writer import write_payload
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore, write_docstore
from models.bundle.vectors.index import IndexWriter
from models.bundle.vectors.index_spec import IndexSpec, Quantization
from models.bundle.vectors.rotation import Rotation
from models.bundle.vectors.space import Space, VectorSource
from models.corpus import Document
from models.encoders.registry import ModelCard
from models.hashing import sha256_file
from models.search.fusion import DEFAULT_FUSION

CORPUS_FILE = "corpus.jsonl"


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
    (`fields` with their types, every other key inferred: models.bundle.payload.writer)."""
    docs = DocStore(staging / DOCSTORE_FILE)
    try:
        info, names = build_lexical(staging, docs, count)
        keys = docs.metadata_fields()
        payload, payload_names = write_payload(staging, docs, count, fields)
    finally:
        docs.close()
    described = {"lexical": info, "fusion": DEFAULT_FUSION, "metadata_fields": keys, "payload": payload}
    return described, names + payload_names


def write_index(directory: Path, count: int, source: VectorSource, *, dim: int, quantization: Quantization,
                index: IndexSpec, space: Space) -> list[str]:
    """The first stage (and, binary, its rescoring codes) of streamed vectors in a given space; returns the
    names written (the space's own files are not among them)."""
    writer = IndexWriter(directory, count, dim, quantization, index, space)
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
    only): the codes are taken after a random orthogonal rotation (models.bundle.vectors.space.sign_codes)."""
    space = Space.fit(count, source, dim=dim, quantization=quantization, rotation=rotation, center=center, spin=spin)
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
    file's is its base's (indexer.versions.segments)."""
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
