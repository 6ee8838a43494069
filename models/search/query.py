"""A bundle's search, from query vectors and texts to documents: one search in any mode (dense, lexical or
hybrid), with filters, pagination and a score floor, down to each segment's index (`search`), and the unfiltered
dense top-k that evaluation, warm-up and tests ask of a bundle (`dense_hits`). The query is rotated into the
version's basis once (models.bundle.vectors.space), then each segment's `VectorIndex` (models.bundle.vectors.index) runs
the FAISS search, the binary rescoring and the exact pass; this module plans, merges and fetches the documents,
and touches no FAISS object.

A version may be made of several segments (models.bundle.version): each is searched with the request's options and
its best are merged (`merge`), so a hit's row counts across the version; `documents` reads each hit from its
segment's docstore. A filter becomes the rows it allows once per search and segment (`allowed_rows`: the
segment's payload index, models.bundle.payload.index, or the docstore's SQL for older bundles), less the segment's
deleted rows (its tombstones, which without a filter are the rows it leaves out), and both sides search only
those rows, so a page fills whenever enough documents match:
- dense: as models.search.planner chooses from their count, an exact pass over the allowed rows' stored
  vectors (few), or the index's search with a FAISS ID selector over their bitmap (many), widened for HNSW
  and IVF; an approximate index that still comes back short falls back to the exact pass;
- lexical: BM25 scores of the allowed rows only.

Binary indexes rank by Hamming distance first; the top `k × oversample` are rescored with the
float query against the int8 vectors (memory-mapped from disk).

A search with a deadline (`SearchOptions.deadline`) checks it before each segment's filter, dense and BM25 pass,
between the chunks of stored vectors a dense pass scores, and before fetching documents, and stops with
DeadlineExceeded past it, so its worker is free again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from models.bundle.legacy import has_payload_index
from models.bundle.lexical.postings import Lexical, LexicalStats
from models.bundle.manifest import FusionMethod, FusionSpec
from models.bundle.storage.rows import Allowed, row_mask
from models.bundle.vectors.index import DEFAULT_OVERSAMPLE, VectorIndex
from models.bundle.version import NoLexicalIndex
from models.corpus import Document
from models.errors import DeadlineExceeded
from models.search.filters import MAX_SQL_LEVELS, Filter, sql_levels, sql_of, tagged
from models.search.fusion import fuse
from models.search.planner import Planner

if TYPE_CHECKING:
    from models.bundle.storage.docstore import DocStore
    from models.bundle.version import Bundle, Segment

@dataclass(frozen=True)
class Hit:
    row: int
    score: float
    doc: Document


class Mode(StrEnum):
    DENSE = "dense"
    LEXICAL = "lexical"
    HYBRID = "hybrid"


@dataclass(frozen=True, eq=False)
class SearchOptions:
    """What a request asks beyond its queries; hashable, so the batcher groups equal options.

    Equal means equal in value and in type (`key`): requests whose options are equal share one search and each get
    their queries' part of its answer, so options that could answer differently must never compare equal. Python's
    own equality would merge `True`, `1` and `1.0` (equal, with equal hashes) wherever they sit, in a filter's values
    as in `min_score`; the key tags each with its type (models.search.filters.tagged)."""

    top_k: int
    mode: Mode = Mode.DENSE
    offset: int = 0
    min_score: float | None = None
    fusion: FusionMethod | None = None  # None: the bundle's default
    alpha: float | None = None
    filter: Filter | None = None
    # time.monotonic() past which the search stops between segments and stages (`DeadlineExceeded`); not part of
    # the options' identity, so requests with different deadlines still share a search
    deadline: float | None = field(default=None, compare=False)

    @property
    def needs_vectors(self) -> bool:
        return self.mode is not Mode.LEXICAL

    @property
    def key(self) -> tuple[object, ...]:
        """Everything that changes the answer, each value tagged with its type; the deadline is left out."""
        return (tagged((self.top_k, self.mode, self.offset, self.min_score, self.fusion, self.alpha)),
                None if self.filter is None else self.filter.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SearchOptions) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


@dataclass
class Retrieved:
    hits: list[list[Hit]]
    lexical_s: float = 0.0
    filter_s: float = 0.0  # turning the filter into the rows it allows, once for the whole search


def fusion_spec(bundle: Bundle, opts: SearchOptions) -> FusionSpec:
    return fusion_of(bundle.fusion, opts)


def fusion_of(spec: FusionSpec, opts: SearchOptions) -> FusionSpec:
    """A version's fusion (its manifest's `fusion`) with the method a request asks instead, if any."""
    if opts.fusion is not None and opts.fusion is not spec.method:
        spec = spec.model_copy(update={"method": opts.fusion})
    return spec


Check = Callable[[], None]  # called between segments and stages: raises to stop a search (DeadlineExceeded)


def _unbounded() -> None:
    """The check of a search without a deadline."""


def deadline_check(deadline: float | None) -> Check:
    """A check that raises DeadlineExceeded once time.monotonic() is past `deadline` (never, for None), so a search
    that ran out of time frees its worker between two segments or stages instead of running to its end."""
    if deadline is None:
        return _unbounded

    def check() -> None:
        if time.monotonic() > deadline:
            raise DeadlineExceeded("the search ran past the request's deadline")

    return check


def allowed_rows(bundle: Bundle, flt: Filter | None, check: Check = _unbounded) -> list[Allowed | None]:
    """Per segment, the rows a search may return: those a filter allows less the segment's deleted ones, or
    without a filter its live rows (None where it has no deleted row: every row). A filter is evaluated on each
    segment's payload index, or through its docstore's SQL for a segment without one (older bundles) and for a
    key the index leaves out."""
    return list(bundle.live) if flt is None else list(_filtered_live(bundle, flt, check))


def _filtered_live(bundle: Bundle, flt: Filter, check: Check = _unbounded) -> list[Allowed]:
    """Per segment, the rows a filter allows, less the segment's deleted ones (its cached live mask)."""
    out = []
    for segment, live in zip(bundle.segments, bundle.live, strict=True):
        check()
        mask = _filtered(segment, flt)
        if live is not None:
            mask &= live.mask  # the filter's mask is this search's own; the live mask is the bundle's, left as it is
        out.append(Allowed(mask))
    return out


