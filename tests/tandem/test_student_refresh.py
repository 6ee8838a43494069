"""`tandem index follow --refresh-student`: a follower that adds another domain refreshes the student and publishes
it under the student root's CURRENT; below the trigger it leaves the student alone.

Mechanics (the trigger's count, a real refresh through the parity gate, the publish, the student kept), so on the
tiny teacher and mini student (tests/fixtures/tiny_service.py); the refresh itself, on the real teacher and student,
is tests/models/distill/test_refresh.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from indexer.follow import FollowRequest, follow
from models.bundle.versions import read_current
from models.encoders.student import read_student_manifest
from models.encoders.student_root import current_student
from models.errors import InputError
from tandem.student_refresh import StudentRefresher, unseen_documents
from tests.models.distill.test_refresh import NEW_DOCS


def _setup(tmp_path: Path, mini_root: Path, mini_student: Path) -> tuple[Path, Path, Path]:
    root, students, changes = tmp_path / "root", tmp_path / "students", tmp_path / "changes"
    shutil.copytree(mini_root, root, symlinks=True)
    shutil.copytree(mini_student, students / "first")
    (students / "CURRENT").write_text("first\n")
    changes.mkdir()
    (changes / "0001.jsonl").write_text("".join(json.dumps({"_id": f"py-{i}", "title": t, "text": x}) + "\n"
                                                for i, (t, x) in enumerate(NEW_DOCS)))
    return root, students, changes


def test_a_follower_refreshes_the_student_on_the_domain_it_added(tmp_path: Path, mini_root: Path, mini_student: Path,
                                                                  mini_teacher: Path, mini_backbone: Path) -> None:
    root, students, changes = _setup(tmp_path, mini_root, mini_student)
    refresher = StudentRefresher(students, unseen_documents(len(NEW_DOCS)), teacher=mini_teacher,
                                 backbone=mini_backbone)
    refresher.check()
    report = follow(FollowRequest(root=root, changes_dir=changes, once=True, after_publish=refresher,
                                  teacher=mini_teacher))
    assert report.applied == 1
    published = current_student(students)
    assert published.name != "first"
    manifest = read_student_manifest(published)
    assert manifest.trained_on is not None and manifest.parity is not None
    assert manifest.trained_on.bundle == str(read_current(root).resolve())
    assert manifest.trained_on.refreshes[-1].documents == len(NEW_DOCS)
    assert (students / "first" / "student.json").is_file()  # the student in service until then is kept


def test_below_the_trigger_the_student_stays(tmp_path: Path, mini_root: Path, mini_student: Path,
                                             mini_teacher: Path) -> None:
    root, students, changes = _setup(tmp_path, mini_root, mini_student)
    refresher = StudentRefresher(students, unseen_documents(len(NEW_DOCS) + 1), teacher=mini_teacher)
    follow(FollowRequest(root=root, changes_dir=changes, once=True, after_publish=refresher, teacher=mini_teacher))
    assert current_student(students) == students / "first"
    assert sorted(p.name for p in students.iterdir()) == ["CURRENT", "first"]


def test_a_plain_student_directory_is_not_a_student_root(tmp_path: Path) -> None:
    plain = tmp_path / "student"
    plain.mkdir()
    (plain / "student.json").write_text("{}")
    with pytest.raises(InputError, match="not a student root"):
        StudentRefresher(plain, unseen_documents(1)).check()
