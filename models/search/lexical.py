"""The bundle's lexical index: BM25 (bm25s) over the passages the teacher saw, memory-mapped when served.

Tokenization is ours (lowercase, bm25s's word pattern and English stopwords, PyStemmer), the same for
documents and queries: bm25s's own Tokenizer caches every word a query ever used, which a service
must not do. Documents are tokenized in chunks read from the docstore, and each chunk's token ids
are kept as one int32 array, so the build holds the ids and the sparse matrix, never the documents.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN
from bm25s.tokenization import Tokenized

from models.docstore import DocStore
from models.manifest import LEXICAL_SUBDIRECTORY, LexicalInfo

log = logging.getLogger(__name__)
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG on import

LEXICAL_DIR = LEXICAL_SUBDIRECTORY
READ_CHUNK = 10_000
_WORD = re.compile(r"(?u)\b\w\w+\b")
_STOPWORDS = frozenset(STOPWORDS_EN)
_EMPTY = ""  # the token of a passage with no word left (id 0), so every document has one


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


class _TokenIds(Sequence[list[int]]):
    """Per-document token ids held as int32 arrays per chunk: what bm25s indexes, without Python int lists."""

    def __init__(self) -> None:
        self._chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (flat ids, offsets)
        self._starts: list[int] = []
        self._count = 0

    def append_chunk(self, docs: list[list[int]]) -> None:
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(d) for d in docs])
        flat = np.fromiter((t for d in docs for t in d), dtype=np.int32, count=int(offsets[-1]))
        self._chunks.append((flat, offsets))
        self._starts.append(self._count)
        self._count += len(docs)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[list[int]]:
        for flat, offsets in self._chunks:
            for i in range(len(offsets) - 1):
                yield flat[offsets[i] : offsets[i + 1]].tolist()

    def __getitem__(self, item):
        if isinstance(item, slice):
            return [self[i] for i in range(*item.indices(self._count))]
        chunk = int(np.searchsorted(self._starts, item, side="right")) - 1
        flat, offsets = self._chunks[chunk]
        i = item - self._starts[chunk]
        return flat[offsets[i] : offsets[i + 1]].tolist()


def build_lexical(staging: Path, docs: DocStore, count: int, info: LexicalInfo | None = None) -> tuple[
        LexicalInfo, list[str]]:
    """Index rows [0, count) of `docs` into staging/lexical/; returns the parameters and the file names."""
    info = info or LexicalInfo()
    analyzer = Analyzer(info)
    vocab: dict[str, int] = {_EMPTY: 0}
    ids = _TokenIds()
    for start in range(0, count, READ_CHUNK):
        chunk: list[list[int]] = []
        for doc in docs.range(start, min(start + READ_CHUNK, count)):
            toks = [vocab.setdefault(s, len(vocab)) for s in analyzer.stems(doc.passage())]
            chunk.append(toks or [0])
        ids.append_chunk(chunk)
    retriever = bm25s.BM25(method=info.method, k1=info.k1, b=info.b)
    retriever.index(Tokenized(ids=ids, vocab=vocab), create_empty_token=False, show_progress=False)
    out = staging / LEXICAL_DIR
    out.mkdir(exist_ok=True)
    retriever.save(str(out), show_progress=False)
    names = sorted(f"{LEXICAL_DIR}/{p.name}" for p in out.iterdir() if p.is_file())
    info = info.model_copy(update={"vocab": len(vocab)})
    log.info("lexical index: %d documents, %d stems", count, len(vocab))
    return info, names


class LexicalIndex:
    """A loaded BM25 index; scores are memory-mapped from the bundle, so RAM holds the vocabulary only."""

    def __init__(self, directory: Path, info: LexicalInfo) -> None:
        self.info = info
        self.analyzer = Analyzer(info)
        self.retriever = bm25s.BM25.load(str(Path(directory) / LEXICAL_DIR), mmap=True)
        # bm25s also keeps every token id in a set, for its own retrieve on id lists, which we never call (token_ids
        # checks the vocabulary): at a million documents a 32 MiB table, and a container every full garbage
        # collection walks, which stalled a serving process into 429s
        # (docs/decisions.md#drop-bm25ss-token-id-set).
        self.retriever.unique_token_ids_set = None
        self.vocab: dict[str, int] = self.retriever.vocab_dict
        self.count = int(self.retriever.scores["num_docs"])

    def token_ids(self, query: str) -> list[int]:
        return [self.vocab[s] for s in self.analyzer.stems(query) if s in self.vocab and s != _EMPTY]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document (float32 [count]); all zero when no query word is in the vocabulary."""
        ids = self.token_ids(query)
        if not ids:
            return np.zeros(self.count, dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float32)

    def search(self, query: str, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, rows) among `allowed` rows (all when None), best first; documents that share no
        word with the query (score 0) are not hits."""
        scores = self.scores(query)
        if allowed is not None:
            rows = allowed
            scores = scores[allowed]
        else:
            rows = np.arange(self.count)
        return top_k(scores, rows, k, positive=True)


def top_k(scores: np.ndarray, rows: np.ndarray, k: int, positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The k best (scores, rows), best first, ties by row; `positive` drops scores ≤ 0."""
    if positive:
        keep = scores > 0
        scores, rows = scores[keep], rows[keep]
    if len(scores) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]  # the k-th best; ties at it all stay
        keep = scores >= kth
        scores, rows = scores[keep], rows[keep]
    order = np.lexsort((rows, -scores))[:k]
    return scores[order], rows[order]
