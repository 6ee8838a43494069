"""A version served in shards of whole segments answers as the single box does (issue 57), in process: same ids,
order, float32 scores and version over dense, lexical and hybrid, with and without a filter, on the first page and
the third, for a base and three updates (four segments, tombstones in three) in 1, 2 (one uneven) and 4 shards. The
negative control: with each shard scoring BM25 with its own statistics, and a stem only one shard holds, the
answers differ. The version is built by a tiny random-weight teacher (tests/fixtures/tiny_models.py): cheap."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.sample import SAMPLE_SETTING
from indexer.versions.request import UpdateRequest
from indexer.versions.update import update
from models.bundle.version import Bundle
from models.bundle.versions import read_current
from models.errors import DeadlineExceeded
from models.search import Mode, SearchOptions, parse_filter, search
from models.search.query import Hit
from models.search.shards import Shard, VersionNotLoaded, local_coordinator, plan_shards
from tests.fixtures.tiny_models import StSpec, TinyModels

WORDS = ["river", "stone", "forest", "light", "music", "paper", "garden", "window", "market", "bridge", "winter",
         "ocean", "engine", "signal", "copper", "harvest", "lantern", "meadow", "thunder", "velvet", "glacier",
         "orchard", "compass", "falcon", "ember", "canyon", "harbor", "pepper"]
OVERSAMPLE = 4


def _doc(rng: np.random.Generator, doc_id: str, extra: str = "") -> dict[str, object]:
    words = rng.choice(WORDS, size=int(rng.integers(4, 14)))
    return {"_id": doc_id, "title": str(words[0]).title(), "text": " ".join(words[1:]) + extra,
            "group": "a" if rng.random() < 0.5 else "b"}


def _lines(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _segmented(root: Path, work: Path, teacher: Path, **options: object) -> Path:
    """A base of 60 documents and three updates (adds, replacements, deletes, one of a document an update added):
    four segments of 60, 21, 15 and 12 rows. Only the last holds the stem `zebra`."""
    rng = np.random.default_rng(57)
    _lines(work / "corpus.jsonl", [_doc(rng, f"d{i}") for i in range(60)])
    build(BuildRequest(corpus=work / "corpus.jsonl", root=root, version="v1", teacher=teacher, dim=64,
                       metadata_extra=True, **options))  # type: ignore[arg-type]
    changes = [
        [_doc(rng, f"u{i}") for i in range(18)] + [_doc(rng, "d3"), _doc(rng, "d7"), _doc(rng, "d9")]
        + [{"_id": "d11", "delete": True}, {"_id": "d12", "delete": True}],
        [_doc(rng, f"w{i}") for i in range(14)] + [_doc(rng, "u2")] + [{"_id": "u5", "delete": True}],
        [_doc(rng, f"z{i}", " zebra") for i in range(10)] + [_doc(rng, "d20"), _doc(rng, "w1")]
        + [{"_id": "d30", "delete": True}],
    ]
    for n, lines in enumerate(changes, start=2):
        update(UpdateRequest(changes=_lines(work / f"u{n}.jsonl", lines), root=root, version=f"v{n}",
                             teacher=teacher))
    return read_current(root)


@pytest.fixture(scope="module", params=["float", "binary"])
def version(request: pytest.FixtureRequest, tiny_models: TinyModels,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The writers add no agreement sample: the shards never read one, and each of the four writes would load the
    teacher again to encode its queries and search the staged version for their top-10 (most of this fixture's
    cost). The samples are tested in tests/indexer/test_agreement_check.py."""
    work = tmp_path_factory.mktemp(f"shards-{request.param}")
    teacher = tiny_models.st(StSpec())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SAMPLE_SETTING, "0")
        return _segmented(work / "root", work, teacher, quantization=request.param)


@pytest.fixture(scope="module")
def box(version: Path) -> Iterator[Bundle]:
    loaded = Bundle(version)
    yield loaded
    loaded.close()


QUERIES = ["river stone", "forest light music window", "zebra", "zebra harbor pepper", "glacier", "copper canyon ember"]


