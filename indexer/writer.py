"""Writing a bundle's files into a staging directory: index, docstore, optional corpus, manifest last."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from models.corpus import Document
from models.docstore import DOCSTORE_FILE, write_docstore
from models.index_spec import IndexSpec
from models.manifest import BUNDLE_MANIFEST, BaseInfo, BundleManifest, CorpusInfo, EmbeddingSource, Quantization
from models.registry import ModelCard, sha256_file
from models.rotation import ROTATION_FILE, Rotation, fit_pca_rotation, rotate
from models.vector_index import VectorIndex

CORPUS_FILE = "corpus.jsonl"


def write_corpus(path: Path, docs: list[Document]) -> None:
    """BEIR JSONL that models.corpus reads back into the very same documents (and corpus key)."""
    with path.open("w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n")


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
) -> BundleManifest:
    """Write every file, then the manifest that lists their sha256.

    Without `corpus` (an update has no corpus file of its own) the documents are materialized
    as corpus.jsonl inside the bundle, so later updates, `tandem eval` and `tandem distill` can use it.
    `index` is a resolved spec (models.index_spec.resolve_spec); default flat.
    """
    index = index or IndexSpec()
    names = []
    if rotation is Rotation.PCA:
        matrix = fit_pca_rotation(vectors)
        np.save(staging / ROTATION_FILE, matrix)
        names.append(ROTATION_FILE)
        vectors = rotate(vectors, matrix)
    names += VectorIndex.build(vectors, dim, quantization, index).save(staging)
    write_docstore(staging / DOCSTORE_FILE, docs)
    names.append(DOCSTORE_FILE)
    if corpus is None:
        write_corpus(staging / CORPUS_FILE, docs)
        names.append(CORPUS_FILE)
        corpus = CorpusInfo(path=CORPUS_FILE, sha256=sha256_file(staging / CORPUS_FILE), count=len(docs))
    manifest = BundleManifest(
        teacher=card.teacher_ref(),
        dim=dim,
        quantization=quantization,
        count=len(docs),
        build_seconds=round(time.perf_counter() - started, 3),
        corpus=corpus,
        embeddings=source,
        files={name: sha256_file(staging / name) for name in names},
        version=version,
        base=base,
        rotation=rotation,
        index=index,
    )
    (staging / BUNDLE_MANIFEST).write_text(manifest.model_dump_json(indent=2, exclude_none=True) + "\n")
    return manifest
