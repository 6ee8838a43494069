"""BM25 per-query time, exhaustive against MaxScore pruning, on the first N documents of a scale_10m corpus.

The postings are laid out here with numpy from the corpus (each distinct word stemmed once by the index's Analyzer)
in the files `PostingsIndex` reads, bounds included, so the timing needs no docstore build; the queries are the
scale bench's lexical ones (three vocabulary words of Zipf ranks 10 to 10,000). Prints p50/p99 per mode and k, and
checks that both searches return the same hits.

    python -m bench.index.lexical_pruning /work/scale/inputs-1000000/corpus.jsonl --docs 1000000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.index.scale_10m import words
from models.bundle.lexical.postings import (
    LENGTHS_FILE,
    LEXICAL_DIR,
    MAX_TF_FILE,
    MIN_LENGTH_FILE,
    POSTING_OFFSETS_FILE,
    POSTING_ROWS_FILE,
    POSTING_TF_FILE,
    TERM_OFFSETS_FILE,
    TERMS_FILE,
    Analyzer,
    Lexical,
    LexicalPart,
    PostingsIndex,
    term_bounds,
)
from models.bundle.manifest import LexicalInfo
from models.bundle.storage.dictionary import sorted_dictionary

log = logging.getLogger("bench.lexical_pruning")


def build(corpus: Path, docs: int, out: Path) -> PostingsIndex:
    analyzer = Analyzer(LexicalInfo())
    stem_of: dict[str, int] = {}
    stems: dict[str, int] = {}
    keys, lengths = [], np.zeros(docs, dtype=np.int32)
    with corpus.open() as f:
        for row, line in zip(range(docs), f, strict=False):
            ids = []
            for w in json.loads(line)["text"].split():
                i = stem_of.get(w)
                if i is None:
                    s = (analyzer.stems(w) or [""])[0]
                    i = stem_of[w] = stems.setdefault(s, len(stems))
                ids.append(i)
            lengths[row] = max(1, len(ids))
            keys.append(np.asarray(ids, dtype=np.int64) * (1 << 32) + row)
    unique, tf = np.unique(np.concatenate(keys), return_counts=True)  # by stem, then row
    term_ids, rows = unique >> 32, (unique & 0xFFFFFFFF).astype(np.int32)
    rank, blob, term_offsets = sorted_dictionary(stems)  # id → sorted position: ids were in first-seen order
    order = np.argsort(rank[term_ids], kind="stable")
    rows, tf, sorted_ids = rows[order], tf[order].astype(np.float32), rank[term_ids][order]
    offsets = np.searchsorted(sorted_ids, np.arange(len(stems) + 1)).astype(np.int64)
    base = out / LEXICAL_DIR
    base.mkdir(parents=True)
    (base / TERMS_FILE).write_bytes(blob)
    np.save(base / TERM_OFFSETS_FILE, term_offsets)
    np.save(base / POSTING_OFFSETS_FILE, offsets)
    np.save(base / POSTING_ROWS_FILE, rows)
    np.save(base / POSTING_TF_FILE, tf)
    np.save(base / LENGTHS_FILE, lengths)
    max_tf, min_length = term_bounds(offsets, rows, tf, lengths)
    np.save(base / MAX_TF_FILE, max_tf)
    np.save(base / MIN_LENGTH_FILE, min_length)
    info = LexicalInfo(engine="postings", documents=docs, total_length=int(lengths.sum()), vocab=len(stems))
    return PostingsIndex(out, info)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lexical-pruning-", dir=os.environ.get("TMPDIR")) as tmp:
        started = time.perf_counter()
        index = build(args.corpus, args.docs, Path(tmp))
        log.info("postings of %d documents laid out in %.1f s (%d postings)", args.docs, time.perf_counter() - started,
                 len(index.rows))
        lexical = Lexical(index.info, [LexicalPart(index, None)])
        vocab = words(10_000)
        for low, high in ((10, 10_000), (10, 100)):  # the scale bench's ranks; then common words only
            rng = np.random.default_rng(3)
            queries = [" ".join(vocab[r] for r in rng.integers(low, high, 3)) for _ in range(args.queries)]
            log.info("queries of three words of ranks %d to %d", low, high)
            run(lexical, queries)


def run(lexical: Lexical, queries: list[str]) -> None:
    for k in (10, 100):
        times: dict[bool, list[float]] = {False: [], True: []}
        for q in queries:
            got = {}
            for exhaustive in (True, False):
                t = time.perf_counter()
                got[exhaustive] = lexical.search(q, k, [None], exhaustive=exhaustive)
                times[exhaustive].append((time.perf_counter() - t) * 1000)
            (s1, r1), (s2, r2) = got[True][0], got[False][0]
            assert r1.tolist() == r2.tolist() and s1.tobytes() == s2.tobytes(), q
        for exhaustive, ms in times.items():
            log.info("k=%d %s: p50 %.1f ms, p99 %.1f ms over %d queries", k,
                     "exhaustive" if exhaustive else "pruned", np.percentile(ms, 50), np.percentile(ms, 99),
                     len(ms))
    before = lexical.postings_scored
    for q in queries:
        lexical.search(q, 10, [None])
    pruned = lexical.postings_scored - before
    for q in queries:
        lexical.search(q, 10, [None], exhaustive=True)
    log.info("postings scored, k=10: pruned %d, exhaustive %d", pruned, lexical.postings_scored - before - pruned)


if __name__ == "__main__":
    main()
