"""`tandem index build`: corpus → teacher embeddings (cached) → FAISS bundle, published atomically."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.imported import load_imported
from indexer.publish import Target, publish
from indexer.writer import write_bundle
from models.contract import SUPPORTED_DIMS
from models.corpus import Document, corpus_key, read_corpus
from models.embedding_store import SHARD_SIZE, EmbeddingStore, store_key
from models.errors import InputError
from models.index_spec import IndexSpec, resolve_spec
from models.manifest import BundleManifest, CorpusInfo, EmbeddingSource, Quantization
from models.registry import ModelCard, load_card, resolve, sha256_file
from models.rotation import Rotation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildRequest:
    corpus: Path
    out: Path | None = None
    dim: int = 768
    quantization: str = "float"
    rotation: str = "none"
    teacher: Path | None = None
    embeddings: Path | None = None
    ids: Path | None = None
    batch_size: int = 32
    device: str | None = None
    force: bool = False
    store: Path | None = None
    root: Path | None = None
    version: str | None = None
    keep: int | None = None
    shard_size: int = SHARD_SIZE
    index: str = "flat"
    hnsw_m: int | None = None
    ef_construction: int | None = None
    ef_search: int | None = None
    ivf_nlist: int | None = None
    ivf_nprobe: int | None = None

    @property
    def target(self) -> Target:
        return Target(out=self.out, root=self.root, version=self.version, keep=self.keep, force=self.force)

    def index_spec(self, quantization: Quantization, count: int) -> IndexSpec:
        return resolve_spec(self.index, quantization, count, hnsw_m=self.hnsw_m,
                            ef_construction=self.ef_construction, ef_search=self.ef_search,
                            ivf_nlist=self.ivf_nlist, ivf_nprobe=self.ivf_nprobe)


def _quantization(value: str) -> Quantization:
    try:
        return Quantization(value)
    except ValueError:
        choices = ", ".join(q.value for q in Quantization)
        raise InputError(f"unknown quantization {value!r}; choose one of {choices}") from None


def _rotation(value: str) -> Rotation:
    try:
        return Rotation(value)
    except ValueError:
        raise InputError(f"unknown rotation {value!r}; choose one of {', '.join(r.value for r in Rotation)}") from None


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
        src = store.meta(key).get("source", "encoded")
        return cached, EmbeddingSource(kind="imported" if src == "imported" else "encoded", store_key=key)
    vectors = encode_documents(store, key, docs, card, req.batch_size, req.device)
    return vectors, EmbeddingSource(kind="encoded", store_key=key)


def encode_documents(
    store: EmbeddingStore, key: str, docs: Sequence[Document], card: ModelCard, batch_size: int, device: str | None
) -> np.ndarray:
    """Encode into the store entry `key`, shard by shard (resumable, logged), loading torch only now."""
    from models.teacher import TeacherEncoder

    encoder = TeacherEncoder(Path(card.path), device=device)

    def encode(texts: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        return encoder.encode(texts, batch_size=batch_size, on_progress=on_progress)

    meta = {"source": "encoded", "teacher": card.fingerprint, "max_seq_length": card.max_seq_length}
    return store.encode(key, [d.passage() for d in docs], encode, meta)


def _check_shard_size(size: int) -> None:
    if size < 1:
        raise InputError(f"--shard-size must be at least 1, got {size}")


def build(req: BuildRequest) -> BundleManifest:
    started = time.perf_counter()
    quantization = _quantization(req.quantization)
    rotation = _rotation(req.rotation)
    _check_shard_size(req.shard_size)
    req.target.check()
    card = load_card(resolve("teacher", req.teacher))
    _check_dim(req.dim, card)
    docs = read_corpus(req.corpus)
    log.info("corpus %s: %d documents", req.corpus, len(docs))
    index = req.index_spec(quantization, len(docs))  # refused here, before any encoding
    store = EmbeddingStore(req.store, shard_size=req.shard_size)
    vectors, source = teacher_vectors(docs, card, req, store)
    corpus = CorpusInfo(path=str(Path(req.corpus).resolve()), sha256=sha256_file(Path(req.corpus)), count=len(docs))
    with publish(req.target) as (staging, version):
        manifest = write_bundle(staging, docs, vectors, dim=req.dim, quantization=quantization, card=card,
                                source=source, started=started, corpus=corpus, version=version, rotation=rotation,
                                index=index)
    log.info("published %s in %.1fs", req.target.describe(version), time.perf_counter() - started)
    return manifest
