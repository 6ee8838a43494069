"""A follower that keeps up without harm (issue 42, item 6): a backlog is published in bounded batches, compacted
before the segments pass their bound, and a change file that arrives sorting before the last applied one is
reported, never silently skipped."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from indexer.follow import ChangeDir, FollowReport, FollowRequest, follow, step
from indexer.versions.changes import Changes
from indexer.versions.next_version import teacher_vectors
from indexer.versions.request import VersionRequest
from indexer.versions.segments import OPENED, Batch, apply_changes, link_version
from models.bundle.vectors.space import Space
from models.bundle.version import Bundle, read_bundle_manifest
from models.bundle.versions import list_versions, read_current
from models.corpus import Document
from models.search import documents
from tests.fixtures.corpus import DOCS
from tests.indexer.test_writer_races import root

__all__ = ["root"]  # fixture shared with test_writer_races: a root whose CURRENT is the tiny-teacher bundle

pytestmark = pytest.mark.slow

BAKE = next(d for d in DOCS if d[0] == "bake")


def _change(path: Path, n: int) -> None:
    """A tiny change file: the metadata of one document (its vector is kept: no teacher)."""
    path.write_text(json.dumps({"_id": BAKE[0], "title": BAKE[1], "text": BAKE[2], "metadata": {"n": n}}) + "\n")


def test_a_backlog_of_files_is_published_in_versions_of_bounded_segments(root: Path, tmp_path: Path,
                                                                        no_agreement_sample: None) -> None:
    """A backlog of four batches' worth of files, each batch more files than the segment bound allows. No agreement
    sample, which nothing here reads: each of the ~15 compactions would search its merged samples again."""
    files = 32
    changes = tmp_path / "changes"
    changes.mkdir()
    for n in range(files):
        _change(changes / f"{n:04d}.jsonl", n)
    request = FollowRequest(root=root, changes_dir=changes, once=True, max_segments=4, max_files=8)
    report = follow(request)
    assert report.applied == files and not report.late
    bound = max(request.max_segments, 2)
    published = [read_bundle_manifest(root / v) for v in list_versions(root) if v != "v1"]
    assert len(published) == report.versions
    assert report.versions >= files // request.max_files  # in batches, not one version of 64 segments
    assert max(len(m.parts) for m in published) <= bound
    followed = [m for m in published if m.base is not None and m.base.action == "follow"]
    assert all(m.base is not None and m.base.replaced <= request.max_files for m in followed)
    final = read_bundle_manifest(read_current(root))
    assert final.follow is not None and (final.follow.last, final.follow.files) == (f"{files - 1:04d}.jsonl", files)
    bundle = Bundle(read_current(root))
    try:
        assert {d.id: d.meta() for d in documents(bundle, bundle.live_rows())}["bake"] == {"n": files - 1}
    finally:
        bundle.close()


def test_a_file_arriving_before_the_last_applied_one_is_reported(root: Path, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    changes = tmp_path / "changes"
    changes.mkdir()
    _change(changes / "0002.jsonl", 2)
    request = FollowRequest(root=root, changes_dir=changes, compact=False)
    directory, report = ChangeDir(changes), FollowReport()
    assert not step(request, directory, report)
    _change(changes / "0001.jsonl", 1)  # a producer renamed it into place after 0002 was applied
    _change(changes / "0003.jsonl", 3)
    with caplog.at_level(logging.WARNING, logger="indexer.follow"):
        assert not step(request, directory, report)
    assert report.late == ["0001.jsonl"] and report.applied == 2
    assert any("0001.jsonl" in r.getMessage() and "NEVER applied" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="indexer.follow"):  # a new run cannot name it, but counts it
        assert follow(FollowRequest(root=root, changes_dir=changes, once=True)).applied == 0
    assert any("3 change files sorting at or before 0003.jsonl" in r.getMessage() and "applied 2" in r.getMessage()
               for r in caplog.records)


def test_a_batch_opens_each_segment_once(root: Path, tmp_path: Path) -> None:
    """K change files over S segments: each segment's docstore opened once by the batch, not once per file."""
    changes = tmp_path / "changes"
    changes.mkdir()
    for n in range(4):
        _change(changes / f"{n:04d}.jsonl", n)
    assert follow(FollowRequest(root=root, changes_dir=changes, once=True, compact=False)).versions == 1
    base = read_bundle_manifest(read_current(root))
    assert len(base.parts) == 5
    for n in range(4, 10):
        _change(changes / f"{n:04d}.jsonl", n)
    OPENED.clear()
    assert follow(FollowRequest(root=root, changes_dir=changes, once=True, compact=False)).applied == 6
    published = read_bundle_manifest(read_current(root))
    assert len(published.parts) == 11
    assert dict(OPENED) == {s.name: 1 for s in published.parts}  # the base's five and the batch's six, once each


def _changeset(n: int, delete: str) -> Changes:
    bake = Document(id=BAKE[0], title=BAKE[1], text=BAKE[2], metadata=json.dumps({"n": n}))
    return Changes(upserts=[bake], deletes={delete: f"set {n}:1"})


def test_a_batch_makes_what_one_change_set_at_a_time_makes(root: Path, tmp_path: Path) -> None:
    """The same change sets applied by one Batch and by apply_changes one after another (each opening every
    segment): the same manifests, file for file, but for the new segments' build times."""
    current = read_current(root)
    base = read_bundle_manifest(current)
    vectors = teacher_vectors(*VersionRequest(root=root).teacher_for(base))
    space = Space.of(current, base)
    sets = [_changeset(1, "bees"), _changeset(2, "git"), _changeset(3, "tides")]
    made = []
    for way in ("batch", "each"):
        staging = tmp_path / way
        staging.mkdir()
        link_version(current, base, staging)
        manifest = base
        if way == "batch":
            with Batch(staging, base) as batch:
                for i, changes in enumerate(sets):
                    manifest = batch.apply(manifest, changes, name=f"s{i}", space=space, vectors=vectors).manifest
        else:
            for i, changes in enumerate(sets):
                manifest = apply_changes(staging, manifest, changes, name=f"s{i}", space=space,
                                         vectors=vectors).manifest
        made.append(manifest.model_dump(exclude={"segments": {"__all__": {"build_time"}}}))
    assert made[0] == made[1]
    assert made[0]["count"] == base.count - 3 and len(made[0]["segments"]) == 4


def test_a_follower_loads_the_teacher_once_for_its_steps(root: Path, tmp_path: Path) -> None:
    """Each step encodes its new documents with the teacher, loaded by the first step and kept for the next (a
    follower at 1,000 documents a minute spent about 4 s of each step loading it), and its segment's agreement sample
    encodes its queries with that same teacher: one load for two steps of two encodings each."""
    from models.encoders.teacher_cache import release_teacher, teacher_loads

    release_teacher()
    before = teacher_loads()
    changes = tmp_path / "changes"
    changes.mkdir()
    for n in range(2):
        (changes / f"{n:04d}.jsonl").write_text(json.dumps({"_id": f"fresh-{n}", "title": "",
                                                            "text": f"a document no step has seen, number {n}"}))
        report = follow(FollowRequest(root=root, changes_dir=changes, once=True))
        assert report.applied == 1
    info = teacher_loads()
    assert (info.misses - before.misses, info.hits - before.hits) == (1, 3)
    bundle = Bundle(read_current(root))
    try:
        assert {"fresh-0", "fresh-1"} <= {d.id for d in documents(bundle, bundle.live_rows())}
    finally:
        bundle.close()
    release_teacher()
