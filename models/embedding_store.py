"""The teacher-embedding store: full-dimension document vectors, computed once per corpus.

Vectors are float16 shards keyed by (teacher fingerprint, max_seq_length, corpus content
hash). Index builds at any dim or quantization and the distiller read them instead of
re-encoding. Shards are written atomically as they finish, so an interrupted encode
resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from models.paths import embeddings_dir

log = logging.getLogger(__name__)

SHARD_SIZE = 512
META_FILE = "meta.json"

# encode(texts, on_progress) -> vectors; on_progress(n) is called as batches finish.
Encode = Callable[[Sequence[str], Callable[[int], object]], np.ndarray]


def store_key(teacher_fingerprint: str, max_seq_length: int, corpus_key: str) -> str:
    raw = f"{teacher_fingerprint}:{max_seq_length}:{corpus_key}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        np.save(fh, array)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


class EmbeddingStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else embeddings_dir()

    def entry(self, key: str) -> Path:
        return self.root / key

    def _shards(self, count: int) -> list[tuple[int, int]]:
        return [(s, min(s + SHARD_SIZE, count)) for s in range(0, count, SHARD_SIZE)]

    def load(self, key: str) -> np.ndarray | None:
        """All vectors of a complete entry as float32, or None if absent or unfinished."""
        entry = self.entry(key)
        meta_path = entry / META_FILE
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        shards = [entry / f"shard-{i:05d}.npy" for i, _ in enumerate(self._shards(meta["count"]))]
        if not all(p.is_file() for p in shards):
            return None
        return np.concatenate([np.load(p) for p in shards]).astype(np.float32)

    def meta(self, key: str) -> dict:
        return json.loads((self.entry(key) / META_FILE).read_text())

    def encode(
        self, key: str, texts: Sequence[str], encode: Encode, meta: dict, progress: bool = True
    ) -> np.ndarray:
        """Encode the texts shard by shard, skipping shards already on disk."""
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        shards = self._shards(len(texts))
        todo = [(i, s, e) for i, (s, e) in enumerate(shards) if not (entry / f"shard-{i:05d}.npy").is_file()]
        if len(todo) < len(shards):
            log.info("embedding store %s: resuming, %d of %d shards already encoded", key, len(shards) - len(todo),
                     len(shards))
        bar = tqdm(total=sum(e - s for _, s, e in todo), desc="teacher", unit="doc", disable=not progress)
        for i, start, end in todo:
            vectors = encode(texts[start:end], bar.update)
            _atomic_save(entry / f"shard-{i:05d}.npy", vectors.astype(np.float16))
            log.debug("shard %d (%d docs) written", i, end - start)
        bar.close()
        self._write_meta(key, {**meta, "count": len(texts)})
        loaded = self.load(key)
        assert loaded is not None
        return loaded

    def put(self, key: str, vectors: np.ndarray, meta: dict) -> None:
        """Store vectors computed elsewhere (an import) under `key`."""
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        for i, (start, end) in enumerate(self._shards(len(vectors))):
            _atomic_save(entry / f"shard-{i:05d}.npy", vectors[start:end].astype(np.float16))
        self._write_meta(key, {**meta, "count": len(vectors)})

    def _write_meta(self, key: str, meta: dict) -> None:
        path = self.entry(key) / META_FILE
        tmp = path.with_name(META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        tmp.replace(path)
