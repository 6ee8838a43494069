"""The teacher-embedding store: full-dimension document vectors, computed once per corpus.

Vectors are float16 shards keyed by (teacher fingerprint, max_seq_length, corpus content
hash). Index builds at any dim or quantization and the distiller read them instead of
re-encoding. Shards are written atomically as they finish and recorded in an append-only
shard log (models.embeddings.shard_log), so an interrupted encode resumes where it stopped and the log
shows that no shard was encoded twice.

An import is stored as one float16 file (put_file): written in place by the import's scatter,
or, when the import already is that file, shared with it by a hard link. Such an entry records
the file's size and mtime, and a read refuses the entry if they changed (the import was
rewritten in place). Readers memory-map the files and hold a bounded slice at a time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from models.atomic import atomic_write, fsync_dir
from models.embeddings.shard_log import ShardEvent, ShardLog, ShardRecord, entry_lock, now
from models.errors import ContractMismatch
from models.hashing import sha256_file
from models.paths import embeddings_dir, is_plain_name

log = logging.getLogger(__name__)

SHARD_SIZE = 512
META_FILE = "meta.json"
READ_ROWS = 8192  # rows a reader holds at a time, whatever the shard size
LINK_FAILURES = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES)

# encode(texts, on_progress) -> vectors; on_progress(n) is called as batches finish.
Encode = Callable[[Sequence[str], Callable[[int], object]], np.ndarray]


@dataclass(frozen=True)
class Shard:
    """Rows [start, end) of an entry, stored as shard file number `index`."""

    index: int
    start: int
    end: int


# write(scratch) fills `scratch`, a new path inside the entry, with the entry's float16 [count, dim] .npy and returns
# it, or returns another file that already holds exactly that (an import in corpus order) to be shared with the entry.
FileWriter = Callable[[Path], Path]

# run(shards, on_progress) yields (shard, vectors) as each finishes, in any order: the local
# engine encodes them in turn, the Ray engine (indexer.encoding.ray_engine) across a cluster.
ShardRunner = Callable[[list[Shard], Callable[[int], object]], Iterator[tuple[Shard, np.ndarray]]]


def store_key(teacher_fingerprint: str, max_seq_length: int, corpus_key: str, precision: str = "fp32") -> str:
    """fp32 keys stay as they were; another precision gets its own entry (its vectors differ)."""
    raw = f"{teacher_fingerprint}:{max_seq_length}:{corpus_key}"
    if precision != "fp32":
        raw += f":{precision}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _shard_path(entry: Path, index: int) -> Path:
    return entry / f"shard-{index:05d}.npy"


def shards_of(count: int, size: int) -> list[Shard]:
    return [Shard(i, s, min(s + size, count)) for i, s in enumerate(range(0, count, size))]


class EmbeddingStore:
    """The teacher's vectors of a corpus, kept in checkpointed shards under TANDEM_HOME.

    Keyed by (teacher fingerprint, max length, corpus key, precision), so builds, updates and distillation reuse
    what was encoded once, and a killed build resumes from its last finished shard.
    """

    def __init__(self, root: Path | None = None, shard_size: int = SHARD_SIZE) -> None:
        self.root = Path(root) if root is not None else embeddings_dir()
        self.shard_size = shard_size

    def entry(self, key: str) -> Path:
        """The entry's directory; a key (read from a bundle's manifest, too) that is not a plain name is refused."""
        if not is_plain_name(key):
            raise ContractMismatch(f"embedding-store key {key!r}: letters, digits, '.', '_' and '-' only")
        return self.root / key

    def _entry_shard_size(self, entry: Path) -> int:
        """An entry keeps the shard size it was started with, whatever this store was asked for."""
        records = ShardLog(entry).read()
        if records:
            return records[-1].shard_size  # put_file restarts an entry with one shard of all its rows
        meta_path = entry / META_FILE
        if meta_path.is_file():
            return int(json.loads(meta_path.read_text()).get("shard_size", SHARD_SIZE))
        return self.shard_size

    def _complete_shards(self, key: str) -> list[Path] | None:
        meta_path = self.entry(key) / META_FILE
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        size = int(meta.get("shard_size", SHARD_SIZE))
        paths = [_shard_path(self.entry(key), s.index) for s in shards_of(int(meta["count"]), size)]
        if not all(p.is_file() for p in paths):
            return None
        if "file" in meta:
            _check_unchanged(paths[0], meta)
        return paths

    def complete(self, key: str) -> bool:
        return self._complete_shards(key) is not None

    def load(self, key: str) -> np.ndarray | None:
        """All vectors of a complete entry as float32, or None if absent or unfinished (small corpora only)."""
        if not self.complete(key):
            return None
        return np.concatenate(list(self.iter_chunks(key)))

    def iter_chunks(self, key: str) -> Iterator[np.ndarray]:
        """A complete entry's vectors as float32 in row order, at most READ_ROWS at a time, read with plain reads:
        bounded memory, one 512-row shard or one file of all the rows alike. Not memory-mapped: a mapping's pages
        count in the reader's resident set as it goes, so a build or compaction reading a 15 GB entry would show
        15 GB resident (page cache, not the process's memory, but no longer telling the one from the other)."""
        for path in self._paths(key):
            with path.open("rb") as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(fh)
                if fortran or len(shape) != 2:
                    raise ContractMismatch(f"{path}: not a C-ordered 2-d array of vectors")
                count, dim = shape
                for start in range(0, count, READ_ROWS):
                    n = min(READ_ROWS, count - start)
                    rows = np.fromfile(fh, dtype=dtype, count=n * dim)
                    if len(rows) != n * dim:
                        raise ContractMismatch(f"{path}: ends before its {count} rows")
                    yield rows.reshape(n, dim).astype(np.float32)

    def take(self, key: str, rows: np.ndarray) -> np.ndarray:
        """The float32 vectors of entry rows `rows` (any order), in that order, gathered from memory-mapped shards:
        memory and reads grow with len(rows), not with the shard size (random access for updates and rewrites)."""
        paths = self._paths(key)
        size = int(self.meta(key)["shard_size"])
        rows = np.asarray(rows, dtype=np.int64)
        out: np.ndarray | None = None
        shard_of = rows // size
        for index in np.unique(shard_of):
            pick = shard_of == index
            mapped = np.load(paths[int(index)], mmap_mode="r")
            if out is None:
                out = np.empty((len(rows), mapped.shape[1]), dtype=np.float32)
            out[pick] = mapped[rows[pick] - index * size]
        return out if out is not None else np.empty((0, 0), dtype=np.float32)

    def shard(self, key: str, index: int) -> np.ndarray:
        """One shard of an entry as float32 (its whole file: for 512-row shards; `take` reads bounded rows)."""
        return np.load(_shard_path(self.entry(key), index)).astype(np.float32)

    def _paths(self, key: str) -> list[Path]:
        paths = self._complete_shards(key)
        if paths is None:
            raise FileNotFoundError(f"embedding store entry {key} is absent or unfinished")
        return paths

    def meta(self, key: str) -> dict:
        return json.loads((self.entry(key) / META_FILE).read_text())

    def encode(
        self, key: str, texts: Sequence[str], encode: Encode, meta: dict, progress: bool = True
    ) -> np.ndarray:
        """Encode the texts shard by shard, skipping shards already on disk; return them all (small corpora)."""
        self.ensure(key, len(texts), local_runner(texts, encode), meta, progress)
        loaded = self.load(key)
        assert loaded is not None
        return loaded

    def ensure(self, key: str, count: int, run: ShardRunner, meta: dict, progress: bool = True) -> None:
        """Make entry `key` complete: `run` computes the shards not already on disk (checked against the log)."""
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        with entry_lock(entry):  # one process encodes an entry at a time; others wait, then reuse its work
            if self.complete(key):
                return
            size = self._entry_shard_size(entry)
            shards = shards_of(count, size)
            logged = ShardLog(entry).latest()
            todo = [s for s in shards if not self._reusable(entry, s, size, logged)]
            if len(todo) < len(shards):
                log.info("embedding store %s: resuming, %d of %d shards already encoded", key,
                         len(shards) - len(todo), len(shards))
            bar = tqdm(total=sum(s.end - s.start for s in todo), desc="teacher", unit="doc", disable=not progress)
            for shard, vectors in run(todo, bar.update):
                if vectors.shape[0] != shard.end - shard.start:
                    rows = shard.end - shard.start
                    raise ValueError(f"shard {shard.index}: {vectors.shape[0]} vectors for {rows} rows")
                self._write_shard(entry, shard, size, vectors, "encoded")
                log.debug("shard %d (%d docs) written", shard.index, shard.end - shard.start)
            bar.close()
            self._write_meta(key, {**meta, "count": count, "shard_size": size})

    def put(self, key: str, vectors: np.ndarray, meta: dict) -> None:
        """Store vectors computed elsewhere (an import, an update) under `key`."""
        self.put_stream(key, [vectors], meta)

    def put_stream(self, key: str, chunks: Iterable[np.ndarray], meta: dict) -> int:
        """Store vectors arriving in row-ordered chunks of any size, a shard at a time; returns the count."""
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        with entry_lock(entry):
            size = self._entry_shard_size(entry)
            pending: list[np.ndarray] = []
            held = count = index = 0
            for chunk in chunks:
                pending.append(chunk)
                held += len(chunk)
                while held >= size:
                    rows = np.concatenate(pending)
                    self._write_shard(entry, Shard(index, count, count + size), size, rows[:size], "stored")
                    pending, held = [rows[size:]], held - size
                    index, count = index + 1, count + size
            if held:
                rows = np.concatenate(pending)
                self._write_shard(entry, Shard(index, count, count + held), size, rows, "stored")
                count += held
            self._write_meta(key, {**meta, "count": count, "shard_size": size})
        return count

    def put_file(self, key: str, count: int, meta: dict, write: FileWriter) -> None:
        """Store an entry as one float16 file of all `count` rows, replacing what the entry held.

        `write` (FileWriter) fills a scratch file in the entry, renamed to the entry's only shard once fsynced, or
        returns an existing file to share: hard-linked into the entry (no copy), copied where a link is refused
        (another filesystem). The file's size and mtime are kept in the meta and shard log; reads refuse the entry
        if they change, so an import rewritten in place is never served.
        """
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        with entry_lock(entry):
            scratch = entry / f".data-{uuid.uuid4().hex[:8]}.npy.tmp"
            try:
                source = write(scratch)  # a refused import raises here and leaves the entry as it was
                (entry / META_FILE).unlink(missing_ok=True)  # unfinished from here until the new meta is written
                for old in entry.glob("shard-*.npy"):
                    old.unlink()
                event: ShardEvent = "stored"
                if source != scratch:
                    event = _link_or_copy(source, scratch)
                path = _shard_path(entry, 0)
                os.replace(scratch, path)
            finally:
                scratch.unlink(missing_ok=True)
            fsync_dir(entry)
            stat = path.stat()
            ShardLog(entry).append(ShardRecord(shard=0, start=0, end=count, sha256=sha256_file(path), event=event,
                                               shard_size=max(count, 1), at=now(), pid=os.getpid(),
                                               size=stat.st_size, mtime_ns=stat.st_mtime_ns))
            self._write_meta(key, {**meta, "count": count, "shard_size": max(count, 1),
                                   "file": {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                            "linked": event == "linked"}})

    def shard_log(self, key: str) -> list[ShardRecord]:
        return ShardLog(self.entry(key)).read()

    def _write_shard(self, entry: Path, shard: Shard, size: int, vectors: np.ndarray, event: ShardEvent) -> None:
        path = _shard_path(entry, shard.index)
        data = np.ascontiguousarray(vectors, dtype=np.float16)
        atomic_write(path, lambda fh: np.save(fh, data))
        ShardLog(entry).append(ShardRecord(shard=shard.index, start=shard.start, end=shard.end,
                                           sha256=sha256_file(path), event=event, shard_size=size, at=now(),
                                           pid=os.getpid()))

    def _reusable(self, entry: Path, shard: Shard, size: int, logged: dict[int, ShardRecord]) -> bool:
        """A shard on disk is kept if the log vouches for it, or (killed before logging) if it is whole."""
        path = _shard_path(entry, shard.index)
        if not path.is_file():
            return False
        digest = sha256_file(path)
        record = logged.get(shard.index)
        if record is not None:
            if record.sha256 == digest and (record.start, record.end) == (shard.start, shard.end):
                return True
            log.warning("%s does not match its shard log record; encoding it again", path)
            return False
        try:
            rows = np.load(path)
        except (OSError, ValueError):
            return False
        if rows.ndim != 2 or len(rows) != shard.end - shard.start or not np.isfinite(rows).all():
            return False
        ShardLog(entry).append(ShardRecord(shard=shard.index, start=shard.start, end=shard.end, sha256=digest,
                                           event="adopted", shard_size=size, at=now(), pid=os.getpid()))
        return True

    def _write_meta(self, key: str, meta: dict) -> None:
        text = (json.dumps(meta, indent=2) + "\n").encode()
        atomic_write(self.entry(key) / META_FILE, lambda fh: fh.write(text))


def _link_or_copy(source: Path, target: Path) -> ShardEvent:
    """Hard-link `source` to `target` (the same inode: no disk used); copy it where the filesystem refuses."""
    try:
        os.link(source, target)
        log.info("embedding store: %s shared by a hard link (no copy)", source)
        return "linked"
    except OSError as exc:
        if exc.errno not in LINK_FAILURES:
            raise
        log.info("embedding store: cannot hard-link %s (%s); copying it", source, exc.strerror or exc)
        with source.open("rb") as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
            dst.flush()
            os.fsync(dst.fileno())
        return "stored"


def _check_unchanged(path: Path, meta: dict) -> None:
    """A single-file entry is served only while its file is the one stored (a linked import rewritten in place
    is not): ContractMismatch naming the file otherwise."""
    stat = path.stat()
    want = meta["file"]
    if (stat.st_size, stat.st_mtime_ns) != (want["size"], want["mtime_ns"]):
        shared = f", shared by a hard link with the import {meta.get('path')}" if want.get("linked") else ""
        raise ContractMismatch(f"{path}{shared}: changed since it was stored (size {stat.st_size}, mtime_ns "
                               f"{stat.st_mtime_ns}; stored {want['size']}, {want['mtime_ns']}); its vectors are "
                               "not served: import them again (tandem index build --embeddings ...)")


def local_runner(texts: Sequence[str], encode: Encode) -> ShardRunner:
    """Encode shards one after another in this process (`texts` may be a lazy sequence: a docstore view)."""

    def run(shards: list[Shard], on_progress: Callable[[int], object]) -> Iterator[tuple[Shard, np.ndarray]]:
        for shard in shards:
            yield shard, encode(texts[shard.start : shard.end], on_progress)

    return run
