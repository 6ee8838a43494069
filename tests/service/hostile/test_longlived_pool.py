"""A long-lived server lets go of the students it no longer serves (issue 55, deliverable 6): ten student changes
(`tandem index follow --refresh-student` moves a student root's CURRENT, then the reload brings the new student in)
leave the pool holding the students served, in service or kept for rollback, and nothing else. Counted as objects,
never as resident memory (docs/operations.md#long-lived-processes-and-key-less-endpoints gives the measurement)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from models.encoders.student_root import set_current_student
from tests.fixtures.server import LiveServer
from tests.service.reload.test_service_reload import AUTH, admin_status, reload, search, serving, wait_for

pytestmark = pytest.mark.slow

CHANGES = 10


def _collections(server: LiveServer) -> Any:
    app: Any = server.server.config.app  # serve_app hands the FastAPI app to uvicorn's config
    return app.state.collections


def _students(tmp_path: Path, tiny_student: Path) -> Path:
    """A student root with CHANGES + 1 students (copies of the tiny one), CURRENT naming the first."""
    root = tmp_path / "students"
    for i in range(CHANGES + 1):
        shutil.copytree(tiny_student, root / f"s{i}")
    set_current_student(root, "s0")
    return root


def _real(students: Path, i: int) -> str:
    return str((students / f"s{i}").resolve())


@pytest.mark.parametrize("keep", [0, 2])
def test_ten_student_changes_leave_the_pool_holding_only_the_students_served(
        tmp_path: Path, tiny_root: Path, tiny_student: Path, keep: int) -> None:
    students = _students(tmp_path, tiny_student)
    with serving(tiny_root, students, keep_versions=keep, agreement_budget_s=0) as server:
        pool = _collections(server).students
        assert len(pool) == 1
        for i in range(1, CHANGES + 1):
            set_current_student(students, f"s{i}")
            assert reload(server).status_code == 200
            assert search(server)["results"]  # the new student answers
        assert admin_status(server)["student"]["path"] == _real(students, CHANGES)
        # the one in service, and one per version kept for rollback (a version keeps the student it served with);
        # a swapped-out version closes on a thread of its own, after its last request
        wait_for(lambda: len(pool) == keep + 1, f"{keep + 1} student(s) held, not {len(pool)}")
        assert pool.holders() == {_real(students, CHANGES - i): 1 for i in range(keep + 1)}
        if keep:  # a rollback brings the previous version back with its student, and lets the replaced one go
            assert server.client.post("/admin/rollback", headers=AUTH).status_code == 200
            assert search(server)["results"]
            wait_for(lambda: len(pool) == keep, f"{keep} student(s) held after the rollback, not {len(pool)}")
            assert admin_status(server)["student"]["path"] == _real(students, CHANGES - 1)


def test_a_request_holding_the_old_student_finishes_on_it(tmp_path: Path, tiny_root: Path,
                                                           tiny_student: Path) -> None:
    """The old student closes only after the last request holding its searcher: leased across a change, it still
    encodes; once the lease ends the pool holds the new one only."""
    students = _students(tmp_path, tiny_student)
    with serving(tiny_root, students, keep_versions=0, agreement_budget_s=0) as server:
        pool = _collections(server).students
        with _collections(server).default_collection().loader.lease() as old:
            set_current_student(students, "s1")
            assert reload(server).status_code == 200
            assert search(server)["results"]
            assert len(pool) == 2  # the leased searcher keeps its student open
            assert old.student.encode(["still answers"]).shape == (1, old.student.dim)
        wait_for(lambda: len(pool) == 1, "the old student let go once its last lease ended")
        assert list(pool.holders()) == [_real(students, 1)]
