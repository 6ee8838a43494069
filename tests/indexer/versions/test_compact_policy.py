"""Compaction by merge policy (indexer.versions.merge_policy): a large clean segment is kept as it is and the small
ones are merged into one segment in its space; a segment past the deleted share is rewritten; `--all` merges everything;
either way the compacted version searches as its base did, and deleted documents stay deleted.

Mechanics: the teacher is the tiny one (tests/fixtures/tiny_home.py), the base version is the reference."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from indexer.follow import FollowRequest, merge_policy
from indexer.sample import SAMPLE_SETTING
from indexer.verify import verify_one
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.request import VersionRequest
from indexer.versions.update import UpdateRequest, update
from models.bundle.version import Bundle, read_bundle_manifest
from models.bundle.versions import read_current
from models.encoders.teacher import TeacherEncoder
from models.search import Mode, SearchOptions, parse_filter, search
from tests.fixtures.corpus import DOCS
from tests.fixtures.kill_points import Ran, run_cli
from tests.indexer.versions.test_segments import QUERIES, _lines, _segmented, assert_same_hits, work  # noqa: F401  (work: a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_agreement_sample")]  # no sample read (test_segments)

BINARY = {"quantization": "binary", "rotation": "pca", "dim": 64}  # a space with every part: rotation, center, spin


@pytest.fixture(scope="module")
def segmented(tiny_home_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root of a base and three updates in the default space (test_segments._segmented), built once for the
    tests here that start from it; each copies it (`_copy`), so none sees another's versions."""
    folder = tmp_path_factory.mktemp("segmented")
    _lines(folder / "corpus.jsonl", [{"_id": i, "title": t, "text": x, "lang": "en"} for i, t, x in DOCS])
    mp = pytest.MonkeyPatch()
    mp.setenv("TANDEM_HOME", str(tiny_home_dir))
    mp.setenv(SAMPLE_SETTING, "0")  # as the tests' no_agreement_sample
    try:
        _segmented(folder / "root", folder)
    finally:
        mp.undo()
    return folder / "root"


def _copy(segmented: Path, folder: Path) -> Path:
    shutil.copytree(segmented, folder / "root")
    return folder / "root"


def _cli(folder: Path, *args: str) -> Ran:
    """`tandem index ARGS` in a fork of this process (kill_points.run_cli), not a fresh interpreter."""
    return run_cli(folder, ["index", *args])


def _same_search(base: Path, compacted: Path, teacher_dir: Path) -> None:
    """Every mode, with and without a filter: the same hits with the same scores, and the same live documents."""
    before, after = Bundle(base), Bundle(compacted)
    try:
        assert after.ids() == before.ids()
        vectors = TeacherEncoder(teacher_dir).encode_queries(QUERIES)
        fields = frozenset(before.manifest.metadata_fields)
        for mode in (Mode.DENSE, Mode.LEXICAL, Mode.HYBRID):
            for flt in (None, {"field": "lang", "in": ["fr", "en"]}):
                options = SearchOptions(top_k=10, mode=mode, filter=None if flt is None else parse_filter(flt, fields))
                want = search(before, vectors, QUERIES, options, 4).hits
                got = search(after, vectors, QUERIES, options, 4).hits
                assert_same_hits(got, want, (mode, flt))
    finally:
        before.close()
        after.close()


def test_the_policy_keeps_the_large_clean_segment_and_merges_the_small_ones(tiny_home: Path, tiny_teacher: Path,
                                                                           work: Path) -> None:  # noqa: F811
    root = work / "root"
    # v1: 20 rows, 4 deleted (0.2: not more than the default share); v2: 2 rows, 1 deleted; v3 and v4: 1 row each
    ids = _segmented(root, work, **BINARY)
    base = read_bundle_manifest(root / "v4")
    manifest = compact(VersionRequest(root=root, version="v5"))
    assert manifest is not None and manifest.base is not None
    assert [s.name for s in manifest.parts] == ["v1", "v5"]
    kept, merged = manifest.parts
    assert kept == base.parts[0]  # its files, tombstones and store entry carried as they were
    for name in base.segment_files(kept):
        assert os.path.samefile(root / "v4" / name, root / "v5" / name)  # hard links: nothing of it rewritten
    assert (merged.count, merged.deleted, manifest.count) == (3, 0, len(ids))
    assert (manifest.base.action, manifest.base.version, manifest.base.deleted) == ("compact", "v4", 1)
    for name in ("rotation.npy", "calibration.npy", "center.npy", "spin.npy"):  # the space is the base's
        assert manifest.files[name] == base.files[name]
    verify_one(root / "v5")
    _same_search(root / "v4", root / "v5", tiny_teacher)
    gone = {"git", "bees", "kites"}
    assert not gone & set(Bundle(root / "v5").ids())
    assert compact(VersionRequest(root=root, version="v6")) is None  # nothing left to do: nothing published
    assert read_current(root).name == "v5"


