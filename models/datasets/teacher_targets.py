"""Teacher targets, computed once: documents from the indexer's embedding store, queries cached.

Document vectors are the very ones the bundle was built from (store key: teacher
fingerprint, max_seq_length, corpus hash), so the student aligns to what it is searched
against. Query targets are the teacher's vectors of the *prompted* query (its query prompt,
LEAF's asymmetric setup); the student learns to put the raw query there. Pseudo-query vectors
are cached under cache_dir()/targets, keyed by the teacher fingerprint (which covers the
prompts and the pooling), the precision it ran in (fp32 keys as before) and the sha256 of the texts, as resumable
float16 shards. The teacher is the process's shared one (models.encoders.teacher_cache): a demo's
build loaded it already. Each cached list also
records its texts, so a later run with another preset encodes only the texts no earlier run
did (a bigger preset's pseudo-queries are mostly a smaller one's).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence

import numpy as np

from models.atomic import atomic_write
from models.corpus import Document, corpus_key
from models.embeddings.store import EmbeddingStore, store_key
from models.encoders.precision import local_precision
from models.encoders.registry import ModelCard
from models.encoders.teacher import TeacherEncoder, pick_device
from models.encoders.teacher_cache import release_teacher, shared_teacher
from models.paths import cache_dir

log = logging.getLogger(__name__)

BATCH_SIZE = 32
TEXTS_FILE = "texts.json"


def texts_key(card: ModelCard, texts: Sequence[str], precision: str = "fp32") -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\x00")
    return store_key(card.fingerprint, card.max_seq_length, digest.hexdigest(), precision)


class TeacherTargets:
    """Loads the teacher only if some target is not on disk yet; `release` lets it go. `precision` as `--precision`
    takes it (models.encoders.precision.local_precision): None is fp16 on CUDA and fp32 elsewhere, `auto` bf16 on a
    CPU that computes it natively."""

    def __init__(self, card: ModelCard, device: str | None = None, store: EmbeddingStore | None = None,
                 precision: str | None = None) -> None:
        self.card = card
        self.device = device
        self.precision = local_precision(precision, pick_device(device).type).value
        self.store = store or EmbeddingStore()
        self.cache = EmbeddingStore(cache_dir() / "targets")

    @property
    def teacher(self) -> TeacherEncoder:
        return shared_teacher(self.card.path, self.device, self.precision)

    @staticmethod
    def release() -> None:
        """Free the teacher (training needs the memory); the next target encoded loads it again."""
        release_teacher()

    def _meta(self) -> dict[str, object]:
        return {"teacher": self.card.fingerprint, "max_seq_length": self.card.max_seq_length,
                "precision": self.precision}

    def _encode_documents(self, texts: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        return self.teacher.encode_documents(texts, batch_size=BATCH_SIZE, on_progress=on_progress)

    def _encode_queries(self, texts: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        return self.teacher.encode_queries(texts, batch_size=BATCH_SIZE, on_progress=on_progress)

    def documents(self, docs: Sequence[Document], built_from: str | None = None) -> np.ndarray:
        """float32 [len(docs), dim] in corpus order: the embedding store's entry, encoded into it if missing.

        `built_from`: the store key a bundle of these very documents records, read first, so the student learns the
        vectors it is searched against in whatever precision the build's teacher ran (`--precision auto`: bf16
        on a CPU that has it) and the corpus is never encoded a second time in fp32."""
        if built_from is not None:
            vectors = self.store.load(built_from)
            if vectors is not None and len(vectors) == len(docs):
                log.info("document targets: %d vectors the bundle was built from (key %s)", len(vectors), built_from)
                return vectors
        key = store_key(self.card.fingerprint, self.card.max_seq_length, corpus_key(list(docs)), self.precision)
        vectors = self.store.load(key)
        if vectors is not None:
            log.info("document targets: %d vectors from the embedding store (key %s)", len(vectors), key)
            return vectors
        log.info("document targets: not in the embedding store, encoding %d documents with the teacher", len(docs))
        meta = {"source": "encoded", **self._meta()}
        return self.store.encode(key, [d.passage() for d in docs], self._encode_documents, meta)

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim], the teacher's vectors of the prompted queries: from the cache, encoding only
        texts that no cached list holds."""
        if not texts:
            return np.empty((0, self.card.dim), dtype=np.float32)
        key = texts_key(self.card, texts, self.precision)
        vectors = self.cache.load(key)
        if vectors is not None:
            log.info("query targets: %d vectors from the cache (key %s)", len(vectors), key)
            return vectors
        known = self._cached_vectors(set(texts))
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        log.info("query targets: %d of %d texts cached by earlier runs, encoding %d with the teacher (%s)",
                 len(texts) - len(missing), len(texts), len(missing), self.precision)
        meta = self._meta()
        if missing:
            new_key = texts_key(self.card, missing, self.precision)
            known.update(zip(missing, self.cache.encode(new_key, missing, self._encode_queries, meta), strict=True))
            self._record_texts(new_key, missing)
        vectors = np.stack([known[t] for t in texts])
        if missing != list(texts):  # not the entry just encoded: store the whole list, a hit for the next run
            self.cache.put(key, vectors, meta)
            self._record_texts(key, texts)
        return vectors

    def _record_texts(self, key: str, texts: Sequence[str]) -> None:
        path = self.cache.entry(key) / TEXTS_FILE
        atomic_write(path, lambda fh: fh.write(json.dumps(list(texts)).encode()))

    def _cached_vectors(self, wanted: set[str]) -> dict[str, np.ndarray]:
        """Vectors of `wanted` texts held by complete cached lists of this teacher in this precision (lists cached
        before the precision was recorded are fp32)."""
        found: dict[str, np.ndarray] = {}
        root = self.cache.root
        for texts_path in sorted(root.glob(f"*/{TEXTS_FILE}")) if root.is_dir() else []:
            key = texts_path.parent.name
            try:
                meta = self.cache.meta(key)
                if meta.get("teacher") != self.card.fingerprint or meta.get("precision", "fp32") != self.precision:
                    continue
            except (OSError, ValueError):  # an entry being written or damaged: not a source
                continue
            texts = json.loads(texts_path.read_text())
            rows = [i for i, t in enumerate(texts) if t in wanted and t not in found]
            vectors = self.cache.load(key) if rows else None
            if vectors is not None and len(vectors) == len(texts):
                found.update((texts[i], vectors[i]) for i in rows)
        return found
