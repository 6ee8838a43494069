"""The bundle's lexical index: BM25 over the passages the teacher saw, with corpus-wide statistics.

Each segment of a bundle (models.bundle.version) keeps its own postings: for every stem, the rows that hold it and
how often, plus every row's length. Scores are computed at query time from statistics summed over the
segments' *live* rows (documents, document frequencies, average length), the way Lucene sums per-segment
statistics, so a version made of a base and updates scores exactly as a fresh build of the same documents
would (docs/decisions.md#bm25-over-segments-postings-scored-at-query-time). The formula is bm25s's Lucene
variant (k1 1.5, b 0.75), which older bundles were built with and which tests check these scores against.

Bundles built before segments hold bm25s's own index (scores precomputed with that bundle's statistics):
they still serve, as one segment, through `Bm25sIndex`.

Tokenization is ours (lowercase, bm25s's word pattern and English stopwords, PyStemmer), the same for
documents and queries: bm25s's own Tokenizer caches every word a query ever used, which a service must not do.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from models.bundle.lexical.info import LEXICAL_SUBDIRECTORY, LexicalInfo
from models.bundle.lexical.pruning import QueryTerm, Scorer, exhaustive_top_k, pruned_top_k
from models.bundle.storage.dictionary import RUN_STRINGS, Dictionary, RunDictionary
from models.bundle.storage.docstore import DocStore
from models.bundle.storage.spill import CodeSpill, new_array, release, save_array
from models.bundle.storage.top_k import top_k

log = logging.getLogger(__name__)
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG on import

LEXICAL_DIR = LEXICAL_SUBDIRECTORY
READ_CHUNK = 10_000
_WORD = re.compile(r"(?u)\b\w\w+\b")
_STOPWORDS = frozenset(STOPWORDS_EN)
_EMPTY = ""  # the token of a passage with no word left, so every document has a length of at least 1

TERMS_FILE = "terms.bin"  # the stems, UTF-8, sorted, concatenated
TERM_OFFSETS_FILE = "terms.offsets.npy"  # int64 [terms + 1]: where each stem starts in terms.bin
POSTING_OFFSETS_FILE = "postings.offsets.npy"  # int64 [terms + 1]: where each stem's postings start
POSTING_ROWS_FILE = "postings.rows.npy"  # int32: rows holding the stem, ascending per stem
POSTING_TF_FILE = "postings.tf.npy"  # float32: how often the stem occurs in that row
LENGTHS_FILE = "lengths.npy"  # int32 [rows]: stems per row (1 for a passage with none)
MAX_TF_FILE = "terms.max_tf.npy"  # float32 [terms]: each stem's largest tf (what bounds its score when pruning)
MIN_LENGTH_FILE = "terms.min_length.npy"  # int32 [terms]: the shortest row holding each stem (segments before
# these two files compute a stem's pair when a query first needs it)
POSTINGS_FILES = (TERMS_FILE, TERM_OFFSETS_FILE, POSTING_OFFSETS_FILE, POSTING_ROWS_FILE, POSTING_TF_FILE,
                  LENGTHS_FILE, MAX_TF_FILE, MIN_LENGTH_FILE)
BOUNDS_CHUNK = 1 << 22  # postings per pass when computing the bounds at build (bounded memory)


class Analyzer:
    """Text → stems. PyStemmer objects are not thread-safe, so stemming holds a lock."""

    def __init__(self, info: LexicalInfo) -> None:
        self._stemmer = Stemmer.Stemmer(info.stemmer)
        self._stopwords = _STOPWORDS if info.stopwords == "en" else frozenset()
        self._lock = threading.Lock()

    def stems(self, text: str) -> list[str]:
        words = [w for w in _WORD.findall(text.lower()) if w not in self._stopwords]
        with self._lock:
            return list(self._stemmer.stemWords(words))

    def terms(self, text: str) -> Counter[str]:
        """A query's distinct stems with how often each occurs, in the order they first occur: each is scored
        once, its score times its count (a repeated word costs nothing more)."""
        return Counter(s for s in self.stems(text) if s != _EMPTY)


def build_lexical(staging: Path, docs: DocStore, count: int, info: LexicalInfo | None = None,
                  run_stems: int = RUN_STRINGS, chunk: int = READ_CHUNK) -> tuple[LexicalInfo, list[str]]:
    """Index rows [0, count) of `docs` into staging/lexical/ as postings; returns the parameters (with this
    segment's document count and total length) and the file names. Postings spill to a scratch file as the
    passages are read and are laid out by stem from it (models.bundle.storage.spill); the stems are coded in runs of
    about `run_stems` (models.bundle.storage.dictionary.RunDictionary), a run ending between two `chunk`s of passages:
    memory holds one run and one chunk, whatever the corpus size or its vocabulary's."""
    info = (info or LexicalInfo()).model_copy(update={"engine": "postings"})
    analyzer = Analyzer(info)
    out = staging / LEXICAL_DIR
    out.mkdir(exist_ok=True)
    vocab = RunDictionary(out / ".stems", run_stems)
    vocab.codes[_EMPTY] = 0  # every dictionary holds the empty stem, first in order
    lengths = new_array(out / LENGTHS_FILE, np.int32, count)
    spill = CodeSpill(out / ".postings.spill", np.int32, {"tf": np.float32})
    total = 0
    try:
        for start in range(0, count, chunk):
            keys: list[int] = []
            codes, base = vocab.codes, vocab.base
            for row, doc in enumerate(docs.range(start, min(start + chunk, count)), start):
                ids = [codes.setdefault(s, len(codes)) for s in analyzer.stems(doc.passage())] or \
                    [codes.setdefault(_EMPTY, len(codes))]
                lengths[row] = len(ids)
                total += len(ids)
                key = (row << 32) + base
                keys.extend(key + i for i in ids)
            unique, tf = np.unique(np.asarray(keys, dtype=np.int64), return_counts=True)
            spill.append(unique & 0xFFFFFFFF, unique >> 32, tf=tf)
            release(lengths)
            vocab.end_chunk()
        save_array(out / LENGTHS_FILE, lengths)
        names, stems = _write_postings(out, vocab, spill)
    finally:
        spill.remove()
        vocab.remove()
        del lengths
    info = info.model_copy(update={"vocab": stems, "documents": count, "total_length": total})
    log.info("lexical index: %d documents, %d stems", count, stems)
    return info, names


def _write_postings(out: Path, vocab: RunDictionary, spill: CodeSpill) -> tuple[list[str], int]:
    """The stems in order and each one's postings, rows ascending (the spill was appended in row order); returns
    the file names and the number of distinct stems."""
    rank, stems = vocab.merge(out / TERMS_FILE, out / TERM_OFFSETS_FILE)  # rank: code → position in sorted order
    rows, tf = new_array(out / POSTING_ROWS_FILE, np.int32, spill.total), new_array(out / POSTING_TF_FILE,
                                                                                   np.float32, spill.total)
    offsets = spill.scatter(rank, {"row": rows, "tf": tf}, groups=stems)
    del rank
    save_array(out / POSTING_ROWS_FILE, rows)
    save_array(out / POSTING_TF_FILE, tf)
    np.save(out / POSTING_OFFSETS_FILE, offsets)
    max_tf, min_length = term_bounds(offsets, rows, tf, np.load(out / LENGTHS_FILE, mmap_mode="r"))
    np.save(out / MAX_TF_FILE, max_tf)
    np.save(out / MIN_LENGTH_FILE, min_length)
    return sorted(f"{LEXICAL_DIR}/{n}" for n in POSTINGS_FILES), stems


def term_bounds(offsets: np.ndarray, rows: np.ndarray, tf: np.ndarray,
                lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per stem, its largest tf and the shortest row holding it (0 and the int32 maximum for a stem with no
    postings), a chunk of postings at a time."""
    terms = len(offsets) - 1
    max_tf = np.zeros(terms, dtype=np.float32)
    min_length = np.full(terms, np.iinfo(np.int32).max, dtype=np.int32)
    total = int(offsets[-1])
    for a in range(0, total, BOUNDS_CHUNK):
        b = min(a + BOUNDS_CHUNK, total)
        first, last = int(np.searchsorted(offsets, a, side="right")) - 1, int(np.searchsorted(offsets, b))
        starts = np.maximum(offsets[first:last], a) - a
        ends = np.minimum(offsets[first + 1:last + 1], b) - a
        held = ends > starts  # the stems with postings in [a, b): their runs tile it
        ids, starts = np.arange(first, last)[held], starts[held]
        max_tf[ids] = np.maximum(max_tf[ids], np.maximum.reduceat(np.asarray(tf[a:b]), starts))
        lens = np.asarray(lengths)[np.asarray(rows[a:b])]
        min_length[ids] = np.minimum(min_length[ids], np.minimum.reduceat(lens, starts))
        for mapped in (rows, tf, lengths):  # a pass over mapped postings keeps their pages resident otherwise
            release(mapped)
    return max_tf, min_length


class PostingsIndex:
    """One segment's postings, memory-mapped: RAM holds none of them."""

    def __init__(self, directory: Path, info: LexicalInfo) -> None:
        base = Path(directory) / LEXICAL_DIR
        self.info = info
        blob = np.memmap(base / TERMS_FILE, dtype=np.uint8, mode="r") if (base / TERMS_FILE).stat().st_size \
            else np.zeros(0, dtype=np.uint8)
        self.terms = Dictionary(blob, np.load(base / TERM_OFFSETS_FILE, mmap_mode="r"))
        self.offsets = np.load(base / POSTING_OFFSETS_FILE, mmap_mode="r")
        self.rows = np.load(base / POSTING_ROWS_FILE, mmap_mode="r")
        self.tf = np.load(base / POSTING_TF_FILE, mmap_mode="r")
        self.lengths = np.load(base / LENGTHS_FILE, mmap_mode="r")
        self.count = len(self.lengths)
        if len(self.offsets) != len(self.terms) + 1 or len(self.rows) != len(self.tf) or \
                int(self.offsets[-1]) != len(self.rows):
            raise ValueError(f"{base}: the postings files do not agree with each other")
        if info.documents is not None and info.documents != self.count:
            raise ValueError(f"{base}: {self.count} document lengths, the manifest says {info.documents}")
        bounded = (base / MAX_TF_FILE).exists() and (base / MIN_LENGTH_FILE).exists()
        self.max_tf = np.load(base / MAX_TF_FILE, mmap_mode="r") if bounded else None
        self.min_length = np.load(base / MIN_LENGTH_FILE, mmap_mode="r") if bounded else None
        if bounded and not len(self.max_tf) == len(self.min_length) == len(self.terms):  # type: ignore[arg-type]
            raise ValueError(f"{base}: the term bounds do not agree with the terms")
        self._bounds: dict[int, tuple[float, int]] = {}  # a segment built before the bounds files: computed once

    def term(self, stem: str) -> QueryTerm | None:
        """A stem's postings with the bounds of its score (idf and count left for the caller to set); None when the
        segment never saw it or holds no row of it."""
        i = self.terms.find(stem)
        if i is None:
            return None
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if start == end:
            return None
        rows, tf = self.rows[start:end], self.tf[start:end]
        if self.max_tf is not None and self.min_length is not None:
            bound = float(self.max_tf[i]), int(self.min_length[i])
        else:
            bound = self._bounds.get(i) or (float(np.max(tf)), int(np.asarray(self.lengths)[rows].min()))
            self._bounds[i] = bound
        return QueryTerm(0.0, np.float32(1), rows, tf, *bound)

    def postings(self, stem: str) -> tuple[np.ndarray, np.ndarray]:
        """(rows, term frequencies) of a stem; empty when the segment never saw it."""
        i = self.terms.find(stem)
        if i is None:
            return _NO_ROWS, _NO_TF
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.rows[start:end], self.tf[start:end]


_NO_ROWS, _NO_TF = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class LexicalPart:
    """A segment's postings as one version sees them: `deleted` is the mask of its tombstoned rows."""

    index: PostingsIndex
    deleted: np.ndarray | None  # bool [rows], or None when no row of the segment is deleted

    @cached_property
    def deleted_rows(self) -> np.ndarray:
        """The deleted rows, ascending (few, next to the segment's size)."""
        return np.zeros(0, dtype=np.int64) if self.deleted is None else np.flatnonzero(self.deleted)

    def deleted_in(self, rows: np.ndarray) -> int:
        """How many of `rows` (ascending) are deleted: O(deleted · log rows), not O(rows)."""
        if not len(self.deleted_rows) or not len(rows):
            return 0
        pos = np.searchsorted(rows, self.deleted_rows)
        inside = pos < len(rows)
        return int(np.count_nonzero(rows[pos[inside]] == self.deleted_rows[inside]))

    @property
    def live(self) -> int:
        return self.index.count - (0 if self.deleted is None else int(self.deleted.sum()))

    def live_length(self) -> int:
        total = self.index.info.total_length
        if total is None:
            total = int(np.asarray(self.index.lengths).sum(dtype=np.int64))
        if self.deleted is None:
            return total
        return total - int(np.asarray(self.index.lengths)[self.deleted].sum(dtype=np.int64))


class Lexical:
    """BM25 over a version's segments, scored with the statistics of its live documents (one per part)."""

    def __init__(self, info: LexicalInfo, parts: Sequence[LexicalPart]) -> None:
        self.info = info
        self.analyzer = Analyzer(info)
        self.parts = list(parts)
        self.documents = sum(p.live for p in self.parts)
        self.total_length = sum(p.live_length() for p in self.parts)
        self.avg_length = self.total_length / max(1, self.documents)
        self._scored = 0  # postings scored since loading: the work a query costs, which tests bound by counting
        self._scored_lock = threading.Lock()

    @property
    def postings_scored(self) -> int:
        """Postings scored by every search of this index so far."""
        with self._scored_lock:
            return self._scored

    def search(self, query: str, k: int, allowed: Sequence[np.ndarray | None],
               check: Callable[[], None] | None = None,
               exhaustive: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per part, its top-k (scores, rows) among its `allowed` rows (live ones, ascending: the caller has left the
        deleted rows out), or among all its live rows when None, best first; documents that share no stem with the
        query are not hits. Each distinct stem is scored once, weighted by its count in the query; `check` runs
        before each part (it raises to stop a search past its deadline). Postings that cannot change the top k are
        skipped (models.bundle.lexical.pruning); `exhaustive` scores every one instead, the reference for tests."""
        return self.search_terms(self.analyzer.terms(query), k, allowed, check, exhaustive)

    def statistics(self, stems: Sequence[str]) -> LexicalStats:
        """What BM25 needs of these parts for a query's stems: their live documents, live length and each stem's
        live document frequency. A shard's statistics summed with every other shard's (LexicalStats.total) are the
        whole version's, which scores a shard's rows as the version scores them (models.search.shards)."""
        found = [[p.index.term(s) for s in stems] for p in self.parts]
        return LexicalStats(self.documents, self.total_length, tuple(self._df(len(stems), found)))

    def search_terms(self, terms: Mapping[str, int], k: int, allowed: Sequence[np.ndarray | None],
                     check: Callable[[], None] | None = None, exhaustive: bool = False,
                     stats: LexicalStats | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """`search` of a query's distinct stems with their counts (Analyzer.terms), in the query's order. `stats`:
        the statistics to score with (a sharded version's, summed over its shards; their `df` follows `terms`'
        order); None: these parts' own."""
        stems, counts = list(terms), [np.float32(c) for c in terms.values()]
        found = [[p.index.term(s) for s in stems] for p in self.parts]
        if stats is None:
            stats = LexicalStats(self.documents, self.total_length, tuple(self._df(len(stems), found)))
        elif len(stats.df) != len(stems):
            raise ValueError(f"statistics of {len(stats.df)} stems for a query of {len(stems)}")
        idf = stats.idf()
        avg_length = stats.avg_length
        out = []
        scored = 0
        for part, postings, rows_allowed in zip(self.parts, found, allowed, strict=True):
            if check is not None:
                check()
            # bm25s's arithmetic, so that its ties stay ties (lexical_pruning.Scorer); stems in the query's order
            query_terms = [dataclasses.replace(t, weight=w, count=c)
                           for w, c, t in zip(idf, counts, postings, strict=True) if t is not None]
            scorer = Scorer(part.index.lengths, self.info.k1, self.info.b, avg_length)
            if exhaustive:
                scores, rows, read = exhaustive_top_k(query_terms, scorer, part.index.count, part.deleted,
                                                      rows_allowed, k)
            else:
                scores, rows, read = pruned_top_k(query_terms, scorer, part.deleted, rows_allowed, k)
            out.append((scores, rows))
            scored += read
        with self._scored_lock:
            self._scored += scored
        return out

    def _df(self, stems: int, found: list[list[QueryTerm | None]]) -> list[int]:
        """Each query stem's document frequency over the live documents of every part."""
        out = []
        for i in range(stems):
            df = 0
            for part, postings in zip(self.parts, found, strict=True):
                term = postings[i]
                if term is not None:
                    df += len(term.rows) - part.deleted_in(term.rows)
            out.append(df)
        return out


@dataclass(frozen=True)
class LexicalStats:
    """The statistics BM25 scores a query with: live documents, their total length and each query stem's live
    document frequency (in the query's order). Integers, so a sum over shards equals the whole version's exactly."""

    documents: int
    total_length: int
    df: tuple[int, ...]

    @staticmethod
    def total(parts: Sequence[LexicalStats]) -> LexicalStats:
        """The statistics of the union of disjoint parts (shards of one version)."""
        widths = {len(p.df) for p in parts}
        if len(widths) != 1:
            raise ValueError(f"statistics of different queries cannot be summed ({sorted(widths)} stems)")
        return LexicalStats(sum(p.documents for p in parts), sum(p.total_length for p in parts),
                            tuple(int(sum(d)) for d in zip(*(p.df for p in parts), strict=True)))

    @property
    def avg_length(self) -> float:
        return self.total_length / max(1, self.documents)

    def idf(self) -> list[float]:
        """Lucene's idf of each stem over these documents (0 for a stem no live document holds)."""
        n = self.documents
        return [math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0 for df in self.df]


def _best(scores: np.ndarray, deleted: np.ndarray | None, allowed: np.ndarray | None,
          k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-k positive scores among the `allowed` rows (live ones), or else among the rows not deleted."""
    if allowed is not None:
        rows = np.asarray(allowed, dtype=np.int64)
        return top_k(scores[rows], rows, k, positive=True)
    if deleted is not None:
        scores[deleted] = 0.0
    return top_k(scores, np.arange(len(scores)), k, positive=True)


class Bm25sIndex:
    """The lexical index of a bundle built before segments (bm25s, scores precomputed for that bundle)."""

    def __init__(self, directory: Path, info: LexicalInfo) -> None:
        self.info = info
        self.analyzer = Analyzer(info)
        self.retriever = bm25s.BM25.load(str(Path(directory) / LEXICAL_DIR), mmap=True)
        # bm25s also keeps every token id in a set, for its own retrieve on id lists, which we never call
        # (docs/decisions.md#drop-bm25ss-token-id-set).
        self.retriever.unique_token_ids_set = None
        self.vocab: dict[str, int] = self.retriever.vocab_dict
        self.count = int(self.retriever.scores["num_docs"])

    def search(self, query: str, k: int, allowed: Sequence[np.ndarray | None],
               check: Callable[[], None] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """As `Lexical.search`, for the one part such a bundle has (its scores are bm25s's: a repeated stem is
        scored again, as the bundle was built to)."""
        ids = [self.vocab[s] for s in self.analyzer.stems(query) if s in self.vocab and s != _EMPTY]
        scores = np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float32) if ids \
            else np.zeros(self.count, dtype=np.float32)
        (rows_allowed,) = allowed
        return [_best(scores, None, rows_allowed, k)]


