"""`tandem index build --segment-rows N` (issue 57): a version written as even segments of at most N rows, each
with the build's index type sized for its own rows and its own embedding-store entry, verifies, and answers every
dense, lexical and hybrid query (filtered or not, any page) as the one-segment build of the same corpus does; an
update and a full compaction work on it as on any segmented version; sharded over its segments, it answers as the
single box. Built by a tiny random-weight teacher (tests/fixtures/tiny_models.py): cheap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.sample import SAMPLE_SETTING
from indexer.split import row_ranges, sliced
from indexer.verify import verify_one
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.request import UpdateRequest, VersionRequest
from indexer.versions.update import update
from models.bundle.sample import has_sample
from models.bundle.version import Bundle
from models.bundle.versions import read_current
from models.embeddings.store import EmbeddingStore
from models.errors import InputError
from models.search import Mode, SearchOptions, parse_filter, search
from models.search.shards import local_coordinator
from tests.fixtures.tiny_models import StSpec, TinyModels
from tests.models.search.test_shards import OVERSAMPLE, QUERIES, _answer, _doc, _lines, _vectors

DOCS = 230


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(58)
    work = tmp_path_factory.mktemp("segment-rows")
    return _lines(work / "corpus.jsonl", [_doc(rng, f"d{i}", " zebra" if i % 50 == 7 else "") for i in range(DOCS)])


def _build(corpus: Path, teacher: Path, root: Path, **options: object) -> Path:
    build(BuildRequest(corpus=corpus, root=root, version="v1", teacher=teacher, dim=64, metadata_extra=True,
                       **options))  # type: ignore[arg-type]
    return read_current(root)


def _same_answers(got: Bundle, want: Bundle, *, exact_scores: bool) -> None:
    vectors = _vectors(want.manifest.dim)
    flt = parse_filter({"field": "group", "eq": "a"}, want.filter_fields)
    for mode in Mode:
        for f in (None, flt):
            for offset in (0, 20):
                opts = SearchOptions(top_k=10, mode=mode, offset=offset, filter=f)
                a = _answer(search(got, vectors, QUERIES, opts, OVERSAMPLE).hits)
                b = _answer(search(want, vectors, QUERIES, opts, OVERSAMPLE).hits)
                assert [[(i, r) for i, r, _ in page] for page in a] == [[(i, r) for i, r, _ in page] for page in b]
                scores = [s for page in a for _, _, s in page], [s for page in b for _, _, s in page]
                if exact_scores:
                    assert scores[0] == scores[1], opts
                else:
                    np.testing.assert_allclose(*scores, rtol=1e-5, atol=1e-6)
                assert sum(len(page) for page in b) > 0


def test_row_ranges_are_as_even_as_they_come() -> None:
    assert row_ranges(230, None) == [(0, 230)]
    assert row_ranges(230, 230) == [(0, 230)]
    assert row_ranges(230, 100) == [(0, 77), (77, 154), (154, 230)]
    assert row_ranges(10, 1) == [(i, i + 1) for i in range(10)]
    chunks = [np.arange(n * 3, (n + 1) * 3) for n in range(4)]  # 12 rows in chunks of 3
    assert np.concatenate(list(sliced(chunks, 2, 8))).tolist() == list(range(2, 8))


def test_a_split_build_answers_as_the_one_segment_build(corpus: Path, tiny_models: TinyModels, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    teacher = tiny_models.st(StSpec())
    monkeypatch.setenv(SAMPLE_SETTING, "0")  # the reference needs no sample: only the split build's are checked
    whole = Bundle(_build(corpus, teacher, tmp_path / "whole"))
    monkeypatch.delenv(SAMPLE_SETTING)
    split_dir = _build(corpus, teacher, tmp_path / "split", segment_rows=100)
    split = Bundle(split_dir)
    try:
        manifest = split.manifest
        assert [(s.count, s.path) for s in manifest.parts] == [(77, "."), (77, "segments/v1-1"), (76, "segments/v1-2")]
        assert manifest.count == DOCS and split.ids() == whole.ids()  # rows keep the corpus's order
        assert len({s.embeddings.store_key for s in manifest.parts if s.embeddings}) == 3  # an entry each
        assert manifest.embeddings.store_key == whole.manifest.embeddings.store_key  # the corpus's, for distill
        assert "group" in manifest.metadata_fields
        verify_one(split_dir, teacher)
        assert all(has_sample(manifest, s) for s in manifest.parts)  # an agreement sample each
        _same_answers(split, whole, exact_scores=False)
    finally:
        split.close()
        whole.close()


@pytest.mark.parametrize(("quantization", "index"), [("int8", "hnsw"), ("binary", "ivf")])
def test_each_segment_gets_the_builds_index_type(corpus: Path, tiny_models: TinyModels, tmp_path: Path,
                                                 quantization: str, index: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SAMPLE_SETTING, "0")  # the first test checks the samples
    teacher = tiny_models.st(StSpec())
    root = _build(corpus, teacher, tmp_path / "root", segment_rows=120, quantization=quantization, index=index)
    bundle = Bundle(root)
    try:
        assert [(s.count, s.index.type.value) for s in bundle.manifest.parts] == [(115, index), (115, index)]
        if index == "ivf":  # sized for the segment's rows, not the corpus's
            assert all(s.index.ivf_nlist is not None for s in bundle.manifest.parts)
        store = EmbeddingStore()
        for segment in bundle.manifest.parts:  # each entry holds its segment's rows, no more
            key = segment.embeddings.store_key if segment.embeddings else None
            assert key is not None and sum(len(c) for c in store.iter_chunks(key)) == segment.count
        assert search(bundle, _vectors(64), QUERIES, SearchOptions(top_k=5), OVERSAMPLE).hits[0]
    finally:
        bundle.close()


def test_updates_compaction_and_shards_work_on_a_split_build(corpus: Path, tiny_models: TinyModels,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SAMPLE_SETTING, "0")
    teacher = tiny_models.st(StSpec())
    root = tmp_path / "root"
    _build(corpus, teacher, root, segment_rows=60)  # 4 segments: 58, 58, 57, 57
    rng = np.random.default_rng(7)
    update(UpdateRequest(changes=_lines(tmp_path / "u.jsonl", [_doc(rng, "new"), _doc(rng, "d100"),
                                                                {"_id": "d3", "delete": True}]),
                         root=root, version="v2", teacher=teacher))
    v2 = read_current(root)
    box = Bundle(v2)
    try:
        assert [s.count for s in box.segments] == [58, 58, 57, 57, 2]
        coordinator, shards = local_coordinator(v2, [[0, 4], [1], [2, 3]])
        try:
            flt = parse_filter({"field": "group", "eq": "a"}, box.filter_fields)
            for mode in Mode:
                for f in (None, flt):
                    opts = SearchOptions(top_k=10, mode=mode, offset=0, filter=f)
                    want = search(box, _vectors(64), QUERIES, opts, OVERSAMPLE).hits
                    assert _answer(coordinator.search(_vectors(64), QUERIES, opts, OVERSAMPLE).hits) == _answer(want)
        finally:
            for shard in shards:
                shard.close()
        live = box.ids()
    finally:
        box.close()
    compact(VersionRequest(root=root, version="v3", teacher=teacher), MergePolicy(full=True))
    merged = Bundle(read_current(root))
    try:
        assert len(merged.segments) == 1 and merged.ids() == live
    finally:
        merged.close()


def test_segment_rows_below_one_is_refused_before_any_work(corpus: Path, tiny_models: TinyModels,
                                                           tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--segment-rows must be at least 1"):
        _build(corpus, tiny_models.st(StSpec()), tmp_path / "root", segment_rows=0)
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").iterdir())
