"""A bundle's search, from query vectors and texts to documents: one search in any mode (dense, lexical or
hybrid), with filters, pagination and a score floor, down to the FAISS calls (`search`), and the unfiltered
dense top-k that evaluation, warm-up and tests ask of a bundle (`dense_hits`). Rotating the query into
the bundle's basis, the FAISS search and the binary rescoring live in this module, so a dense query on a
float bundle runs here, in models.contract (MRL truncation) and in the docstore that fetches its documents
(binary adds the sign codes of models.search.first_stage and the codecs of models.search.quantize);
models.search.vector_index builds, saves and loads the indexes.

Filters restrict both sides before ranking, so a page fills whenever enough documents match:
- dense: a FAISS ID selector on the first stage, or, when the filter is very selective (or an
  approximate index returned short), an exact pass over the matching rows' vectors;
- lexical: BM25 scores of the matching rows only.

Binary indexes rank by Hamming distance first; the top `k × oversample` are rescored with the
float query against the int8 vectors (memory-mapped from disk).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import faiss
import numpy as np

from models.contract import truncate
from models.corpus import Document
from models.index_spec import Quantization
from models.manifest import FusionMethod, FusionSpec
from models.search.filters import Filter
from models.search.first_stage import sign_codes
from models.search.fusion import fuse
from models.search.lexical import top_k
from models.search.quantize import int8_decode
from models.search.vector_index import DEFAULT_OVERSAMPLE, VectorIndex

if TYPE_CHECKING:
    from models.bundle import Bundle

BRUTE_FORCE_ROWS = 2048  # at most this many matching rows (or BRUTE_FORCE_SHARE of the corpus): exact pass
BRUTE_FORCE_SHARE = 0.01
BRUTE_FORCE_CHUNK = 65_536  # rows scored at a time in the exact pass
Allowed = Sequence[np.ndarray | None]  # per segment: the rows a search may return (ascending), None for every live



def set_search_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the searches the calling thread runs: the count is per thread, so a worker
    sets it before it searches (docs/decisions.md#one-blas-thread-per-search-thread)."""
    faiss.omp_set_num_threads(threads)


@dataclass(frozen=True)
class Hit:
    row: int
    score: float
    doc: Document


class Mode(StrEnum):
    DENSE = "dense"
    LEXICAL = "lexical"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class SearchOptions:
    """What a request asks beyond its queries; hashable, so the batcher groups equal options."""

    top_k: int
    mode: Mode = Mode.DENSE
    offset: int = 0
    min_score: float | None = None
    fusion: FusionMethod | None = None  # None: the bundle's default
    alpha: float | None = None
    filter: Filter | None = None

    @property
    def needs_vectors(self) -> bool:
        return self.mode is not Mode.LEXICAL


@dataclass
class Retrieved:
    hits: list[list[Hit]]
    lexical_s: float = 0.0


def fusion_spec(bundle: Bundle, opts: SearchOptions) -> FusionSpec:
    spec = bundle.fusion
    if opts.fusion is not None and opts.fusion is not spec.method:
        spec = spec.model_copy(update={"method": opts.fusion})
    return spec


def dense_candidates(bundle: Bundle, query: np.ndarray, depth: int, allowed: Allowed,
                     oversample: int) -> tuple[np.ndarray, np.ndarray]:
    """Top `depth` (scores, version rows) of one query vector over every segment, restricted to the `allowed`
    rows of each segment when given; deleted rows are never candidates."""
    q = rotate(query[None, :], bundle.rotation)
    found = [_segment_candidates(bundle, i, q, depth, allowed[i], oversample) for i in range(len(bundle.segments))]
    return merge(found, bundle.bases, depth)


def _segment_candidates(bundle: Bundle, i: int, q: np.ndarray, depth: int, allowed: np.ndarray | None,
                        oversample: int) -> tuple[np.ndarray, np.ndarray]:
    """Top `depth` (scores, segment rows) of one rotated query in segment i."""
    index, deleted = bundle.segments[i].vectors, bundle.deleted[i]
    if allowed is not None and len(allowed) == 0:
        return _NONE
    if allowed is not None and len(allowed) <= max(BRUTE_FORCE_ROWS, BRUTE_FORCE_SHARE * index.count):
        return exact_candidates(index, q, depth, allowed)
    scores, rows = search_index(index, q, depth, oversample, allowed=allowed,
                                live=bundle.live_bits[i] if allowed is None else None)
    keep = rows[0] >= 0
    s, r = scores[0][keep], rows[0][keep].astype(np.int64)
    live = index.count - (0 if deleted is None else int(deleted.sum()))
    wanted = min(depth, live if allowed is None else len(allowed))
    if (allowed is not None or deleted is not None) and len(r) < wanted:
        # an approximate index came back short of the rows it may return: score them all
        if allowed is None:
            assert deleted is not None
            allowed = np.flatnonzero(~deleted)
        return exact_candidates(index, q, depth, allowed)
    return s, r


