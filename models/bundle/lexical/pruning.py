"""Exact top-k BM25 over one segment without scoring every posting: MaxScore over per-term upper bounds.

An exhaustive search scores every posting of every query stem into an array of the segment's size and ranks all of
it: at 10M documents a common stem holds millions of rows, so a query cost O(segment) + O(longest list). Here each
stem's contribution is bounded from above (its idf, its largest tf and the shortest document among its rows: BM25's
tf/(tf + k1·(1−b+b·len/avg)) rises with tf and falls with len, so the bound holds for any average length, and thus
for every version the segment belongs to). Stems are taken by descending bound (the rare ones first): their lists are
read whole ("essential") until the bounds of the stems left sum below θ, a score that k real documents reach (the
k-th best exact score among the best partial candidates). A row in none of the essential lists cannot then reach the
top k, so the remaining (long, low-idf) lists are only probed, by binary search on their ascending rows, for the
candidates still able to reach θ. The survivors are scored exactly as the exhaustive search scores them (the same
float32 arithmetic, stems in the query's order) and ranked by `top_k`, so hits, scores and ties are the same
(docs/decisions.md#bm25-maxscore-pruning); `exhaustive_top_k` is that reference search, kept for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from models.bundle.storage.top_k import top_k

MARGIN = 1 + 1e-4  # bounds and partial sums are float64 sums of float32 terms: far wider than their rounding
SMALL = 50_000  # below this many postings in a segment, scoring all of them is cheaper than planning
SEED = 128  # at least this many best partial candidates are scored exactly to set θ


@dataclass(frozen=True)
class QueryTerm:
    """One query stem in one segment: its idf, its count in the query, its postings and what bounds its score."""

    weight: float
    count: np.float32
    rows: np.ndarray  # int32, ascending
    tf: np.ndarray  # float32
    max_tf: float
    min_length: int


@dataclass(frozen=True)
class Scorer:
    """BM25's per-posting arithmetic with one version's average length."""

    lengths: np.ndarray
    k1: float
    b: float
    avg_length: float

    def score(self, term: QueryTerm, at: np.ndarray | slice) -> np.ndarray:
        """The float32 score of `term` at positions `at` of its postings, computed as bm25s does (each term in float64
        from a float32 idf, rounded to float32; a repeated stem's score times its count)."""
        rows, tf = term.rows[at], term.tf[at]
        norm = self.k1 * ((1 - self.b) + self.b * np.asarray(self.lengths[rows], dtype=np.float64) / self.avg_length)
        s = (np.float64(np.float32(term.weight)) * (tf / (norm + tf))).astype(np.float32)
        return s if term.count == 1 else s * term.count

    def bound(self, term: QueryTerm) -> float:
        """An upper bound of the term's score on any of its rows."""
        norm = self.k1 * ((1 - self.b) + self.b * term.min_length / self.avg_length)
        return float(np.float32(term.weight)) * term.max_tf / (norm + term.max_tf) * float(term.count) * MARGIN


Keep = Callable[[np.ndarray], np.ndarray]  # rows → bool mask of the rows a search may return


def keeper(deleted: np.ndarray | None, allowed: np.ndarray | None) -> Keep:
    """The rows a search may return: `allowed` ones (ascending) if given, and never deleted ones."""
    def keep(rows: np.ndarray) -> np.ndarray:
        mask = np.ones(len(rows), dtype=bool) if deleted is None else ~deleted[rows]
        if allowed is not None:
            pos = np.minimum(np.searchsorted(allowed, rows), max(0, len(allowed) - 1))
            mask &= allowed[pos] == rows if len(allowed) else False
        return mask
    return keep


def _probe(term: QueryTerm, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask of `rows` the term holds, their positions in its postings)."""
    pos = np.searchsorted(term.rows, rows)
    inside = pos < len(term.rows)
    found = np.zeros(len(rows), dtype=bool)
    found[inside] = term.rows[pos[inside]] == rows[inside]
    return found, pos[found]


def exact_scores(terms: Sequence[QueryTerm], scorer: Scorer, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """The exhaustive search's float32 scores of `rows` (summed in the query's order), and the postings read."""
    scores = np.zeros(len(rows), dtype=np.float32)
    read = 0
    for term in terms:
        found, pos = _probe(term, rows)
        scores[found] += scorer.score(term, pos)
        read += len(pos)
    return scores, read


def exhaustive_top_k(terms: Sequence[QueryTerm], scorer: Scorer, count: int, deleted: np.ndarray | None,
                     allowed: np.ndarray | None, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The reference: every posting scored into an array of the segment's size, then ranked (O(segment))."""
    scores = np.zeros(count, dtype=np.float32)
    for term in terms:
        scores[term.rows] += scorer.score(term, slice(None))
    read = sum(len(t.rows) for t in terms)
    if allowed is not None:
        rows = np.asarray(allowed, dtype=np.int64)
        return (*top_k(scores[rows], rows, k, positive=True), read)
    if deleted is not None:
        scores[deleted] = 0.0
    return (*top_k(scores, np.arange(count), k, positive=True), read)


