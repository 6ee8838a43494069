"""Importing teacher embeddings computed elsewhere (a GPU job, a Spark or Ray pipeline).

Accepted: one `.npy` file or a directory of `.npy` shards (rows in file-name order) with `--ids`
naming each row's document; or Parquet files (one, or a directory) with an id column and a
vector column. They are streamed chunk by chunk and checked before anything trusts them: shape,
finiteness, unit norm and exact id coverage of the corpus. Rows are scattered into corpus order
straight into the embedding-store entry's one float16 file (EmbeddingStore.put_file): one copy on
disk. An import that already is that file (one float16 .npy whose rows are in corpus order) is
shared with the entry by a hard link instead: no copy at all.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.intake.import_ids import IdStream
from models.bundle.storage.docstore import DocstoreWriter
from models.embeddings.store import EmbeddingStore
from models.errors import InputError
from models.hashing import sha256_file

log = logging.getLogger(__name__)

NORM_TOLERANCE = 1e-2  # float16 storage of unit vectors is accurate to ~1e-3
CHUNK_ROWS = 8192
COPY_BYTES = 1 << 24


@dataclass(frozen=True)
class ImportSpec:
    path: Path
    ids: Path | None = None
    id_column: str = "id"
    vector_column: str = "vector"


def _files(path: Path, suffix: str) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == suffix and p.is_file())
        if not files:
            raise InputError(f"{path}: no {suffix} files in this directory")
        return files
    if not path.is_file():
        raise InputError(f"{path}: no such file or directory")
    return [path]


def is_parquet(path: Path) -> bool:
    if path.is_dir():
        return any(p.suffix == ".parquet" for p in path.iterdir())
    return path.suffix == ".parquet"


def source_digest(spec: ImportSpec) -> str:
    """sha256 of the import: of the file, or of the names and digests of a directory's files."""
    path = Path(spec.path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for f in _files(path, ".parquet" if is_parquet(path) else ".npy"):
        digest.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return digest.hexdigest()


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    try:
        with path.open("rb") as fh:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(fh)
            offset = fh.tell()
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable .npy array ({exc})") from exc
    if fortran or dtype.hasobject:
        raise InputError(f"{path}: expected a C-ordered numeric array")
    return shape, dtype, offset


def _npy_chunks(spec: ImportSpec, dim: int) -> Iterator[tuple[str, int, list[str], np.ndarray]]:
    """(file, first row in that file, ids, vectors) chunks of .npy files read with plain reads (no mmap), the ids
    streamed from their file alongside (indexer.intake.import_ids: never the whole list in memory)."""
    if spec.ids is None:
        raise InputError("--embeddings as .npy needs --ids (a JSON list of document ids, one per row)")
    files = _files(Path(spec.path), ".npy")
    headers = [_npy_header(f) for f in files]
    for f, (shape, _, _) in zip(files, headers, strict=True):
        if len(shape) != 2 or shape[1] != dim:
            raise InputError(f"{f}: shape {shape}, expected [n, {dim}] for this teacher")
    total = sum(h[0][0] for h in headers)
    where = spec.path if len(files) == 1 else f"{spec.path} ({len(files)} files)"
    with IdStream(spec.ids) as stream:
        for f, (shape, dtype, offset) in zip(files, headers, strict=True):
            with f.open("rb") as fh:
                fh.seek(offset)
                for start in range(0, shape[0], CHUNK_ROWS):
                    n = min(CHUNK_ROWS, shape[0] - start)
                    ids = stream.take(n)
                    if len(ids) < n:
                        raise InputError(f"{where}: {total} rows but {spec.ids} lists {stream.count} ids")
                    rows = np.fromfile(fh, dtype=dtype, count=n * dim).reshape(n, dim)
                    yield str(f), start, ids, rows
        if extra := stream.rest():
            raise InputError(f"{where}: {total} rows but {spec.ids} lists {stream.count} ids ({extra} more ids "
                             "than rows)")


def _parquet_chunks(spec: ImportSpec, dim: int) -> Iterator[tuple[str, int, list[str], np.ndarray]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for f in _files(Path(spec.path), ".parquet"):
        try:
            pf = pq.ParquetFile(f)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{f}: not a readable Parquet file ({exc})") from exc
        names = pf.schema_arrow.names
        for column in (spec.id_column, spec.vector_column):
            if column not in names:
                raise InputError(f"{f}: no column {column!r} (columns: {', '.join(names)}); "
                                 "see --id-column / --vector-column")
        start = 0
        for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=[spec.id_column, spec.vector_column]):
            ids = [str(i) for i in batch.column(0).to_pylist()]
            vectors = batch.column(1)
            if not pa.types.is_list(vectors.type) and not pa.types.is_fixed_size_list(vectors.type) \
                    and not pa.types.is_large_list(vectors.type):
                raise InputError(f"{f}: column {spec.vector_column!r} is {vectors.type}, expected a list of floats")
            if vectors.null_count:
                raise InputError(f"{f}: row {start + vectors.is_null().index(True).as_py()} has no vector")
            lengths = np.asarray(vectors.value_lengths()) if not pa.types.is_fixed_size_list(vectors.type) \
                else np.full(len(vectors), vectors.type.list_size)
            if (lengths != dim).any():
                bad = int(np.argmax(lengths != dim))
                raise InputError(f"{f}: row {start + bad} has a {lengths[bad]}-d vector, expected {dim} for this "
                                 "teacher (shape)")
            flat = np.asarray(vectors.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
            yield str(f), start, ids, flat.reshape(len(ids), dim)
            start += len(ids)


def _check_rows(where: str, first: int, ids: list[str], rows: np.ndarray) -> None:
    bad = ~np.isfinite(rows).all(axis=1)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"{where}: row {first + i} (doc {ids[i]!r}) has non-finite values")
    norms = np.linalg.norm(rows.astype(np.float32), axis=1)
    off = np.abs(norms - 1.0) > NORM_TOLERANCE
    if off.any():
        i = int(np.argmax(off))
        raise InputError(f"{where}: vectors must be L2-normalized; doc {ids[i]!r} (row {first + i}) "
                         f"has norm {norms[i]:.4f}")


def import_into(spec: ImportSpec, docstore: DocstoreWriter, count: int, dim: int, store: EmbeddingStore, key: str,
                meta: dict) -> None:
    """Check the import against the corpus in `docstore` and store it as entry `key`, in corpus order.

    Memory holds one chunk and a position per document. While every chunk lands on its own rows, a shareable
    import (`_shareable`) is only read; the first chunk that does not copies the rows so far and scatters on.
    """
    shared = _shareable(spec, dim)
    store.put_file(key, count, meta, lambda scratch: _scatter_checked(spec, docstore, count, dim, scratch, shared))


def _shareable(spec: ImportSpec, dim: int) -> Path | None:
    """The import file if it could be the store's file as it is: one C-ordered float16 [n, dim] .npy."""
    path = Path(spec.path)
    if not path.is_file() or path.suffix != ".npy":
        return None
    shape, dtype, _ = _npy_header(path)
    return path.resolve() if dtype == np.dtype(np.float16) and len(shape) == 2 and shape[1] == dim else None


def _scatter_checked(spec: ImportSpec, docstore: DocstoreWriter, count: int, dim: int, scratch: Path,
                     shared: Path | None) -> Path:
    """Check every row and write it at its corpus row of `scratch` (a float16 .npy); return `shared` instead if
    its rows turned out to be in corpus order already (nothing written)."""
    chunks = _parquet_chunks(spec, dim) if is_parquet(Path(spec.path)) else _npy_chunks(spec, dim)
    where_ids = str(spec.ids) if spec.ids is not None and not is_parquet(Path(spec.path)) else None
    first_seen = np.full(count, -1, dtype=np.int64)  # import position of each corpus row's vector
    row_bytes = dim * 2
    in_order = shared is not None
    out: _DataFile | None = None
    try:
        position = 0
        for where, first, ids, rows in chunks:
            _check_rows(where, first, ids, rows)
            found = docstore.rows_of(ids)
            stranger = [i for i in ids if i not in found]
            if stranger:
                raise InputError(f"{where_ids or where}: ids not in the corpus, e.g. {stranger[:3]} "
                                 "(every corpus id needs exactly one embedding)")
            target = np.fromiter((found[i] for i in ids), dtype=np.int64, count=len(ids))
            _claim(first_seen, target, position, ids, where_ids or where)
            if in_order and np.array_equal(target, np.arange(position, position + len(ids))):
                position += len(ids)
                continue
            if out is None:
                out = _DataFile(scratch, count, dim)
            if in_order:
                assert shared is not None
                log.info("%s: rows leave corpus order at row %d; writing the store's own copy", shared, position)
                out.copy_prefix(shared, position * row_bytes)
                in_order = False
            _scatter(out.fd, target, rows.astype(np.float16), row_bytes, out.base)
            position += len(ids)
        missing = np.flatnonzero(first_seen < 0)
        if len(missing):
            examples = docstore.ids_at(missing[:3].tolist())
            raise InputError(f"{where_ids or spec.path}: {len(missing)} corpus ids have no embedding "
                             f"(e.g. {examples})")
        if in_order:
            assert shared is not None
            return shared
        if out is None:
            out = _DataFile(scratch, count, dim)
        os.fsync(out.fd)
        return scratch
    finally:
        if out is not None:
            os.close(out.fd)


class _DataFile:
    """A float16 [count, dim] .npy opened for writing rows at their offsets (np.lib.format writes its header)."""

    def __init__(self, path: Path, count: int, dim: int) -> None:
        with path.open("wb") as fh:
            np.lib.format.write_array_header_2_0(fh, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)),
                                                      "fortran_order": False, "shape": (count, dim)})
            self.base = fh.tell()
            fh.truncate(self.base + count * dim * 2)  # sparse until written
        self.fd = os.open(path, os.O_RDWR)

    def copy_prefix(self, source: Path, length: int) -> None:
        """Copy the first `length` data bytes of the .npy `source` (same dtype and row size) to the same rows."""
        _, _, offset = _npy_header(source)
        with source.open("rb") as fh:
            done = 0
            while done < length:
                block = os.pread(fh.fileno(), min(COPY_BYTES, length - done), offset + done)
                if not block:
                    raise InputError(f"{source}: ends before its header's shape says it does")
                os.pwrite(self.fd, block, self.base + done)
                done += len(block)


