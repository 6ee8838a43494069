"""Teacher targets, computed once: documents from the indexer's embedding store, queries cached.

Document vectors are the very ones the bundle was built from (store key: teacher
fingerprint, max_seq_length, corpus hash), so the student aligns to what it is searched
against. Pseudo-query vectors are cached under cache_dir()/targets, keyed by the teacher
fingerprint and the sha256 of the texts, as resumable float16 shards.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from models.corpus import Document, corpus_key
from models.embedding_store import EmbeddingStore, store_key
from models.paths import cache_dir
from models.registry import ModelCard
from models.teacher import TeacherEncoder

log = logging.getLogger(__name__)

BATCH_SIZE = 32


def texts_key(card: ModelCard, texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\x00")
    return store_key(card.fingerprint, card.max_seq_length, digest.hexdigest())


class TeacherTargets:
    """Loads the teacher only if some target is not on disk yet."""

    def __init__(self, card: ModelCard, device: str | None = None, store: EmbeddingStore | None = None) -> None:
        self.card = card
        self.device = device
        self.store = store or EmbeddingStore()
        self.cache = EmbeddingStore(cache_dir() / "targets")

    @cached_property
    def teacher(self) -> TeacherEncoder:
        return TeacherEncoder(Path(self.card.path), device=self.device)

    def _encode(self, texts: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        return self.teacher.encode(texts, batch_size=BATCH_SIZE, on_progress=on_progress)

    def documents(self, docs: Sequence[Document]) -> np.ndarray:
        """float32 [len(docs), dim] in corpus order: the embedding store's entry, encoded into it if missing."""
        key = store_key(self.card.fingerprint, self.card.max_seq_length, corpus_key(list(docs)))
        vectors = self.store.load(key)
        if vectors is not None:
            log.info("document targets: %d vectors from the embedding store (key %s)", len(vectors), key)
            return vectors
        log.info("document targets: not in the embedding store, encoding %d documents with the teacher", len(docs))
        meta = {"source": "encoded", "teacher": self.card.fingerprint, "max_seq_length": self.card.max_seq_length}
        return self.store.encode(key, [d.passage() for d in docs], self._encode, meta)

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim]: cached, or encoded by the teacher once and cached."""
        if not texts:
            return np.empty((0, self.card.dim), dtype=np.float32)
        key = texts_key(self.card, texts)
        vectors = self.cache.load(key)
        if vectors is not None:
            log.info("query targets: %d vectors from the cache (key %s)", len(vectors), key)
            return vectors
        log.info("query targets: encoding %d texts with the teacher", len(texts))
        meta = {"teacher": self.card.fingerprint, "max_seq_length": self.card.max_seq_length}
        return self.cache.encode(key, list(texts), self._encode, meta)