def pruned_top_k(terms: Sequence[QueryTerm], scorer: Scorer, deleted: np.ndarray | None,
                 allowed: np.ndarray | None, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The same (scores, rows) as `exhaustive_top_k` and the postings read, reading only what can change them."""
    terms = [t for t in terms if len(t.rows)]
    if allowed is not None and np.any(allowed[1:] < allowed[:-1]):
        allowed = np.sort(allowed)
    total = sum(len(t.rows) for t in terms)
    if not terms or k <= 0:
        return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64), 0
    if allowed is not None and len(allowed) <= total:  # a narrow filter: score its rows, nothing else
        rows = np.asarray(allowed, dtype=np.int64)
        scores, read = exact_scores(terms, scorer, rows)
        return (*top_k(scores, rows, k, positive=True), read)
    keep = keeper(deleted, allowed)
    if total <= SMALL or len(terms) == 1:
        return _touched_top_k(terms, scorer, keep, k)
    return _maxscore(terms, scorer, keep, k)


def _touched_top_k(terms: Sequence[QueryTerm], scorer: Scorer, keep: Keep,
                   k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Every posting scored, over the rows they touch only (no array of the segment's size)."""
    everything = np.concatenate([t.rows for t in terms])
    if len(terms) == 1:  # one stem's rows are distinct and ascending already
        rows, inverse = everything, np.arange(len(everything))
    else:
        rows, inverse = np.unique(everything, return_inverse=True)
    scores = np.zeros(len(rows), dtype=np.float32)
    start = 0
    for term in terms:  # a stem's rows are distinct, so each += adds once per row, in the query's order
        scores[inverse[start:start + len(term.rows)]] += scorer.score(term, slice(None))
        start += len(term.rows)
    mask = keep(rows)
    return (*top_k(scores[mask], rows[mask].astype(np.int64), k, positive=True), len(everything))


def _maxscore(terms: Sequence[QueryTerm], scorer: Scorer, keep: Keep,
              k: int) -> tuple[np.ndarray, np.ndarray, int]:
    bounds = [scorer.bound(t) for t in terms]
    order = sorted(range(len(terms)), key=lambda i: -bounds[i])
    rest = np.concatenate([np.cumsum([bounds[i] for i in order][::-1])[::-1], [0.0]])  # rest[j]: bounds of order[j:]
    candidates, partial = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    theta, read, j = 0.0, 0, 0
    while j < len(order):  # the essential lists, read whole
        term = terms[order[j]]
        read += len(term.rows)
        at = np.flatnonzero(keep(term.rows))
        score = scorer.score(term, at).astype(np.float64)
        rows = term.rows[at].astype(np.int64)
        found, pos = _probe(term, candidates)
        partial[found] += scorer.score(term, pos)
        fresh = np.ones(len(rows), dtype=bool)
        fresh[np.searchsorted(at, pos)] = False  # positions `pos` are among `at`: the candidates hold them
        candidates, partial = np.concatenate([candidates, rows[fresh]]), np.concatenate([partial, score[fresh]])
        j += 1
        seed = min(len(candidates), max(SEED, 2 * k))
        if seed >= k:
            best = np.argpartition(-partial, seed - 1)[:seed] if seed < len(candidates) else slice(None)
            exact, probed = exact_scores(terms, scorer, candidates[best])
            read += probed
            theta = max(theta, float(np.partition(exact, len(exact) - k)[len(exact) - k]))
        alive = partial + rest[j] >= theta / MARGIN
        candidates, partial = candidates[alive], partial[alive]
        if rest[j] < theta / MARGIN:
            break
    for jj in range(j, len(order)):  # the other lists, probed for the candidates that can still reach θ
        alive = partial + rest[jj] >= theta / MARGIN
        candidates, partial = candidates[alive], partial[alive]
        term = terms[order[jj]]
        found, pos = _probe(term, candidates)
        partial[found] += scorer.score(term, pos)
        read += len(pos)
    candidates = candidates[partial >= theta / MARGIN]
    scores, probed = exact_scores(terms, scorer, candidates)
    return (*top_k(scores, candidates, k, positive=True), read + probed)