def _vectors(dim: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    v = rng.standard_normal((len(QUERIES), dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _answer(hits: list[list[Hit]]) -> list[list[tuple[str, int, float]]]:
    return [[(h.doc.id, h.row, h.score) for h in page] for page in hits]


def _options(box: Bundle) -> list[SearchOptions]:
    flt = parse_filter({"field": "group", "eq": "a"}, box.filter_fields)
    return [SearchOptions(top_k=10, mode=mode, offset=offset, filter=f)
            for mode in Mode for f in (None, flt) for offset in (0, 20)]


def test_the_version_has_four_segments_with_tombstones(box: Bundle) -> None:
    assert [s.count for s in box.segments] == [60, 21, 15, 12]
    assert sum(d is not None for d in box.deleted) == 3


@pytest.mark.parametrize("plan", [[[0, 1, 2, 3]], [[0], [1, 2, 3]], [[0, 3], [1, 2]], [[0], [1], [2], [3]]],
                         ids=["1", "2-uneven", "2", "4"])
def test_sharded_answers_equal_the_single_box(version: Path, box: Bundle, plan: list[list[int]]) -> None:
    vectors = _vectors(box.manifest.dim)
    coordinator, shards = local_coordinator(version, plan)
    try:
        assert coordinator.version.version == box.directory.name
        for opts in _options(box):
            want = search(box, vectors, QUERIES, opts, OVERSAMPLE).hits
            got = coordinator.search(vectors, QUERIES, opts, OVERSAMPLE).hits
            assert _answer(got) == _answer(want), opts
            assert all(isinstance(h.score, float) and np.float32(h.score) == h.score for p in got for h in p)
            assert sum(len(p) for p in want) > 0, opts  # the comparison compares something
    finally:
        for shard in shards:
            shard.close()


def test_without_the_statistics_round_the_answers_differ(version: Path, box: Bundle) -> None:
    """The negative control: each shard scores with its own statistics; `zebra` is only the last shard's."""
    vectors = _vectors(box.manifest.dim)
    coordinator, shards = local_coordinator(version, [[0], [1, 2, 3]], global_statistics=False)
    try:
        differs = []
        for opts in _options(box):
            if opts.mode is Mode.DENSE:
                continue
            want = search(box, vectors, QUERIES, opts, OVERSAMPLE).hits
            differs.append(_answer(coordinator.search(vectors, QUERIES, opts, OVERSAMPLE).hits) != _answer(want))
        assert all(differs)
    finally:
        for shard in shards:
            shard.close()


def test_a_request_past_its_deadline_stops_on_the_shards(version: Path, box: Bundle) -> None:
    """The deadline travels as the time left (a monotonic clock is one machine's), and each shard stops by it."""
    coordinator, shards = local_coordinator(version, [[0], [1, 2, 3]])
    try:
        with pytest.raises(DeadlineExceeded):
            coordinator.search(_vectors(box.manifest.dim), QUERIES,
                               SearchOptions(top_k=5, deadline=time.monotonic() - 1.0), OVERSAMPLE)
    finally:
        for shard in shards:
            shard.close()


def test_a_shard_refuses_a_version_it_does_not_hold(version: Path) -> None:
    shard = Shard(version, [1, 2])
    try:
        assert shard.bundle.bases.tolist() == [60, 81]  # rows keep their numbers in the whole version
        with pytest.raises(VersionNotLoaded):
            shard.documents("v0", [60])
        assert shard.documents(version.name, [60])[0].id == "u0"
    finally:
        shard.close()


def test_plans_balance_rows_over_whole_segments() -> None:
    assert plan_shards([60, 21, 15, 12], 2) == [[0], [1, 2, 3]]
    assert plan_shards([10, 10, 10, 10], 4) == [[0], [1], [2], [3]]
    assert plan_shards([5, 40, 30, 20, 10], 2) == [[0, 1, 4], [2, 3]]
    assert plan_shards([1], 1) == [[0]]
    with pytest.raises(ValueError):
        plan_shards([1, 2], 3)
