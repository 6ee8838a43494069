"""The teacher-embedding store: full-dimension document vectors, computed once per corpus.

Vectors are float16 shards keyed by (teacher fingerprint, max_seq_length, corpus content
hash). Index builds at any dim or quantization and the distiller read them instead of
re-encoding. Shards are written atomically as they finish and recorded in an append-only
shard log (models.shard_log), so an interrupted encode resumes where it stopped and the log
shows that no shard was encoded twice.
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
from models.registry import sha256_file
from models.shard_log import ShardEvent, ShardLog, ShardRecord, entry_lock, now

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


def _shard_path(entry: Path, index: int) -> Path:
    return entry / f"shard-{index:05d}.npy"


class EmbeddingStore:
    def __init__(self, root: Path | None = None, shard_size: int = SHARD_SIZE) -> None:
        self.root = Path(root) if root is not None else embeddings_dir()
        self.shard_size = shard_size

    def entry(self, key: str) -> Path:
        return self.root / key

    def _shards(self, count: int, size: int = SHARD_SIZE) -> list[tuple[int, int]]:
        return [(s, min(s + size, count)) for s in range(0, count, size)]

    def _entry_shard_size(self, entry: Path) -> int:
        """An entry keeps the shard size it was started with, whatever this store was asked for."""
        records = ShardLog(entry).read()
        if records:
            return records[0].shard_size
        meta_path = entry / META_FILE
        if meta_path.is_file():
            return int(json.loads(meta_path.read_text()).get("shard_size", SHARD_SIZE))
        return self.shard_size

    def load(self, key: str) -> np.ndarray | None:
        """All vectors of a complete entry as float32, or None if absent or unfinished."""
        entry = self.entry(key)
        meta_path = entry / META_FILE
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        size = int(meta.get("shard_size", SHARD_SIZE))
        shards = [_shard_path(entry, i) for i, _ in enumerate(self._shards(meta["count"], size))]
        if not all(p.is_file() for p in shards):
            return None
        return np.concatenate([np.load(p) for p in shards]).astype(np.float32)

    def meta(self, key: str) -> dict:
        return json.loads((self.entry(key) / META_FILE).read_text())

    def encode(
        self, key: str, texts: Sequence[str], encode: Encode, meta: dict, progress: bool = True
    ) -> np.ndarray:
        """Encode the texts shard by shard, skipping shards already on disk (checked against the shard log)."""
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        with entry_lock(entry):  # one process encodes an entry at a time; others wait, then reuse its work
            done = self.load(key)
            return done if done is not None else self._encode_shards(key, texts, encode, meta, progress)

    def _encode_shards(
        self, key: str, texts: Sequence[str], encode: Encode, meta: dict, progress: bool
    ) -> np.ndarray:
        entry = self.entry(key)
        size = self._entry_shard_size(entry)
        shards = self._shards(len(texts), size)
        logged = ShardLog(entry).latest()
        todo = [(i, s, e) for i, (s, e) in enumerate(shards) if not self._reusable(entry, i, s, e, size, logged)]
        if len(todo) < len(shards):
            log.info("embedding store %s: resuming, %d of %d shards already encoded", key, len(shards) - len(todo),
                     len(shards))
        bar = tqdm(total=sum(e - s for _, s, e in todo), desc="teacher", unit="doc", disable=not progress)
        for i, start, end in todo:
            vectors = encode(texts[start:end], bar.update)
            self._write_shard(entry, i, start, end, size, vectors, "encoded")
            log.debug("shard %d (%d docs) written", i, end - start)
        bar.close()
        self._write_meta(key, {**meta, "count": len(texts), "shard_size": size})
        loaded = self.load(key)
        assert loaded is not None
        return loaded

    def put(self, key: str, vectors: np.ndarray, meta: dict) -> None:
        """Store vectors computed elsewhere (an import) under `key`."""
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        size = self._entry_shard_size(entry)
        for i, (start, end) in enumerate(self._shards(len(vectors), size)):
            self._write_shard(entry, i, start, end, size, vectors[start:end], "stored")
        self._write_meta(key, {**meta, "count": len(vectors), "shard_size": size})

    def shard_log(self, key: str) -> list[ShardRecord]:
        return ShardLog(self.entry(key)).read()

    def _write_shard(
        self, entry: Path, i: int, start: int, end: int, size: int, vectors: np.ndarray, event: ShardEvent
    ) -> None:
        path = _shard_path(entry, i)
        _atomic_save(path, vectors.astype(np.float16))
        ShardLog(entry).append(ShardRecord(shard=i, start=start, end=end, sha256=sha256_file(path),
                                           event=event, shard_size=size, at=now(), pid=os.getpid()))

    def _reusable(self, entry: Path, i: int, start: int, end: int, size: int, logged: dict[int, ShardRecord]) -> bool:
        """A shard on disk is kept if the log vouches for it, or (killed before logging) if it is whole."""
        path = _shard_path(entry, i)
        if not path.is_file():
            return False
        digest = sha256_file(path)
        record = logged.get(i)
        if record is not None:
            if record.sha256 == digest and (record.start, record.end) == (start, end):
                return True
            log.warning("%s does not match its shard log record; encoding it again", path)
            return False
        try:
            rows = np.load(path)
        except (OSError, ValueError):
            return False
        if rows.ndim != 2 or len(rows) != end - start or not np.isfinite(rows).all():
            return False
        ShardLog(entry).append(ShardRecord(shard=i, start=start, end=end, sha256=digest, event="adopted",
                                           shard_size=size, at=now(), pid=os.getpid()))
        return True

    def _write_meta(self, key: str, meta: dict) -> None:
        path = self.entry(key) / META_FILE
        tmp = path.with_name(META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        tmp.replace(path)
