"""MaxScore pruning returns exactly the exhaustive search's hits (scores, ranks, ties) and reads fewer postings."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from models.bundle.lexical import pruning as lexical_pruning
from models.bundle.lexical.postings import (
    LEXICAL_DIR,
    MAX_TF_FILE,
    MIN_LENGTH_FILE,
    Lexical,
    LexicalPart,
    PostingsIndex,
)
from models.corpus import Document
from tests.fixtures.lexical import postings_index

VOCAB = [f"w{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(300)]  # words the stemmer keeps as they are


def _zipf_texts(rng: np.random.Generator, n: int) -> list[str]:
    p = 1 / np.arange(1, len(VOCAB) + 1) ** 1.07
    p /= p.sum()
    return [" ".join(VOCAB[w] for w in rng.choice(len(VOCAB), rng.integers(0, 30), p=p)) for _ in range(n)]


def _index(directory: Path, texts: list[str]) -> PostingsIndex:
    return postings_index(directory, [Document(id=str(i), title="", text=t) for i, t in enumerate(texts)])


def _lexical(tmp: Path, seed: int, sizes: tuple[int, ...], deleted_share: float) -> Lexical:
    rng = np.random.default_rng(seed)
    parts = []
    for n, size in enumerate(sizes):
        index = _index(tmp / f"s{n}", _zipf_texts(rng, size))
        gone = rng.random(size) < deleted_share
        parts.append(LexicalPart(index, gone if gone.any() else None))
    return Lexical(parts[0].index.info, parts)


def _queries(rng: np.random.Generator) -> list[str]:
    out = []
    for _ in range(25):
        ranks = list(rng.integers(0, 5, 2)) + list(rng.integers(5, len(VOCAB), rng.integers(0, 4)))
        out.append(" ".join(VOCAB[r] for r in ranks))
    return [*out, f"{VOCAB[0]} {VOCAB[0]} {VOCAB[150]}", f"{VOCAB[1]} zzzunseen", VOCAB[2], "zzzunseen"]


def _same(a: list[tuple[np.ndarray, np.ndarray]], b: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for (sa, ra), (sb, rb) in zip(a, b, strict=True):
        assert ra.tolist() == rb.tolist()
        assert sa.tobytes() == sb.tobytes()  # the same float32 scores, bit for bit


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 10, 5_000])
def test_pruned_search_equals_exhaustive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int,
                                         k: int) -> None:
    monkeypatch.setattr(lexical_pruning, "SMALL", 0)  # tiny corpora: prune anyway
    lexical = _lexical(tmp_path, seed, (600, 250, 40), deleted_share=0.1 if seed else 0.0)
    rng = np.random.default_rng(seed + 100)
    for query in _queries(rng):
        unfiltered = [None] * len(lexical.parts)
        _same(lexical.search(query, k, unfiltered), lexical.search(query, k, unfiltered, exhaustive=True))
        filters: list[np.ndarray | None] = []
        for part in lexical.parts:
            live = np.ones(part.index.count, dtype=bool) if part.deleted is None else ~part.deleted
            share = rng.choice([0.01, 0.3, 0.9])
            filters.append(np.flatnonzero(live & (rng.random(part.index.count) < share)))
        _same(lexical.search(query, k, filters), lexical.search(query, k, filters, exhaustive=True))


def test_pruning_reads_fewer_postings_on_a_common_and_a_rare_word(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexical_pruning, "SMALL", 0)
    lexical = _lexical(tmp_path, 5, (3_000,), deleted_share=0.0)
    query = f"{VOCAB[0]} {VOCAB[200]}"
    index = lexical.parts[0].index
    common, rare = (len(index.postings(w)[0]) for w in (VOCAB[0], VOCAB[200]))
    assert common > 20 * rare > 0
    before = lexical.postings_scored
    pruned = lexical.search(query, 10, [None])
    read = lexical.postings_scored - before
    exhaustive = lexical.search(query, 10, [None], exhaustive=True)
    assert lexical.postings_scored - before - read == common + rare
    assert read < (common + rare) / 2
    _same(pruned, exhaustive)


def test_a_segment_without_bound_files_still_searches_exactly(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexical_pruning, "SMALL", 0)
    built = _lexical(tmp_path / "new", 7, (800,), deleted_share=0.05)
    old_dir = tmp_path / "old"
    shutil.copytree(tmp_path / "new" / "s0", old_dir)
    for name in (MAX_TF_FILE, MIN_LENGTH_FILE):
        (old_dir / LEXICAL_DIR / name).unlink()
    old_index = PostingsIndex(old_dir, built.parts[0].index.info)
    assert old_index.max_tf is None
    old = Lexical(old_index.info, [LexicalPart(old_index, built.parts[0].deleted)])
    for query in _queries(np.random.default_rng(8)):
        _same(old.search(query, 10, [None]), built.search(query, 10, [None], exhaustive=True))


def test_the_stored_bounds_are_each_stems_largest_tf_and_shortest_row(tmp_path: Path) -> None:
    index = _lexical(tmp_path, 9, (500,), deleted_share=0.0).parts[0].index
    lengths = np.asarray(index.lengths)
    for i in range(len(index.terms)):
        rows, tf = index.rows[index.offsets[i]:index.offsets[i + 1]], index.tf[index.offsets[i]:index.offsets[i + 1]]
        if len(rows):
            assert index.max_tf is not None and index.min_length is not None
            assert index.max_tf[i] == tf.max() and index.min_length[i] == lengths[rows].min()
