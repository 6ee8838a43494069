"""FAISS indexes for each quantization and index type: built, saved, loaded and searched here.

- float: IndexFlatIP over MRL-truncated unit vectors.
- int8: IndexScalarQuantizer(QT_8bit) whose per-dimension ranges are our calibration.
- binary: IndexBinaryFlat over sign bits, plus the int8 rescoring codes (memory-mapped when loaded). An IVF over
  binary codes keeps its codes by cell, not by row, so it also writes them by row (`codes.u8.npy`, memory-mapped):
  a filtered search's exact plan ranks the allowed rows by Hamming distance there, instead of scoring every one of
  them by its int8 vector.

Those are the flat (exact) first stages; models.bundle.vectors.first_stage also builds HNSW and IVF ones
(models.bundle.vectors.index_spec), with the same int8 calibration and the same binary rescoring. An index is scored in
its version's space (models.bundle.vectors.space: the calibration, center and spin, shared by the version's segments).

`VectorIndex` does every FAISS call a search makes: the first stage (restricted to allowed rows by an ID selector,
HNSW's efSearch widened and IVF's results over-fetched by the numbers of models.search.planner, which it is
handed as a `Widening`), the int8 rescoring of binary candidates, and the exact pass over stored vectors or sign
codes.
models.search.query asks it, and never touches a FAISS object.

Scoring stored vectors (the int8 rescoring of binary candidates, and the exact pass) decodes them to float32
`chunk_rows` at a time (about RESCORE_CHUNK_BYTES of float32), keeping only a float32 score per row, and calls the
search's check (its deadline) between chunks: a search deep in its pages (offset 9,000 with top_k 1,000 at ×64 is
640,000 rows, 2.5 GB of float32 at 1,024 dimensions) holds a chunk, not the pool, and stops when its time is up.
The answer is the same, bit for bit, as one array's (CHUNK_ALIGN).
"""

from __future__ import annotations

import errno
import mmap
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, cast

import faiss
import numpy as np

from models.bundle.storage.prefetch import prefetch
from models.bundle.storage.row_file import PreadRows, drop_ranges, mapped_ranges
from models.bundle.storage.rows import Allowed
from models.bundle.storage.top_k import top_k
from models.bundle.vectors.first_stage import (
    apply_search_params,
    build_first_stage,
    empty_first_stage,
    first_stage_codes,
    hamming_top,
    stored_codes,
    train_step,
)
from models.bundle.vectors.index_spec import IndexSpec, IndexType, Quantization
from models.bundle.vectors.quantize import int8_decode, int8_encode
from models.bundle.vectors.space import Space
from models.contract import truncate
from models.timing import StageObserver

INDEX_FILE = "index.faiss"
RESCORE_FILE = "rescore.u8.npy"
FILL_ROWS = 1 << 18  # rows of codes read back at a time when an IVF's lists are filled
ROW_CODES_FILE = "codes.u8.npy"  # an IVF's sign codes in row order (binary IVF only)
DEFAULT_OVERSAMPLE = 4
EXACT_CHUNK = 65_536  # rows whose sign codes are ranked at a time in the exact pass (dim / 8 bytes each)
RESCORE_CHUNK_BYTES = 4 << 20  # float32 decoded at a time when stored vectors are scored (rescoring, exact pass)
# ... in a whole number of these rows (so at least this many): OpenBLAS's sgemv works through a matrix's rows in
# blocks, and a chunk of a multiple of 1,024 rows gives each row the bits the single array gives it (one BLAS thread,
# the service's default search_threads: with more, even one array's scores depend on how OpenBLAS splits it)
CHUNK_ALIGN = 1024


