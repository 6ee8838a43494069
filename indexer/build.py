"""`tandem index build`: corpus → teacher embeddings (cached) → FAISS bundle, published atomically."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.imported import load_imported
from models.contract import SUPPORTED_DIMS
from models.corpus import Document, corpus_key, read_corpus
from models.docstore import DOCSTORE_FILE, write_docstore
from models.embedding_store import EmbeddingStore, store_key
from models.errors import InputError
from models.manifest import BUNDLE_MANIFEST, BundleManifest, CorpusInfo, EmbeddingSource, Quantization
from models.registry import ModelCard, load_card, resolve, sha256_file
from models.staging import check_target, staged
from models.vector_index import VectorIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildRequest:
    corpus: Path
    out: Path
    dim: int = 768
    quantization: str = "float"
    teacher: Path | None = None
    embeddings: Path | None = None
    ids: Path | None = None
    batch_size: int = 32
    device: str | None = None
    force: bool = False
    store: Path | None = None


def _quantization(value: str) -> Quantization:
    try:
        return Quantization(value)
    except ValueError:
        choices = ", ".join(q.value for q in Quantization)
        raise InputError(f"unknown quantization {value!r}; choose one of {choices}") from None


def _check_dim(dim: int, card: ModelCard) -> None:
    if dim not in SUPPORTED_DIMS or dim > card.dim:
        allowed = ", ".join(str(d) for d in SUPPORTED_DIMS if d <= card.dim)
        raise InputError(f"--dim {dim} is not supported for a {card.dim}-d teacher; choose one of {allowed}")


def teacher_vectors(
    docs: list[Document], card: ModelCard, req: BuildRequest, store: EmbeddingStore
) -> tuple[np.ndarray, EmbeddingSource]:
    """Full-dimension teacher vectors for the corpus: imported, cached, or encoded now (and cached)."""
    key = store_key(card.fingerprint, card.max_seq_length, corpus_key(docs))
    if req.embeddings is not None:
        if req.ids is None:
            raise InputError("--embeddings needs --ids (a JSON list of document ids, one per row)")
        vectors = load_imported(req.embeddings, req.ids, docs, card.dim)
        store.put(key, vectors, {"source": "imported", "path": str(req.embeddings), "teacher": card.fingerprint})
        source = EmbeddingSource(kind="imported", path=str(Path(req.embeddings).resolve()),
                                 sha256=sha256_file(Path(req.embeddings)), store_key=key)
        return vectors, source
    cached = store.load(key)
    if cached is not None:
        log.info("reusing %d cached teacher embeddings (store key %s)", len(cached), key)
        return cached, EmbeddingSource(kind=store.meta(key).get("source", "encoded"), store_key=key)
    from models.teacher import TeacherEncoder  # torch only when we must encode

    encoder = TeacherEncoder(Path(card.path), device=req.device)

    def encode(texts: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        return encoder.encode(texts, batch_size=req.batch_size, on_progress=on_progress)

    meta = {"source": "encoded", "teacher": card.fingerprint, "max_seq_length": card.max_seq_length}
    vectors = store.encode(key, [d.passage() for d in docs], encode, meta)
    return vectors, EmbeddingSource(kind="encoded", store_key=key)


def build(req: BuildRequest) -> BundleManifest:
    started = time.perf_counter()
    quantization = _quantization(req.quantization)
    check_target(Path(req.out), req.force)
    card = load_card(resolve("teacher", req.teacher))
    _check_dim(req.dim, card)
    docs = read_corpus(req.corpus)
    log.info("corpus %s: %d documents", req.corpus, len(docs))
    store = EmbeddingStore(req.store)
    vectors, source = teacher_vectors(docs, card, req, store)
    index = VectorIndex.build(vectors, req.dim, quantization)
    with staged(Path(req.out), req.force) as staging:
        names = index.save(staging)
        write_docstore(staging / DOCSTORE_FILE, docs)
        names.append(DOCSTORE_FILE)
        manifest = BundleManifest(
            teacher=card.teacher_ref(),
            dim=req.dim,
            quantization=quantization,
            count=len(docs),
            build_seconds=round(time.perf_counter() - started, 3),
            corpus=CorpusInfo(path=str(Path(req.corpus).resolve()), sha256=sha256_file(Path(req.corpus)),
                              count=len(docs)),
            embeddings=source,
            files={name: sha256_file(staging / name) for name in names},
        )
        (staging / BUNDLE_MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    log.info("published %s in %.1fs", req.out, time.perf_counter() - started)
    return manifest
