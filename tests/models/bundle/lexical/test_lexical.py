"""BM25 over segments: a fresh index scores as bm25s does, and a version of several segments with deleted rows
scores every live document exactly as one fresh index of the same live documents (corpus-wide statistics)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import bm25s
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.bundle.lexical.postings import Analyzer, Lexical, LexicalPart, PostingsIndex, build_lexical
from models.bundle.manifest import LexicalInfo
from models.bundle.storage.docstore import DocStore, write_docstore
from models.corpus import Document
from tests.fixtures.lexical import postings_index

WORDS = ["tide", "tides", "moon", "bread", "yeast", "rising", "lava", "chess", "code", "the", "of", "bee", "sun"]
texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=8).map(" ".join)


def _index(directory: Path, docs: list[Document]) -> PostingsIndex:
    return postings_index(directory, docs)


def _scores(lexical: Lexical, query: str) -> list[dict[int, float]]:
    """Per part, row → score of every hit."""
    found = lexical.search(query, 10_000, [None] * len(lexical.parts))
    return [{int(r): float(s) for s, r in zip(*part, strict=True)} for part in found]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts, min_size=1, max_size=30), texts)
def test_one_segment_scores_as_bm25s(corpus: list[str], query: str) -> None:
    docs = [Document(id=str(i), title="", text=t) for i, t in enumerate(corpus)]
    with tempfile.TemporaryDirectory() as tmp:
        index = _index(Path(tmp) / "s", docs)
        ours = _scores(Lexical(index.info, [LexicalPart(index, None)]), query)[0]
    analyzer = Analyzer(LexicalInfo())
    vocab: dict[str, int] = {"": 0}
    ids = [[vocab.setdefault(s, len(vocab)) for s in analyzer.stems(d.passage())] or [0] for d in docs]
    reference = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    reference.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
    asked = [vocab[s] for s in analyzer.stems(query) if s in vocab]
    expected = np.asarray(reference.get_scores_from_ids(asked), dtype=np.float32) if asked else np.zeros(len(docs))
    assert set(ours) == {i for i, s in enumerate(expected) if s > 0}
    for row, score in ours.items():
        assert abs(score - expected[row]) <= 1e-5 * max(1.0, abs(expected[row])), (row, score, expected[row])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts, min_size=2, max_size=30), st.lists(texts, min_size=1, max_size=10), st.data(), texts)
def test_segments_with_deleted_rows_score_as_one_fresh_index(first: list[str], second: list[str],
                                                             data: st.DataObject, query: str) -> None:
    docs1 = [Document(id=f"a{i}", title="", text=t) for i, t in enumerate(first)]
    docs2 = [Document(id=f"b{i}", title="", text=t) for i, t in enumerate(second)]
    gone1 = data.draw(st.sets(st.integers(0, len(first) - 1), max_size=len(first) - 1))
    gone2 = data.draw(st.sets(st.integers(0, len(second) - 1), max_size=len(second)))
    deleted1, deleted2 = np.zeros(len(first), dtype=bool), np.zeros(len(second), dtype=bool)
    deleted1[list(gone1)], deleted2[list(gone2)] = True, True
    live = [d for d, g in zip(docs1, deleted1, strict=True) if not g] + \
        [d for d, g in zip(docs2, deleted2, strict=True) if not g]
    with tempfile.TemporaryDirectory() as tmp:
        a, b = _index(Path(tmp) / "a", docs1), _index(Path(tmp) / "b", docs2)
        fresh = _index(Path(tmp) / "fresh", live)
        parts = [LexicalPart(a, deleted1 if gone1 else None), LexicalPart(b, deleted2 if gone2 else None)]
        segmented = _scores(Lexical(a.info, parts), query)
        whole = _scores(Lexical(fresh.info, [LexicalPart(fresh, None)]), query)[0]
    by_id = {docs1[r].id: s for r, s in segmented[0].items()} | {docs2[r].id: s for r, s in segmented[1].items()}
    expected = {live[r].id: s for r, s in whole.items()}
    assert by_id.keys() == expected.keys()
    for doc_id, score in by_id.items():
        assert abs(score - expected[doc_id]) <= 1e-5 * max(1.0, abs(expected[doc_id]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from([*WORDS, "zebra7", "quartz", "naïve", "ünïcode"]), max_size=6).map(" ".join),
                min_size=1, max_size=25), st.integers(1, 4), st.integers(1, 5))
def test_stems_coded_in_small_runs_write_the_files_one_dictionary_writes(texts_: list[str], run_stems: int,
                                                                          chunk: int) -> None:
    """The vocabulary in runs of a few stems (a run ends between chunks of a few passages, so a stem is met again in
    later runs, empty passages too) lays out byte for byte the postings of one dictionary of every stem."""
    docs = [Document(id=f"d{i}", title=f"t{i}" if i % 3 else "", text=t) for i, t in enumerate(texts_)]
    with tempfile.TemporaryDirectory() as tmp:
        one, runs = Path(tmp) / "one", Path(tmp) / "runs"
        for out in (one, runs):
            out.mkdir()
            write_docstore(out / "docs.sqlite", docs)
        store = DocStore(one / "docs.sqlite")
        info, names = build_lexical(one, store, len(docs))
        store.close()
        store = DocStore(runs / "docs.sqlite")
        info_runs, names_runs = build_lexical(runs, store, len(docs), run_stems=run_stems, chunk=chunk)
        store.close()
        assert (info_runs, names_runs) == (info, names)
        for name in names:
            assert (runs / name).read_bytes() == (one / name).read_bytes(), name
        left = sorted(p.name for p in (runs / "lexical").iterdir())
        assert left == sorted(p.name for p in (one / "lexical").iterdir())  # no scratch file left behind


def test_a_repeated_word_is_scored_once_with_its_count(tmp_path: Path) -> None:
    docs = [Document(id=str(i), title="", text=t) for i, t in enumerate(["tide moon", "moon", "bread yeast", "tides"])]
    parts = [LexicalPart(_index(tmp_path / name, docs), None) for name in ("a", "b")]
    lexical = Lexical(parts[0].index.info, parts)
    before = lexical.postings_scored
    once = _scores(lexical, "tide")
    assert lexical.postings_scored - before == 2 * 2  # "tide" and "tides": one stem, two postings, two parts
    before = lexical.postings_scored
    repeated = _scores(lexical, " ".join(["tides", "tide"] * 170))  # 340 words, one stem
    assert lexical.postings_scored - before == 2 * 2
    for single, many in zip(once, repeated, strict=True):
        assert single.keys() == many.keys()
        assert all(abs(many[r] - 340 * single[r]) <= 1e-4 * many[r] for r in single)
    assert len(lexical.analyzer.terms("the tide, the tides and the moon")) == 2  # stopwords left out


def test_the_check_runs_before_each_part(tmp_path: Path) -> None:
    docs = [Document(id=str(i), title="", text=t) for i, t in enumerate(["tide moon", "bread"])]
    parts = [LexicalPart(_index(tmp_path / name, docs), None) for name in ("a", "b", "c")]
    lexical = Lexical(parts[0].index.info, parts)
    calls: list[int] = []

    def stop_at_third() -> None:
        calls.append(len(calls))
        if len(calls) == 3:
            raise TimeoutError

    with pytest.raises(TimeoutError):
        lexical.search("tide", 3, [None] * 3, stop_at_third)
    assert calls == [0, 1, 2]
