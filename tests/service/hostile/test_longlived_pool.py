"""A long-lived server lets go of the students it no longer serves (issue 55, deliverable 6): ten student changes
(`tandem index follow --refresh-student` moves a student root's CURRENT, then the reload brings the new student in)
leave the pool holding the student in service and nothing else, whatever TANDEM_KEEP_VERSIONS: a version kept for
rollback keeps its bundle and lets its student go, and a rollback loads it again (or is refused, naming it, when it
no longer loads). Counted as objects, never as resident memory
(docs/operations.md#long-lived-processes-and-key-less-endpoints gives the measurement)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from models.encoders.student_root import set_current_student
from tests.fixtures.corpus import PROBES
from tests.fixtures.server import LiveServer
from tests.service.reload.test_service_reload import AUTH, admin_status, reload, search, serving, wait_for

pytestmark = pytest.mark.slow

CHANGES = 10


def _collections(server: LiveServer) -> Any:
    app: Any = server.server.config.app  # serve_app hands the FastAPI app to uvicorn's config
    return app.state.collections


def _students(tmp_path: Path, mini_student: Path) -> Path:
    """A student root with CHANGES + 1 students (copies of the mini one), CURRENT naming the first."""
    root = tmp_path / "students"
    for i in range(CHANGES + 1):
        shutil.copytree(mini_student, root / f"s{i}")
    set_current_student(root, "s0")
    return root


def _real(students: Path, i: int) -> str:
    return str((students / f"s{i}").resolve())


@pytest.mark.parametrize("keep", [0, 2])
def test_ten_student_changes_leave_the_pool_holding_only_the_students_served(
        tmp_path: Path, mini_root: Path, mini_student: Path, keep: int) -> None:
    students = _students(tmp_path, mini_student)
    with serving(mini_root, students, keep_versions=keep, agreement_budget_s=0) as server:
        pool = _collections(server).students
        assert len(pool) == 1
        for i in range(1, CHANGES + 1):
            set_current_student(students, f"s{i}")
            assert reload(server).status_code == 200
            assert search(server)["results"]  # the new student answers
        assert admin_status(server)["student"]["path"] == _real(students, CHANGES)
        # the one in service only: a version kept for rollback lets its student go once its last request ends
        # (on a thread of its own), and one swapped out for good closes likewise
        wait_for(lambda: len(pool) == 1, f"1 student held, not {len(pool)}")
        assert pool.holders() == {_real(students, CHANGES): 1}
        assert len(admin_status(server)["history"]) == keep  # the versions are kept all the same
        if keep:  # a rollback loads the previous version's student again, and lets the replaced one go
            assert server.client.post("/admin/rollback", headers=AUTH).status_code == 200
            assert search(server)["results"]
            wait_for(lambda: len(pool) == 1, f"1 student held after the rollback, not {len(pool)}")
            assert pool.holders() == {_real(students, CHANGES - 1): 1}
            assert admin_status(server)["student"]["path"] == _real(students, CHANGES - 1)


@pytest.mark.parametrize("keep", [0, 2])
def test_a_request_holding_the_old_student_finishes_on_it(tmp_path: Path, mini_root: Path,
                                                           mini_student: Path, keep: int) -> None:
    """The old student goes only after the last request holding its searcher (closed, or kept for rollback): leased
    across a change, it still encodes; once the lease ends the pool holds the new one only."""
    students = _students(tmp_path, mini_student)
    with serving(mini_root, students, keep_versions=keep, agreement_budget_s=0) as server:
        pool = _collections(server).students
        with _collections(server).default_collection().loader.lease() as old:
            set_current_student(students, "s1")
            assert reload(server).status_code == 200
            assert search(server)["results"]
            assert len(pool) == 2  # the leased searcher keeps its student open
            assert old.student.encode(["still answers"]).shape == (1, old.student.dim)
        wait_for(lambda: len(pool) == 1, "the old student let go once its last lease ended")
        assert list(pool.holders()) == [_real(students, 1)]


def _two_students(tmp_path: Path, mini_student: Path) -> Path:
    """A student root of two students that answer differently: s0 the mini one, s1 the same student whose manifest
    names its fp32 graph as the int8 one (another graph, the same teacher). CURRENT names s0."""
    root = tmp_path / "students"
    shutil.copytree(mini_student, root / "s0")
    shutil.copytree(mini_student, root / "s1")
    manifest = json.loads((root / "s1" / "student.json").read_text())
    manifest["onnx_int8"] = manifest["onnx_fp32"]
    (root / "s1" / "student.json").write_text(json.dumps(manifest))
    set_current_student(root, "s0")
    return root


def _answers(server: LiveServer) -> list[list[tuple[str, float]]]:
    return [[(hit["id"], hit["score"]) for hit in search(server, query)["results"]] for query in sorted(PROBES)[:4]]


def _changed(server: LiveServer, students: Path) -> list[list[tuple[str, float]]]:
    """s1 in service, s0's version kept with its student let go; s0's answers, recorded before the change."""
    pool = _collections(server).students
    before = _answers(server)
    set_current_student(students, "s1")
    assert reload(server).status_code == 200
    assert _answers(server) != before  # the students answer differently: the comparison below means something
    wait_for(lambda: len(pool) == 1, f"s0 let go once swapped out, {len(pool)} students held")
    assert pool.holders() == {_real(students, 1): 1}
    return before


def test_a_rollback_after_a_student_change_answers_with_the_old_student_again(
        tmp_path: Path, mini_root: Path, mini_student: Path) -> None:
    students = _two_students(tmp_path, mini_student)
    with serving(mini_root, students, agreement_budget_s=0) as server:  # TANDEM_KEEP_VERSIONS: the default, 2
        pool = _collections(server).students
        before = _changed(server, students)
        response = server.client.post("/admin/rollback", headers=AUTH)
        assert response.status_code == 200, response.text
        assert _answers(server) == before
        wait_for(lambda: len(pool) == 1, f"s1 let go after the rollback, {len(pool)} students held")
        assert pool.holders() == {_real(students, 0): 1}
        assert admin_status(server)["student"]["path"] == _real(students, 0)


def test_a_rollback_whose_student_is_gone_is_refused_and_the_service_keeps_answering(
        tmp_path: Path, mini_root: Path, mini_student: Path) -> None:
    students = _two_students(tmp_path, mini_student)
    with serving(mini_root, students, agreement_budget_s=0) as server:
        pool = _collections(server).students
        _changed(server, students)
        after = _answers(server)
        shutil.rmtree(students / "s0")
        response = server.client.post("/admin/rollback", headers=AUTH)
        assert response.status_code == 409, response.text
        assert _real(students, 0) in response.json()["message"]
        assert _answers(server) == after  # s1 still in service
        assert pool.holders() == {_real(students, 1): 1}
        status = admin_status(server)
        assert status["student"]["path"] == _real(students, 1)
        assert len(status["history"]) == 1  # still kept: the refusal changed nothing