_NONE = (np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64))


def merge(found: Sequence[tuple[np.ndarray, np.ndarray]], bases: np.ndarray, depth: int) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """Each segment's best (scores, segment rows) as one list of the best `depth` (scores, version rows), best
    first, ties by row; a single segment's list is returned as it came."""
    if len(found) == 1:
        scores, rows = found[0]
        return scores[:depth], rows[:depth] + bases[0]
    scores = np.concatenate([s for s, _ in found]).astype(np.float32)
    rows = np.concatenate([r.astype(np.int64) + base for (_, r), base in zip(found, bases, strict=True)])
    order = np.lexsort((rows, -scores))[:depth]
    return scores[order], rows[order]


def exact_candidates(index: VectorIndex, rotated: np.ndarray, depth: int,
                     allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Score every allowed row's stored vector, a chunk at a time (bounded memory)."""
    q = np.ascontiguousarray(truncate(rotated, index.dim), dtype=np.float32)[0]
    best_s, best_r = np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
    for start in range(0, len(allowed), BRUTE_FORCE_CHUNK):
        rows = allowed[start : start + BRUTE_FORCE_CHUNK]
        scores = stored_vectors(index, rows) @ q
        best_s, best_r = top_k(np.concatenate([best_s, scores]), np.concatenate([best_r, rows]), depth)
    return best_s, best_r


def allowed_rows(bundle: Bundle, flt: Filter | None) -> Allowed:
    """Per segment, the live rows a filter lets through (ascending), or None everywhere without a filter."""
    if flt is None:
        return [None] * len(bundle.segments)
    out = []
    for segment, deleted in zip(bundle.segments, bundle.deleted, strict=True):
        rows = segment.docs.rows_where(flt.sql, flt.params)
        out.append(rows if deleted is None else rows[~deleted[rows]])
    return out


def lexical_candidates(bundle: Bundle, query: str, depth: int, allowed: Allowed) -> tuple[np.ndarray, np.ndarray]:
    """Top `depth` (BM25 scores, version rows) over every segment, scored with the version's statistics."""
    return merge(bundle.require_lexical().search(query, depth, allowed), bundle.bases, depth)


def search(bundle: Bundle, vectors: np.ndarray | None, queries: list[str], opts: SearchOptions,
           oversample: int) -> Retrieved:
    """Hits for each query; `vectors` (full-dimension unit, one per query) are needed unless lexical."""
    allowed = allowed_rows(bundle, opts.filter)
    need = opts.offset + opts.top_k
    spec = fusion_spec(bundle, opts)
    depth = max(need, spec.depth) if opts.mode is Mode.HYBRID else need
    lexical_s = 0.0
    out: list[list[Hit]] = []
    for i, query in enumerate(queries):
        ranked: tuple[np.ndarray, np.ndarray]
        dense = lexical = None
        if opts.mode is not Mode.LEXICAL:
            assert vectors is not None
            dense = dense_candidates(bundle, vectors[i], depth, allowed, oversample)
        if opts.mode is not Mode.DENSE:
            began = time.perf_counter()
            lexical = lexical_candidates(bundle, query, depth, allowed)
            lexical_s += time.perf_counter() - began
        if dense is not None and lexical is not None:
            ranked = fuse(dense, lexical, spec, opts.alpha)
        else:
            ranked = dense if dense is not None else lexical  # type: ignore[assignment]
        scores, rows = ranked[0][opts.offset : need], ranked[1][opts.offset : need]
        if opts.min_score is not None:
            keep = scores >= opts.min_score
            scores, rows = scores[keep], rows[keep]
        out.append(_hits(bundle, scores, rows))
    return Retrieved(out, lexical_s)


def dense_hits(bundle: Bundle, vectors: np.ndarray, k: int, oversample: int = DEFAULT_OVERSAMPLE) -> list[list[Hit]]:
    """Dense top-k of query vectors, unfiltered (evaluation, warm-up, tests), each segment searched once for all
    of them; `search` does the rest."""
    q = rotate(vectors, bundle.rotation)
    per_segment = [search_index(segment.vectors, q, k, oversample, live=bundle.live_bits[i])
                   for i, segment in enumerate(bundle.segments)]
    out = []
    for j in range(len(q)):
        found = [(s[j][r[j] >= 0], r[j][r[j] >= 0].astype(np.int64)) for s, r in per_segment]
        out.append(_hits(bundle, *merge(found, bundle.bases, k)))
    return out


def documents(bundle: Bundle, rows: Sequence[int] | np.ndarray) -> list[Document]:
    """The documents at these version rows, in the order asked, one docstore read per segment."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(bundle.segments) == 1:
        return bundle.segments[0].docs.get([int(r) for r in rows])
    where = np.searchsorted(bundle.bases, rows, side="right") - 1
    out: list[Document] = [None] * len(rows)  # type: ignore[list-item]
    for i in np.unique(where):
        picked = np.flatnonzero(where == i)
        found = bundle.segments[i].docs.get([int(r) for r in rows[picked] - bundle.bases[i]])
        for j, doc in zip(picked, found, strict=True):
            out[j] = doc
    return out


def _hits(bundle: Bundle, scores: np.ndarray, rows: np.ndarray) -> list[Hit]:
    """Ranked rows with their documents from the segments' docstores, one read per segment."""
    docs = documents(bundle, rows)
    return [Hit(row=int(r), score=float(s), doc=d) for r, s, d in zip(rows, scores, docs, strict=True)]


def rotate(vectors: np.ndarray, rotation: np.ndarray | None) -> np.ndarray:
    """Full-width vectors in a bundle's rotated basis (unchanged without a rotation); norms are preserved.

    The indexer rotates the documents with it (models.rotation fits the matrix), the search the queries."""
    if rotation is None:
        return vectors
    return np.asarray(vectors, dtype=np.float32) @ rotation


def search_index(index: VectorIndex, queries: np.ndarray, k: int, oversample: int = DEFAULT_OVERSAMPLE,
                 allowed: np.ndarray | None = None, live: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (scores, rows) of full-dimension unit queries in one index; rows are -1 past the corpus size.

    `allowed` (ascending rows), or else `live` (the packed bits of the rows not deleted), restricts the search
    with a FAISS ID selector, before ranking."""
    q = np.ascontiguousarray(truncate(np.atleast_2d(queries), index.dim))
    k = max(1, min(k, index.count))
    params = _selector(index, allowed, live)
    if index.quantization is not Quantization.BINARY:
        scores, rows = index.index.search(q, k, params=params)
        return scores, rows
    assert index.calibration is not None and index.rescore_codes is not None
    depth = min(index.count, k * max(1, oversample))
    codes = sign_codes(q, index.center, index.spin)
    _, candidates = index.index.search(codes, depth, params=params)
    began = time.perf_counter()
    out_scores = np.full((len(q), k), -np.inf, dtype=np.float32)
    out_rows = np.full((len(q), k), -1, dtype=np.int64)
    for i, cand in enumerate(candidates):
        cand = cand[cand >= 0]
        order = np.sort(cand)  # sorted reads are kinder to a memory-mapped file
        vecs = int8_decode(np.asarray(index.rescore_codes[order]), index.calibration)
        scores = vecs @ q[i]
        top = np.argsort(-scores, kind="stable")[:k]
        out_scores[i, : len(top)] = scores[top]
        out_rows[i, : len(top)] = order[top]
    if index.observe is not None:
        index.observe("rescore", time.perf_counter() - began)
    return out_scores, out_rows


def _selector(index: VectorIndex, allowed: np.ndarray | None, live: np.ndarray | None) -> faiss.SearchParameters | None:
    """FAISS search parameters restricting the first stage to `allowed` rows, or to the `live` bits (the index's
    own kind)."""
    lib: Any = faiss  # the SWIG classes take their fields as keywords, which the stubs do not know
    if allowed is not None:
        sel = lib.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
    elif live is not None:
        sel = lib.IDSelectorBitmap(live)
    else:
        return None
    typed: Any = index.index
    if hasattr(typed, "hnsw"):
        return lib.SearchParametersHNSW(sel=sel, efSearch=typed.hnsw.efSearch)
    if hasattr(typed, "nprobe"):
        return lib.SearchParametersIVF(sel=sel, nprobe=typed.nprobe)
    return lib.SearchParameters(sel=sel)


def stored_vectors(index: VectorIndex, rows: np.ndarray) -> np.ndarray:
    """The stored vectors of `rows` as the index scores them: float or int8-decoded (binary: the rescore codes)."""
    if index.quantization is Quantization.BINARY:
        assert index.calibration is not None and index.rescore_codes is not None
        return int8_decode(np.asarray(index.rescore_codes[rows]), index.calibration)
    typed: Any = index.index
    return np.asarray(typed.reconstruct_batch(np.ascontiguousarray(rows, dtype=np.int64)), dtype=np.float32)