def _claim(first_seen: np.ndarray, target: np.ndarray, position: int, ids: list[str], where: str) -> None:
    """Record the import position of each row; a row claimed twice is a duplicate id."""
    order = np.argsort(target, kind="stable")
    repeats = np.flatnonzero(np.diff(target[order]) == 0)
    if len(repeats):
        a, b = order[repeats[0]], order[repeats[0] + 1]
        raise InputError(f"{where}: duplicate id {ids[b]!r} at positions {position + a} and {position + b}")
    taken = first_seen[target] >= 0
    if taken.any():
        i = int(np.argmax(taken))
        raise InputError(f"{where}: duplicate id {ids[i]!r} at positions {first_seen[target[i]]} and {position + i}")
    first_seen[target] = position + np.arange(len(target))


def _scatter(fd: int, target: np.ndarray, rows: np.ndarray, row_bytes: int, base: int) -> None:
    """pwrite each run of consecutive corpus rows at once (one call per chunk when the order matches)."""
    order = np.argsort(target, kind="stable")
    target, rows = target[order], rows[order]
    breaks = np.flatnonzero(np.diff(target) != 1) + 1
    for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(target)], strict=True):
        os.pwrite(fd, rows[lo:hi].tobytes(), base + int(target[lo]) * row_bytes)