def chunk_rows(dim: int) -> int:
    """Rows of `dim` float32 scored at a time: RESCORE_CHUNK_BYTES of them, in whole CHUNK_ALIGN rows."""
    return max(1, RESCORE_CHUNK_BYTES // (4 * dim) // CHUNK_ALIGN) * CHUNK_ALIGN


def _never() -> None:
    """The check of a search without a deadline."""


@dataclass
class ScoredRows:
    """What scoring stored vectors has cost an index so far, counted (tests assert memory by these, never RSS):
    rows decoded, the chunks they came in, and the largest chunk."""

    rows: int = 0
    chunks: int = 0
    largest: int = 0

    def add(self, rows: int) -> None:
        self.rows, self.chunks, self.largest = self.rows + rows, self.chunks + 1, max(self.largest, rows)


def set_search_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the searches the calling thread runs: the count is per thread, so a worker
    sets it before it searches (docs/decisions.md#one-blas-thread-per-search-thread)."""
    faiss.omp_set_num_threads(threads)


class Widening(Protocol):
    """How far a search restricted to some rows over-fetches: models.search.planner.Planner's numbers."""

    def ef_search(self, ef: int, k: int, allowed: Allowed) -> int:
        """HNSW's candidate list for `k` results among `allowed`, from the index's own `ef`."""
        ...

    def fetch(self, k: int, count: int, allowed: Allowed) -> int:
        """Results to ask of an index that takes no selector (binary IVF) for `k` allowed ones."""
        ...


class VectorIndex:
    """The vectors of one segment (or of an index built in memory) at one dim and quantization, scored in a space."""

    def __init__(
        self,
        quantization: Quantization,
        dim: int,
        index: faiss.Index | faiss.IndexBinary,
        space: Space | None = None,
        rescore_codes: np.ndarray | None = None,
        spec: IndexSpec | None = None,
        row_codes: np.ndarray | None = None,
    ) -> None:
        self.quantization = quantization
        self.dim = dim
        self.spec = spec or IndexSpec()
        self.index = index
        self.space = space or Space()
        self.rescore_codes = rescore_codes
        self.row_codes = row_codes  # sign codes by row where the first stage does not keep them so (IVF)
        self.mapped_file: Path | None = None  # the first stage's file, when FAISS maps it (load(mapped=True))
        self.mapped_ranges: list[tuple[int, int]] | None = None  # its mappings' addresses (unmap_pages)
        self.observe: StageObserver | None = None  # told how long int8 rescoring took (the service's timings), when set
        # A plain attribute, not a property over index.ntotal: the index is complete when it gets here (built,
        # loaded or written whole) and never grows after.
        self.count = int(index.ntotal)
        self.chunk_rows = chunk_rows(dim)  # stored vectors decoded to float32 at a time (tests set fewer)
        self.scored = ScoredRows()

    @classmethod
    def build(
        cls, vectors: np.ndarray, dim: int, quantization: Quantization, spec: IndexSpec | None = None,
        center: bool = False, spin: bool = False,
    ) -> VectorIndex:
        """Index full-dimension unit vectors after MRL truncation to `dim` (spec: resolved, default flat), in a space
        fitted on them (models.bundle.vectors.space): binary codes are the signs of the vectors minus their mean
        (`center`), spun (`spin`)."""
        spec = spec or IndexSpec()
        space = Space.fit(len(vectors), lambda: [vectors], dim=dim, quantization=quantization, center=center,
                          spin=spin)
        x = space.project(vectors, dim)
        index = build_first_stage(x, quantization, spec, space.calibration, space.center, space.spin)
        rescore = row_codes = None
        if quantization is Quantization.BINARY and space.calibration is not None:
            rescore = int8_encode(x, space.calibration)
        if quantization is Quantization.BINARY and spec.type is IndexType.IVF:
            row_codes = first_stage_codes(x, quantization, space.center, space.spin)
        return cls(quantization, dim, index, space, rescore, spec, row_codes)

    def save(self, directory: Path, space: bool = True) -> list[str]:
        """Write the index files into `directory`; returns their names. `space=False` leaves out the space's files
        (the calibration, center and spin): a version writes its own once, for all of its segments."""
        names = [INDEX_FILE]
        try:
            if isinstance(self.index, faiss.IndexBinary):
                faiss.write_index_binary(self.index, str(directory / INDEX_FILE))
            else:
                faiss.write_index(self.index, str(directory / INDEX_FILE))
        except RuntimeError as exc:  # FAISS reports a failed write (a full disk) as a RuntimeError
            raise OSError(errno.EIO, f"cannot write the index: {str(exc).strip().splitlines()[-1]}",
                          str(directory / INDEX_FILE)) from exc
        if self.rescore_codes is not None:
            np.save(directory / RESCORE_FILE, self.rescore_codes)
            names.append(RESCORE_FILE)
        if self.row_codes is not None:
            np.save(directory / ROW_CODES_FILE, self.row_codes)
            names.append(ROW_CODES_FILE)
        return names + (self.space.save(directory) if space else [])

    @classmethod
    def load(
        cls, directory: Path, dim: int, quantization: Quantization, spec: IndexSpec | None = None,
        space: Space | None = None, mapped: bool = False,
    ) -> VectorIndex:
        """Read the first stage into RAM and memory-map the rescoring codes (binary), so RAM holds only the former.

        `space`: the version's, read once for all of its segments (models.bundle.version); None reads the
        calibration `directory` holds (an index saved on its own, without center or spin). `mapped`: map the first
        stage's file too (FAISS's IO_FLAG_MMAP_IFC), whose pages `unmap_pages` then drops: a writer's agreement
        sample, which searches a version as large as the corpus inside the build's memory bound."""
        spec = spec or IndexSpec()
        if space is None:
            space = Space.read(directory, dim=dim, quantization=quantization)
        path = str(directory / INDEX_FILE)
        flags = faiss.IO_FLAG_MMAP_IFC if mapped else 0
        if quantization is Quantization.BINARY:
            index: faiss.Index | faiss.IndexBinary = faiss.read_index_binary(path, flags)
            rescore = np.load(directory / RESCORE_FILE, mmap_mode="r")
        else:
            index, rescore = faiss.read_index(path, flags), None
        # an IVF version written before its codes were kept by row has none: its exact plan scores int8 vectors
        row_codes = np.load(directory / ROW_CODES_FILE, mmap_mode="r") if quantization is Quantization.BINARY \
            and (directory / ROW_CODES_FILE).is_file() else None
        apply_search_params(index, spec)
        if index.d != dim:
            raise ValueError(f"{directory}: index dimension {index.d} does not match the manifest's {dim}")
        if quantization is not Quantization.FLOAT and (space.calibration is None or space.calibration.dim != dim):
            raise ValueError(f"{directory}: the space has no {dim}-d int8 calibration for a {quantization.value} index")
        if rescore is not None and rescore.shape != (index.ntotal, dim):
            raise ValueError(f"{directory}: rescore vectors have shape {rescore.shape}, expected {(index.ntotal, dim)}")
        if row_codes is not None and row_codes.shape != (index.ntotal, dim // 8):
            raise ValueError(f"{directory}: row codes have shape {row_codes.shape}, expected "
                             f"{(index.ntotal, dim // 8)}")
        prefetch([directory / name for name, mapped in ((RESCORE_FILE, rescore), (ROW_CODES_FILE, row_codes))
                  if mapped is not None])
        loaded = cls(quantization, dim, index, space, rescore, spec, row_codes)
        loaded.mapped_file = Path(path) if mapped else None
        return loaded

    def search(self, queries: np.ndarray, k: int, oversample: int = DEFAULT_OVERSAMPLE, allowed: Allowed | None = None,
               widening: Widening | None = None, head: int | None = None,
               check: Callable[[], None] = _never) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, rows) of full-dimension unit queries, already in the space's basis (Space.rotate); rows
        are -1 past the corpus size. Binary ranks by Hamming distance first, then rescores the top
        `rescore_pool(...)` with the float query against the int8 vectors.

        `allowed` restricts the search to those rows before ranking, over-fetching as `widening` says. `head`: how
        many of the k best need the index's own rescoring depth (rescore_pool; None: all k). `check` runs between
        the rescoring's chunks (the search's deadline: it raises to stop)."""
        q = np.ascontiguousarray(truncate(np.atleast_2d(queries), self.dim))
        k = max(1, min(k, self.count))
        binary = self.quantization is Quantization.BINARY
        depth = min(self.count, self.rescore_pool(k, oversample, head)) if binary else k
        params, selector, fetch = self._restricted(allowed, widening, depth)
        scores, rows = self.index.search(self.space.sign_codes(q) if binary else q, fetch, params=params)
        if allowed is not None and selector is None:  # over-fetched without a selector: keep the allowed rows
            scores, rows = _keep_allowed(scores, rows, allowed.mask, depth)
        del selector  # held until FAISS was done with it
        if not binary:
            return scores, rows
        began = time.perf_counter()
        out_scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        out_rows = np.full((len(q), k), -1, dtype=np.int64)
        for i, cand in enumerate(rows):
            top_scores, top_rows = self._rescore(q[i], cand[cand >= 0], k, check)
            out_scores[i, : len(top_rows)] = top_scores
            out_rows[i, : len(top_rows)] = top_rows
        if self.observe is not None:
            self.observe("rescore", time.perf_counter() - began)
        return out_scores, out_rows

    def rescore_pool(self, k: int, oversample: int, head: int | None = None) -> int:
        """How many Hamming candidates a binary search for the top k rescores: `oversample` per hit, and for the
        first `head` hits (all k when None) the depth the index's size needs (`spec.oversample`), if deeper.

        Why the head: that depth keeps recall@k of the hits a caller is given (×64 at 10M documents); a hybrid
        search asks for 100 dense candidates to fuse but gives back 10, and rescoring 100 × 64 rows cost it 6,400
        random reads of the int8 codes a query (docs/lab/2026-11-26-hybrid-depth.md)."""
        deep = max(oversample, self.spec.oversample or 1)
        head = k if head is None else min(head, k)
        return max(k * max(1, oversample), head * max(1, deep))

    def rescore_rows(self, k: int, oversample: int, head: int | None = None) -> int:
        """How many rows a search of this index for the top k decodes to rescore them (0: not binary): the
        rescoring pool, at most every row. What a request's cap (the service's TANDEM_MAX_RESCORE_ROWS) counts."""
        if self.quantization is not Quantization.BINARY:
            return 0
        return min(self.count, self.rescore_pool(max(1, min(k, self.count)), oversample, head))

    def hamming(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Binary only: (Hamming distances, rows) of the top k by the sign codes alone, no rescoring (what the first
        stage alone is worth: `tandem eval`'s matrix)."""
        q = np.ascontiguousarray(truncate(np.atleast_2d(queries), self.dim))
        return self.index.search(self.space.sign_codes(q), min(k, self.count))

    def exact(self, rotated: np.ndarray, depth: int, rows: np.ndarray, oversample: int,
              head: int | None = None, check: Callable[[], None] = _never) -> tuple[np.ndarray, np.ndarray]:
        """The top `depth` of `rows` (ascending) for one query in the space's basis, scored exactly, a chunk at a
        time: float and int8 by their stored vectors; binary by the Hamming distance of their sign codes, then the
        int8 rescoring of the best `rescore_pool(depth, oversample, head)`, as a flat binary index ranks them (an
        IVF's from its codes by row; one written without them scores every row by its int8 vector). `check` runs
        between chunks."""
        q = np.ascontiguousarray(truncate(rotated, self.dim), dtype=np.float32)
        pool = self.rescore_pool(depth, oversample, head)
        codes = self.codes_by_row() if self.quantization is Quantization.BINARY else None
        if codes is not None and len(rows) > pool:
            rows = np.sort(hamming_top(codes, rows, self.space.sign_codes(q), pool,
                                       EXACT_CHUNK))  # in row order: kinder to the memory-mapped int8 codes
        return top_k(self.scores(q[0], rows, check), np.asarray(rows, dtype=np.int64), depth)

    def unmap_pages(self) -> None:
        """Drop this process's mappings of the memory-mapped codes' pages (MADV_DONTNEED; they stay in the page
        cache and come back on the next read). Why: a batch of searches reads candidates all over the rescoring
        file and the kernel maps up to 16 cached pages around each one read, so a writer's 128 sample queries at
        10M would leave the whole 7.7 GB file counted in its resident set. A first stage loaded `mapped` drops its
        file's pages too: 128 queries probing an eighth of an IVF's cells each read all of it."""
        for codes in (self.rescore_codes, self.row_codes):
            mapped = getattr(codes, "_mmap", None)  # np.memmap's mapping, when memory-mapped
            if mapped is not None:
                mapped.madvise(mmap.MADV_DONTNEED)
        if self.mapped_file is not None:
            if self.mapped_ranges is None:  # FAISS mapped the file once, at the load: found once, kept while it lives
                self.mapped_ranges = mapped_ranges(self.mapped_file)
            drop_ranges(self.mapped_file, self.mapped_ranges)

    def read_rows_unmapped(self) -> PreadRows | None:
        """From now on read the rescoring rows by copying them from the file (models.bundle.storage.row_file) instead of
        through its memory map, so a search leaves nothing mapped; the reader, for the caller to close (None: no
        memory-mapped rows). A writer's agreement sample does so; the service keeps the map."""
        codes = self.rescore_codes
        if not isinstance(codes, np.memmap):
            return None
        reader = PreadRows.of(codes)
        self.rescore_codes = reader  # type: ignore[assignment]  # indexable by rows, as the map is
        return reader

    def codes_by_row(self) -> np.ndarray | None:
        """The sign codes [count, dim/8] addressable by row: the flat or HNSW first stage's own, else an IVF's file."""
        own = stored_codes(self.index)
        return own if own is not None else self.row_codes

    def reconstruct(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of `rows` as the index scores them: float or int8-decoded (binary: the rescore
        codes)."""
        if self.quantization is Quantization.BINARY:
            assert self.space.calibration is not None and self.rescore_codes is not None
            codes = self.rescore_codes
            # a memory map's rows through a plain view: np.memmap's own indexing costs more than the gather
            picked = codes.view(np.ndarray)[rows] if isinstance(codes, np.memmap) else np.asarray(codes[rows])
            return int8_decode(picked, self.space.calibration)
        typed: Any = self.index
        return np.asarray(typed.reconstruct_batch(np.ascontiguousarray(rows, dtype=np.int64)), dtype=np.float32)

    def scores(self, query: np.ndarray, rows: np.ndarray, check: Callable[[], None] = _never) -> np.ndarray:
        """The score (float32) of each of `rows` against one query in the index's dimension, their stored vectors
        decoded `chunk_rows` at a time, `check` called between chunks: memory is one chunk's, not the rows'."""
        out = np.empty(len(rows), dtype=np.float32)
        for start in range(0, len(rows), self.chunk_rows):
            if start:
                check()
            part = rows[start : start + self.chunk_rows]
            out[start : start + len(part)] = self.reconstruct(part) @ query
            self.scored.add(len(part))
        return out

    def _rescore(self, query: np.ndarray, candidates: np.ndarray, k: int,
                 check: Callable[[], None] = _never) -> tuple[np.ndarray, np.ndarray]:
        """The top k of binary candidates by the float query against their int8 vectors, best first."""
        order = np.sort(candidates)  # sorted reads are kinder to a memory-mapped file
        scores = self.scores(query, order, check)
        top = np.argsort(-scores, kind="stable")[:k]
        return scores[top], order[top]

    def _restricted(self, allowed: Allowed | None, widening: Widening | None,
                    k: int) -> tuple[faiss.SearchParameters | None, Any, int]:
        """How FAISS searches for `k` results among `allowed` rows: its search parameters (the index's own kind,
        widened for HNSW), the ID selector they hold (which the caller keeps alive while FAISS searches), and how
        many results to ask for. FAISS's IVF over binary codes takes no selector: it probes its own nprobe cells
        and over-fetches in proportion to the rows filtered out, and the caller keeps the allowed ones."""
        if allowed is None:
            return None, None, k
        if widening is None:
            raise ValueError("a search restricted to some rows needs the planner's widening")
        lib: Any = faiss  # the SWIG classes take their fields as keywords, which the stubs do not know
        typed: Any = self.index
        if hasattr(typed, "nprobe"):  # its own cells: more bought no recall (docs/lab/2026-11-26-ivf-crossover.md)
            return None, None, widening.fetch(k, self.count, allowed)
        sel = lib.IDSelectorBitmap(len(allowed.mask), lib.swig_ptr(allowed.bitmap))
        if hasattr(typed, "hnsw"):
            ef = widening.ef_search(typed.hnsw.efSearch, k, allowed)
            return lib.SearchParametersHNSW(sel=sel, efSearch=ef), sel, k
        return lib.SearchParameters(sel=sel), sel, k


def _keep_allowed(scores: np.ndarray, rows: np.ndarray, mask: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `k` allowed results of each query, in FAISS's order; -1 rows pad a short one."""
    out_scores, out_rows = np.zeros((len(rows), k), dtype=scores.dtype), np.full((len(rows), k), -1, dtype=np.int64)
    for i, (s, r) in enumerate(zip(scores, rows, strict=True)):
        keep = (r >= 0) & mask[np.maximum(r, 0)]
        kept = r[keep][:k]
        out_scores[i, : len(kept)], out_rows[i, : len(kept)] = s[keep][:k], kept
    return out_scores, out_rows


def float_vectors(directory: Path, count: int, chunk: int) -> Iterator[np.ndarray]:
    """The `count` vectors a float index file holds, `chunk` rows at a time in row order (reconstructed
    from the file as written, so the read needs no manifest check: `tandem index export`'s fallback)."""
    index = faiss.read_index(str(directory / INDEX_FILE))
    for start in range(0, count, chunk):
        yield index.reconstruct_n(start, min(chunk, count - start))


class IndexWriter:
    """Fills a bundle's first stage and its rescoring codes chunk by chunk, for builds that never hold the corpus.

    Only the first stage stays in RAM (it is what the service loads); rescoring codes go straight
    to `rescore.u8.npy`, whose header is written up front for the known row count, byte for byte
    what `np.save` writes. A flat binary first stage is a header and its codes in row order, so it is
    streamed to `index.faiss` the same way (binary_flat_header), and the build holds none of it. The
    files equal `VectorIndex.build(...).save()` on the same vectors.
    """

    def __init__(self, directory: Path, count: int, dim: int, quantization: Quantization, spec: IndexSpec,
                 space: Space) -> None:
        self.directory, self.count, self.dim = Path(directory), count, dim
        self.quantization, self.spec, self.space = quantization, spec, space
        self.index = empty_first_stage(dim, quantization, spec, space.calibration)
        self.added = 0
        self._rescore: BinaryIO | None = None
        self._codes: BinaryIO | None = None
        self._row_codes: BinaryIO | None = None
        if quantization is Quantization.BINARY and spec.type is IndexType.FLAT:
            self._codes = (self.directory / INDEX_FILE).open("wb")
            self._codes.write(binary_flat_header(dim, count))
        self._lists: np.ndarray | None = None  # binary IVF: each row's inverted list, the lists filled at finish
        if quantization is Quantization.BINARY and spec.type is IndexType.IVF:
            self._row_codes = _npy_writer(self.directory / ROW_CODES_FILE, (count, dim // 8))
            self._lists = np.zeros(count, dtype=np.int32)
        if quantization is Quantization.BINARY:
            self._rescore = _npy_writer(self.directory / RESCORE_FILE, (count, dim))

    @property
    def train_step(self) -> int | None:
        """Rows [::step] train the index (IVF); None when it needs no training."""
        return None if self.index.is_trained else train_step(self.count, self.spec)

    def train(self, chunks: Iterable[np.ndarray]) -> None:
        """Train on rows [::train_step] of the row-ordered chunks, holding only their codes (IVF: sign bits)."""
        step = self.train_step
        if step is None:
            return
        sample, seen = [], 0
        for x in chunks:
            first = (-seen) % step  # the first row of this chunk whose global index is a multiple of step
            sample.append(first_stage_codes(x[first::step], self.quantization, self.space.center, self.space.spin))
            seen += len(x)
        self.index.train(np.ascontiguousarray(np.concatenate(sample)))

    def add(self, x: np.ndarray) -> None:
        """Append MRL-truncated unit vectors (float32 [n, dim]) in row order."""
        if self.added + len(x) > self.count:
            raise ValueError(f"index writer got more than the {self.count} vectors expected")
        codes = first_stage_codes(x, self.quantization, self.space.center, self.space.spin)
        if self._codes is not None:
            self._codes.write(codes.tobytes())
        elif self._lists is not None:
            _, nearest = cast(Any, self.index).quantizer.search(codes, 1)  # what IndexBinaryIVF.add assigns
            self._lists[self.added : self.added + len(codes)] = nearest[:, 0]
        else:
            self.index.add(codes)
        if self._row_codes is not None:
            self._row_codes.write(codes.tobytes())
        if self._rescore is not None:
            assert self.space.calibration is not None
            self._rescore.write(int8_encode(x, self.space.calibration).tobytes())
        self.added += len(x)

    def finish(self) -> list[str]:
        """Write the index; returns every file name written. Its space is its version's, which the indexer writes
        once for all of the version's segments (models.bundle.vectors.space)."""
        if self.added != self.count:
            raise ValueError(f"index writer got {self.added} vectors, expected {self.count}")
        if self._rescore is not None:
            self._rescore.close()
        if self._codes is not None:
            self._codes.close()
            return [INDEX_FILE, RESCORE_FILE]
        if self._lists is not None and self._row_codes is not None:
            self._row_codes.close()
            fill_inverted_lists(self.index, self._lists, self.directory / ROW_CODES_FILE)
        apply_search_params(self.index, self.spec)
        names = VectorIndex(self.quantization, self.dim, self.index, self.space, None, self.spec).save(
            self.directory, space=False)
        if self._row_codes is not None:
            names.append(ROW_CODES_FILE)
        return names + ([RESCORE_FILE] if self._rescore is not None else [])

    def close(self) -> None:
        for fh in (self._rescore, self._codes, self._row_codes):
            if fh is not None and not fh.closed:
                fh.close()


def fill_inverted_lists(index: Any, lists: np.ndarray, codes_path: Path) -> None:
    """Add every row to a trained binary IVF whose list of each row is known (`lists`, row order), the codes read
    back from the row-order codes file `codes_path`: what `index.add` of the rows in order gives, each list sized
    once, exactly. Adding chunk by chunk grows each list's buffer by doubling (the 10M build's IVF phase held
    1.42 GB for 1.04 GB of codes and ids: docs/lab/2026-11-26-build-memory.md)."""
    invlists = index.invlists
    counts = np.bincount(lists, minlength=index.nlist)
    for i in np.flatnonzero(counts).tolist():
        invlists.resize(i, int(counts[i]))
    cursor = np.zeros(index.nlist, dtype=np.int64)
    size = index.code_size
    with codes_path.open("rb") as fh:
        np.lib.format.read_magic(fh)
        np.lib.format.read_array_header_1_0(fh)
        for start in range(0, len(lists), FILL_ROWS):
            n = min(FILL_ROWS, len(lists) - start)
            codes = np.fromfile(fh, dtype=np.uint8, count=n * size)
            if len(codes) != n * size:
                raise ValueError(f"{codes_path}: ends before its {len(lists)} rows")
            part = lists[start : start + n]
            order = np.argsort(part, kind="stable")
            grouped, ids = part[order], (start + order).astype(np.int64)
            codes = np.ascontiguousarray(codes.reshape(n, size)[order])
            bounds = np.flatnonzero(np.diff(grouped)) + 1
            for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), n], strict=True):
                i = int(grouped[lo])
                invlists.update_entries(i, int(cursor[i]), hi - lo, faiss.swig_ptr(ids[lo:hi]),
                                        faiss.swig_ptr(codes[lo:hi]))
                cursor[i] += hi - lo
    index.ntotal = len(lists)


def _npy_writer(path: Path, shape: tuple[int, int]) -> BinaryIO:
    """A uint8 .npy of `shape` opened for its rows to be appended in order: the header `np.save` writes, up front."""
    fh = path.open("wb")
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(fh, header)
    return fh


def binary_flat_header(dim: int, count: int) -> bytes:
    """What FAISS writes before the codes of an IndexBinaryFlat of `count` rows: its own serialization of an empty
    one (fourcc, d, code_size, ntotal, is_trained, metric, the codes' length), with ntotal and that length set."""
    empty = faiss.serialize_index_binary(faiss.IndexBinaryFlat(dim)).tobytes()
    size = count * (dim // 8)
    # ntotal (int64) follows the fourcc and two int32s; the codes' byte length (uint64) ends the empty file
    return empty[:12] + np.int64(count).tobytes() + empty[20:-8] + np.uint64(size).tobytes()
