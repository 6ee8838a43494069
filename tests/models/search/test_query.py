"""models.search.query over a real bundle (the tiny corpus with metadata, encoded by the real teacher): dense,
lexical, hybrid and filtered search, pages and the score floor, and how segments' lists are merged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from models.bundle.version import Bundle
from models.search import Mode, SearchOptions, dense_hits, parse_filter, search
from models.search.planner import Planner
from models.search.query import merge
from tests.fixtures.corpus import DOCS
from tests.fixtures.metadata import META

IDS = [doc_id for doc_id, _, _ in DOCS]


@pytest.fixture(scope="module")
def bundle(meta_bundle: Path) -> Iterator[Bundle]:
    loaded = Bundle(meta_bundle)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def own(bundle: Bundle) -> np.ndarray:
    """Each document's stored vector, in row order: as a query, it finds its own document."""
    return bundle.segments[0].vectors.reconstruct(np.arange(bundle.count))


def _ids(hits: list) -> list[str]:
    return [h.doc.id for h in hits]


def test_dense_search_finds_each_document_by_its_own_vector(bundle: Bundle, own: np.ndarray) -> None:
    found = search(bundle, own, [""] * len(own), SearchOptions(top_k=3), 4)
    assert [hits[0].doc.id for hits in found.hits] == IDS
    for hits in found.hits:
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # the unfiltered batch path ranks as the search does
    assert [_ids(h) for h in dense_hits(bundle, own, 3)] == [_ids(h) for h in found.hits]


def test_lexical_search_ranks_by_bm25(bundle: Bundle) -> None:
    found = search(bundle, None, ["magma lava crust", "espresso coffee"], SearchOptions(top_k=3, mode=Mode.LEXICAL), 4)
    assert [hits[0].doc.id for hits in found.hits] == ["volcano", "coffee"]
    assert all(h.score > 0 for hits in found.hits for h in hits)


def test_hybrid_search_fuses_both_sides(bundle: Bundle, own: np.ndarray) -> None:
    """The tides document's vector with a text about espresso: each side finds its own, the fusion keeps both."""
    row = IDS.index("tides")
    text = ["espresso coffee ground at nine bars of pressure"]
    sides = {mode: _ids(search(bundle, own[row : row + 1], text, SearchOptions(top_k=5, mode=mode), 4).hits[0])
             for mode in Mode}
    assert sides[Mode.DENSE][0] == "tides" and sides[Mode.LEXICAL][0] == "coffee"
    assert {"tides", "coffee"} <= set(sides[Mode.HYBRID]) and len(sides[Mode.HYBRID]) == 5


def test_a_filter_keeps_only_matching_documents_under_both_plans(bundle: Bundle, own: np.ndarray) -> None:
    flt = parse_filter({"field": "topic", "eq": "earth"}, bundle.filter_fields)
    earth = {doc_id for doc_id, meta in META.items() if meta["topic"] == "earth"}
    answers = []
    for plan in (Planner(exact_share=1.0), Planner(exact_share=0.0)):
        for mode in Mode:
            found = search(bundle, own[:4], [IDS[i] for i in range(4)],
                           SearchOptions(top_k=len(IDS), mode=mode, filter=flt), 4, plan)
            assert all(set(_ids(hits)) <= earth for hits in found.hits)
            if mode is Mode.DENSE:  # every matching document, best first: the page fills
                assert all(set(_ids(hits)) == earth for hits in found.hits)
                answers.append(found.hits)
    for exact, searched in zip(*answers, strict=True):  # a flat float index: the exact pass and FAISS's agree
        assert [h.row for h in exact] == [h.row for h in searched]
        np.testing.assert_allclose([h.score for h in exact], [h.score for h in searched], atol=1e-6)


def test_pages_and_the_score_floor(bundle: Bundle, own: np.ndarray) -> None:
    first = search(bundle, own[:2], ["", ""], SearchOptions(top_k=6), 4).hits
    page = search(bundle, own[:2], ["", ""], SearchOptions(top_k=3, offset=2), 4).hits
    assert [_ids(h) for h in page] == [_ids(h)[2:5] for h in first]
    floor = first[0][2].score
    kept = search(bundle, own[:1], [""], SearchOptions(top_k=6, min_score=floor), 4).hits[0]
    assert _ids(kept) == _ids(first[0])[:3] and all(h.score >= floor for h in kept)


def test_merge_keeps_the_best_of_each_segment_ties_by_row() -> None:
    first = (np.array([0.9, 0.5], dtype=np.float32), np.array([3, 1]))
    second = (np.array([0.9, 0.7], dtype=np.float32), np.array([0, 2]))
    scores, rows = merge([first, second], np.array([0, 10]), 3)
    assert rows.tolist() == [3, 10, 12] and scores.tolist() == pytest.approx([0.9, 0.9, 0.7])
    alone, at = merge([first], np.array([5]), 1)  # one segment: its list as it came, shifted to version rows
    assert at.tolist() == [8] and alone.tolist() == pytest.approx([0.9])
