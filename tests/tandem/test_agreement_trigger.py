"""The follower's refresh trigger is the student's agreement with the teacher (models.agreement): a segment of another
domain (the demo corpus's standard-library docstrings) below the threshold triggers it, a segment of the student's
own domain does not, and a segment without an agreement sample falls back to the count of unseen documents. Real
models throughout (the tiny student, the teacher), as tests/indexer/test_agreement_check.py, whose grown root
(the run's `drift_root`, tests/fixtures/bundle.py) is the segment of another domain here too."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from indexer.check import check
from indexer.follow import FollowReport, FollowRequest, follow
from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.sample import SAMPLE_FILES
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import read_current
from models.distill.pick import pick_segments
from models.distill.refresh import RefreshRequest, new_segments, run_refresh
from models.encoders.student import read_student_manifest
from models.encoders.student_root import current_student
from models.errors import InputError
from tandem.student_refresh import StudentRefresher, below_agreement
from tests.fixtures.bundle import DRIFT_DOCS as DEMO_DOCS
from tests.fixtures.corpus import DOCS


def _in_domain() -> list[dict[str, str]]:
    """The student's own documents again under new ids: the domain it was distilled on."""
    return [{"_id": f"{doc_id}-again", "title": title, "text": text} for doc_id, title, text in DOCS]


@pytest.fixture
def other_root(drift_root: Path) -> Path:
    """The tiny root grown by a segment of standard-library docstrings, shared by the run: the tests only read it."""
    return drift_root


@dataclass(frozen=True)
class Followed:
    """A copy of the tiny root after a follower applied the student's own documents again (one change file), with a
    refresher over a students directory holding the tiny student (`first`) watching the agreement after publishing."""

    root: Path
    students: Path
    report: FollowReport


@pytest.fixture(scope="module")
def followed(tiny_root: Path, tiny_student: Path, tmp_path_factory: pytest.TempPathFactory) -> Followed:
    """Built once for the module: the segment of the student's own domain costs a teacher load (its sample's
    queries), which the follower's test and the tests of the trigger and of distill --from on that segment share.
    They only read it."""
    work = tmp_path_factory.mktemp("own")
    root, students, changes = work / "root", work / "students", work / "changes"
    shutil.copytree(tiny_root, root, symlinks=True)
    shutil.copytree(tiny_student, students / "first")
    (students / "CURRENT").write_text("first\n")
    changes.mkdir()
    (changes / "0001.jsonl").write_text("".join(json.dumps(line) + "\n" for line in _in_domain()))
    refresher = StudentRefresher(students, below_agreement(min_documents=1))
    refresher.check()
    report = follow(FollowRequest(root=root, changes_dir=changes, once=True, after_publish=refresher))
    return Followed(root=root, students=students, report=report)


@pytest.fixture
def own_root(followed: Followed) -> Path:
    return followed.root


def test_the_trigger_fires_on_a_segment_of_another_domain_below_the_threshold(other_root: Path,
                                                                               tiny_student: Path) -> None:
    version = read_current(other_root)
    (_, added) = read_bundle_manifest(version).parts
    report = check(other_root, tiny_student)
    assert report.below == [added.name]  # the same verdict as `tandem index check`
    assert below_agreement(min_documents=10**6)(version, tiny_student) == [added.name]


def test_the_trigger_stays_quiet_on_a_segment_of_the_students_own_domain(own_root: Path, tiny_student: Path) -> None:
    version = read_current(own_root)
    manifest = read_bundle_manifest(version)
    unseen = new_segments(version, manifest, read_student_manifest(tiny_student), None)
    assert len(unseen) == 1
    pick = pick_segments(version, manifest, tiny_student, unseen)
    assert pick.agree == unseen and pick.below == [] and pick.unknown == []
    assert below_agreement(min_documents=1)(version, tiny_student) == []


def test_a_follower_adding_the_students_own_domain_leaves_it_in_service(followed: Followed) -> None:
    students = followed.students
    assert followed.report.applied == 1
    assert current_student(students) == students / "first"
    assert sorted(p.name for p in students.iterdir()) == ["CURRENT", "first"]


def _without_samples(root: Path, work: Path) -> Path:
    """A copy of `root`'s current version with its segments' agreement samples removed (a bundle from before)."""
    version = work / "old"
    shutil.copytree(read_current(root), version)  # files, not links: the root's own samples stay
    manifest = read_bundle_manifest(version)
    sampled = {n for n in manifest.files if Path(n).name in SAMPLE_FILES}
    for name in sampled:
        (version / name).unlink()
    files = {n: h for n, h in manifest.files.items() if n not in sampled}
    (version / BUNDLE_MANIFEST).write_text(manifest.model_copy(update={"files": files}).model_dump_json())
    return version


def test_without_samples_the_unseen_document_count_decides(other_root: Path, tiny_student: Path,
                                                           tmp_path: Path) -> None:
    version = _without_samples(other_root, tmp_path)
    (_, added) = read_bundle_manifest(version).parts
    pick = pick_segments(version, read_bundle_manifest(version), tiny_student, [added.name])
    assert pick.unknown == [added.name] and pick.below == []
    assert below_agreement(min_documents=DEMO_DOCS)(version, tiny_student) == [added.name]
    assert below_agreement(min_documents=DEMO_DOCS + 1)(version, tiny_student) == []


def test_distill_from_without_a_segment_refuses_when_the_student_agrees_everywhere(own_root: Path, tiny_student: Path,
                                                                                   tmp_path: Path) -> None:
    with pytest.raises(InputError, match="agrees with the teacher on every segment it has not seen"):
        run_refresh(RefreshRequest(student=tiny_student, index=own_root, out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()