def test_a_segment_past_the_deleted_share_is_rewritten(tiny_home: Path, tiny_teacher: Path, segmented: Path,
                                                       work: Path) -> None:  # noqa: F811
    root = _copy(segmented, work)
    added = [{"_id": f"new{i}", "title": f"Note {i}", "text": f"Field note {i} on rivers, hills and weather."}
             for i in range(12)]  # 12 rows: a large segment beside v1's 20
    update(UpdateRequest(changes=_lines(work / "u5.jsonl", added), root=root, version="v5"))
    update(UpdateRequest(changes=_lines(work / "u6.jsonl", [{"_id": f"new{i}", "delete": True} for i in range(3)]),
                         root=root, version="v6"))  # 3 of its 12 rows: a share of 0.25
    tolerant = compact(VersionRequest(root=root, version="v7"), MergePolicy(deleted_share=0.3))
    assert tolerant is not None and [s.name for s in tolerant.parts] == ["v1", "v5", "v7"]  # v5 kept at 0.3
    assert tolerant.parts[1].deleted == 3
    manifest = compact(VersionRequest(root=root, base=root / "v6", version="v8"))
    assert manifest is not None and [s.name for s in manifest.parts] == ["v1", "v8"]
    assert (manifest.parts[1].count, manifest.parts[1].deleted) == (3 + 9, 0)
    verify_one(root / "v8")
    _same_search(root / "v6", root / "v8", tiny_teacher)
    assert not {"new0", "new1", "new2"} & set(Bundle(root / "v8").ids())


def test_all_merges_every_segment_and_bad_values_are_refused(tiny_home: Path, tiny_teacher: Path, segmented: Path,
                                                             work: Path) -> None:  # noqa: F811
    root = _copy(segmented, work)  # the default space: a refit on the live rows leaves the scores as they were
    for flags, message in ((["--large-share", "0"], "--large-share must be in (0, 1]"),
                           (["--deleted-share", "1.5"], "--deleted-share must be in (0, 1]")):
        failed = _cli(work, "compact", "--root", str(root), *flags)
        assert failed.returncode == 2 and message in failed.stderr, failed.stderr
    assert read_current(root).name == "v4"
    done = _cli(work, "compact", "--root", str(root), "--version", "v5", "--all")
    assert done.returncode == 0, done.stderr
    assert "in 1 segment (" in done.stdout
    manifest = read_bundle_manifest(root / "v5")
    assert manifest.segments is None and manifest.base is not None and manifest.base.deleted == 5
    _same_search(root / "v4", root / "v5", tiny_teacher)
    idle = _cli(work, "compact", "--root", str(root), "--version", "v6")  # one clean segment: nothing to do
    assert idle.returncode == 0 and "nothing to compact" in idle.stdout, idle.stderr
    assert read_current(root).name == "v5"


def test_the_follower_merges_by_its_own_bounds(tiny_home: Path, segmented: Path,
                                               work: Path) -> None:  # noqa: F811
    """Its deleted bound is the policy's; when the kept segments leave no room for a batch, everything merges."""
    root = _copy(segmented, work)
    base = read_bundle_manifest(root / "v4")
    roomy = merge_policy(FollowRequest(root=root, changes_dir=work, max_segments=8, max_deleted=0.1))
    assert roomy.plan(base).full  # v1's 4 of 20 deleted pass 0.1: v1 is rewritten, so all is
    plan = merge_policy(FollowRequest(root=root, changes_dir=work, max_segments=8)).plan(base)
    assert [s.name for s in plan.kept] == ["v1"] and not plan.full
    assert merge_policy(FollowRequest(root=root, changes_dir=work, max_segments=2)).plan(base).full
    assert json.loads((root / "v4" / "manifest.json").read_text())["segments"]  # the plan read it, changed nothing