def _filtered(segment: Segment, flt: Filter) -> np.ndarray:
    """The mask of the segment's rows a filter allows, deleted ones included: a new array the caller owns."""
    count = segment.count
    if not has_payload_index(segment.payload):  # built before payload indexes (models.bundle.legacy)
        return docstore_mask(segment.docs, flt.tree, count)

    def from_docstore(leaf: tuple[Any, ...]) -> np.ndarray:
        return docstore_mask(segment.docs, leaf, count)

    return segment.payload.evaluate(flt.tree, from_docstore)


def docstore_mask(docs: DocStore, tree: tuple[Any, ...], count: int) -> np.ndarray:
    """The mask of the rows a filter tree allows by the docstore's SQL: one query for the whole tree, or, for a tree
    nested deeper than SQLite's parser takes (MAX_SQL_LEVELS), its halves (an and/or's items split in two) or
    the operand of its NOT, each as shallow as needs be, combined here: a leaf is 0 or 1 on every row, so NOT is
    the complement, as in SQL. Only a filter nested that deep pays for more than one scan."""
    if sql_levels(tree) <= MAX_SQL_LEVELS:
        return row_mask(docs.rows_where(*sql_of(tree)), count)
    if tree[0] == "not":
        return ~docstore_mask(docs, tree[1], count)
    op, items = tree[0], tree[1]
    if len(items) == 1:
        return docstore_mask(docs, items[0], count)
    first, second = (docstore_mask(docs, (op, part), count) for part in (items[: len(items) // 2],
                                                                      items[len(items) // 2 :]))
    return first & second if op == "and" else first | second


def matching_rows(bundle: Bundle, flt: Filter) -> np.ndarray:
    """The version rows a filter allows, ascending, deleted rows left out."""
    return np.concatenate([allowed.rows + base
                           for allowed, base in zip(_filtered_live(bundle, flt), bundle.bases, strict=True)])


def dense_candidates(bundle: Bundle, query: np.ndarray, depth: int, allowed: Sequence[Allowed | None],
                     oversample: int, planner: Planner | None = None,
                     check: Check = _unbounded, head: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top `depth` (scores, version rows) of one query vector over every segment, each restricted to its
    `allowed` rows (models.search.planner chooses how); deleted rows are never candidates. `head`: how many of
    them a binary index rescores at its own depth (VectorIndex.rescore_pool; None: all `depth`)."""
    q = bundle.space.rotate(query[None, :])
    found = []
    for segment, rows in zip(bundle.segments, allowed, strict=True):
        check()
        found.append(_segment_candidates(segment.vectors, q, depth, rows, oversample, planner or Planner(), head,
                                         check))
    return merge(found, bundle.bases, depth)


def _segment_candidates(index: VectorIndex, q: np.ndarray, depth: int, allowed: Allowed | None, oversample: int,
                        planner: Planner, head: int | None = None,
                        check: Check = _unbounded) -> tuple[np.ndarray, np.ndarray]:
    """Top `depth` (scores, segment rows) of one rotated query in one segment's index; `check` also runs between
    the chunks of stored vectors it scores (VectorIndex.scores)."""
    if allowed is not None and allowed.count == 0:
        return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
    if allowed is not None and planner.exact(index.spec.type, allowed):
        return index.exact(q, depth, allowed.rows, oversample, head, check)
    scores, rows = index.search(q, depth, oversample, allowed, planner, head, check)
    keep = rows[0] >= 0
    s, r = scores[0][keep], rows[0][keep].astype(np.int64)
    if allowed is not None and len(r) < min(depth, allowed.count):  # an approximate index came back short
        return index.exact(q, depth, allowed.rows, oversample, head, check)
    return s, r


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


def lexical_candidates(bundle: Bundle, query: str | Mapping[str, int], depth: int, allowed: Sequence[Allowed | None],
                       check: Check = _unbounded, stats: LexicalStats | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top `depth` (BM25 scores, version rows) over every segment, scored with the version's statistics. `query`:
    its text, or its distinct stems with their counts (Analyzer.terms); `stats`: the statistics to score with
    instead of the loaded segments' own (a shard scored with its whole version's, models.search.shards)."""
    index = bundle.require_lexical()
    # a segment's live rows (no filter) go as None: postings leave its deleted rows out by its mask, where the
    # rows as an array (8 bytes a document) would be built, and held by every version kept loaded, for nothing;
    # bm25s (a version of one segment built before segments) has no mask, and gets them
    masks = isinstance(index, Lexical)
    rows = [None if a is None or (masks and a is live) else a.rows
            for a, live in zip(allowed, bundle.live, strict=True)]
    if isinstance(query, str) and stats is None:
        return merge(index.search(query, depth, rows, check), bundle.bases, depth)
    if not isinstance(index, Lexical):
        raise NoLexicalIndex(f"bundle {bundle.directory.name} holds bm25s's index (built before segments), which "
                             "scores with its own statistics only: compact it with `tandem index compact`")
    terms = index.analyzer.terms(query) if isinstance(query, str) else query
    return merge(index.search_terms(terms, depth, rows, check, stats=stats), bundle.bases, depth)


def depths(bundle: Bundle, opts: SearchOptions) -> tuple[int, int]:
    """(candidates each side ranks, hits given back) of a search: offset + top_k, and a hybrid's fusion depth."""
    return depths_of(bundle.fusion, opts)


def depths_of(spec: FusionSpec, opts: SearchOptions) -> tuple[int, int]:
    """`depths` from a version's fusion (a coordinator holds the manifest, not the bundle)."""
    need = opts.offset + opts.top_k
    return (max(need, fusion_of(spec, opts).depth) if opts.mode is Mode.HYBRID else need), need


def rescore_rows(bundle: Bundle, opts: SearchOptions, queries: int, oversample: int) -> int:
    """How many stored vectors a search of `queries` queries with these options decodes to rescore binary
    candidates, at most: each query's rescoring pool in each segment (VectorIndex.rescore_rows). The service caps
    it per request (TANDEM_MAX_RESCORE_ROWS), before any work, since the pool grows with offset × oversample."""
    if not opts.needs_vectors:
        return 0
    depth, need = depths(bundle, opts)
    return queries * sum(segment.vectors.rescore_rows(depth, oversample, need) for segment in bundle.segments)


def search(bundle: Bundle, vectors: np.ndarray | None, queries: list[str], opts: SearchOptions,
           oversample: int, planner: Planner | None = None) -> Retrieved:
    """Hits for each query; `vectors` (full-dimension unit, one per query) are needed unless lexical.
    `planner`: how a filtered dense search is run (models.search.planner; default: by the index type)."""
    check = deadline_check(opts.deadline)
    began = time.perf_counter()
    allowed = allowed_rows(bundle, opts.filter, check)
    filter_s = time.perf_counter() - began if opts.filter is not None else 0.0
    depth, need = depths(bundle, opts)
    spec = fusion_spec(bundle, opts)
    lexical_s = 0.0
    out: list[list[Hit]] = []
    for i, query in enumerate(queries):
        ranked: tuple[np.ndarray, np.ndarray]
        dense = lexical = None
        if opts.mode is not Mode.LEXICAL:
            assert vectors is not None
            # the fused list gives back `need` hits: only those need the index's full rescoring depth
            dense = dense_candidates(bundle, vectors[i], depth, allowed, oversample, planner, check, head=need)
        if opts.mode is not Mode.DENSE:
            began = time.perf_counter()
            lexical = lexical_candidates(bundle, query, depth, allowed, check)
            lexical_s += time.perf_counter() - began
        if dense is not None and lexical is not None:
            ranked = fuse(dense, lexical, spec, opts.alpha)
        else:
            ranked = dense if dense is not None else lexical  # type: ignore[assignment]
        scores, rows = ranked[0][opts.offset : need], ranked[1][opts.offset : need]
        if opts.min_score is not None:
            keep = scores >= opts.min_score
            scores, rows = scores[keep], rows[keep]
        check()
        out.append(_hits(bundle, scores, rows))
    return Retrieved(out, lexical_s, filter_s)


def dense_hits(bundle: Bundle, vectors: np.ndarray, k: int, oversample: int = DEFAULT_OVERSAMPLE) -> list[list[Hit]]:
    """Dense top-k of query vectors, unfiltered (evaluation, warm-up, tests), each segment searched once for all
    of them; `search` does the rest."""
    q = bundle.space.rotate(vectors)
    per_segment: list[list[tuple[np.ndarray, np.ndarray]]] = []
    for segment, live in zip(bundle.segments, bundle.live, strict=True):
        if live is None:
            scores, rows = segment.vectors.search(q, k, oversample)
            per_segment.append([(s[r >= 0], r[r >= 0].astype(np.int64)) for s, r in zip(scores, rows, strict=True)])
        else:  # deleted rows: as a search would, query by query
            per_segment.append([_segment_candidates(segment.vectors, q[j : j + 1], k, live, oversample, Planner())
                                for j in range(len(q))])
    return [_hits(bundle, *merge([found[j] for found in per_segment], bundle.bases, k)) for j in range(len(q))]


def documents(bundle: Bundle, rows: Sequence[int] | np.ndarray) -> list[Document]:
    """The documents at these version rows, in the order asked, one docstore read per segment."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(bundle.segments) == 1:  # most versions: no segment to find for each row
        return bundle.segments[0].docs.get((rows - bundle.bases[0]).tolist())
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
