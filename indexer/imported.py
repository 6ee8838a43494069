"""Importing teacher embeddings computed elsewhere (a GPU job, a Spark or Ray pipeline).

Accepted: one `.npy` file or a directory of `.npy` shards (rows in file-name order) with `--ids`
naming each row's document; or Parquet files (one, or a directory) with an id column and a
vector column. They are streamed chunk by chunk and checked before anything trusts them: shape,
finiteness, unit norm and exact id coverage of the corpus. Rows are scattered into corpus order
through a temporary float16 file beside the embedding store, then stored as its shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.bundle.docstore import DocstoreWriter
from models.encoders.registry import sha256_file
from models.errors import InputError

log = logging.getLogger(__name__)

NORM_TOLERANCE = 1e-2  # float16 storage of unit vectors is accurate to ~1e-3
CHUNK_ROWS = 8192


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


def _read_ids(path: Path) -> list[str]:
    try:
        ids = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable JSON list of ids ({exc})") from exc
    if not isinstance(ids, list) or not all(isinstance(i, str | int) and not isinstance(i, bool) for i in ids):
        raise InputError(f"{path}: expected a JSON list of document ids")
    return [str(i) for i in ids]


def _npy_chunks(spec: ImportSpec, dim: int) -> Iterator[tuple[str, int, list[str], np.ndarray]]:
    """(file, first row in that file, ids, vectors) chunks of .npy files read with plain reads (no mmap)."""
    if spec.ids is None:
        raise InputError("--embeddings as .npy needs --ids (a JSON list of document ids, one per row)")
    files = _files(Path(spec.path), ".npy")
    headers = [_npy_header(f) for f in files]
    for f, (shape, _, _) in zip(files, headers, strict=True):
        if len(shape) != 2 or shape[1] != dim:
            raise InputError(f"{f}: shape {shape}, expected [n, {dim}] for this teacher")
    ids = _read_ids(spec.ids)
    total = sum(h[0][0] for h in headers)
    if total != len(ids):
        where = spec.path if len(files) == 1 else f"{spec.path} ({len(files)} files)"
        raise InputError(f"{where}: {total} rows but {spec.ids} lists {len(ids)} ids")
    position = 0
    for f, (shape, dtype, offset) in zip(files, headers, strict=True):
        with f.open("rb") as fh:
            fh.seek(offset)
            for start in range(0, shape[0], CHUNK_ROWS):
                n = min(CHUNK_ROWS, shape[0] - start)
                rows = np.fromfile(fh, dtype=dtype, count=n * dim).reshape(n, dim)
                yield str(f), start, ids[position : position + n], rows
                position += n


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


@contextlib.contextmanager
def scatter_import(spec: ImportSpec, docstore: DocstoreWriter, count: int, dim: int,
                   scratch: Path) -> Iterator[Iterator[np.ndarray]]:
    """Check the import against the corpus in `docstore`; yield its vectors in corpus order, chunk by chunk.

    The rows are written at their corpus positions into a float16 scratch file in `scratch`
    (removed afterwards), so memory holds one chunk and a position per document.
    """
    chunks = _parquet_chunks(spec, dim) if is_parquet(Path(spec.path)) else _npy_chunks(spec, dim)
    where_ids = str(spec.ids) if spec.ids is not None and not is_parquet(Path(spec.path)) else None
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = scratch / f".import-{uuid.uuid4().hex[:8]}.f16"
    first_seen = np.full(count, -1, dtype=np.int64)  # import position of each corpus row's vector
    row_bytes = dim * 2
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, count * row_bytes)
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
                _scatter(fd, target, rows.astype(np.float16), row_bytes)
                position += len(ids)
            missing = np.flatnonzero(first_seen < 0)
            if len(missing):
                examples = docstore.ids_at(missing[:3].tolist())
                raise InputError(f"{where_ids or spec.path}: {len(missing)} corpus ids have no embedding "
                                 f"(e.g. {examples})")
        finally:
            os.close(fd)
        del first_seen
        yield _read_scratch(tmp, count, dim)
    finally:
        tmp.unlink(missing_ok=True)


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


def _scatter(fd: int, target: np.ndarray, rows: np.ndarray, row_bytes: int) -> None:
    """pwrite each run of consecutive corpus rows at once (one call per chunk when the order matches)."""
    order = np.argsort(target, kind="stable")
    target, rows = target[order], rows[order]
    breaks = np.flatnonzero(np.diff(target) != 1) + 1
    for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(target)], strict=True):
        os.pwrite(fd, rows[lo:hi].tobytes(), int(target[lo]) * row_bytes)


def _read_scratch(tmp: Path, count: int, dim: int) -> Iterator[np.ndarray]:
    with tmp.open("rb") as fh:
        for start in range(0, count, CHUNK_ROWS):
            n = min(CHUNK_ROWS, count - start)
            yield np.fromfile(fh, dtype=np.float16, count=n * dim).reshape(n, dim)
