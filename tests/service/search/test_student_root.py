"""`tandem serve --student ROOT`: the student its CURRENT names serves, and a reload after the pointer moved (what
`tandem index follow --refresh-student` does) brings the new student in with the version; a pointer naming no
student is refused and the student in service stays."""

from __future__ import annotations

import shutil
from pathlib import Path

from models.encoders.student_root import set_current_student
from tests.service.reload.test_service_reload import admin_status, reload, search, serving


def test_a_reload_after_the_student_root_s_pointer_moved_serves_the_new_student(
        tmp_path: Path, tiny_root: Path, tiny_student: Path) -> None:
    students = tmp_path / "students"
    shutil.copytree(tiny_student, students / "first")
    shutil.copytree(tiny_student, students / "second")
    set_current_student(students, "first")
    with serving(tiny_root, students) as server:
        assert admin_status(server)["student"]["path"] == str((students / "first").resolve())
        set_current_student(students, "second")
        assert reload(server).status_code == 200
        assert admin_status(server)["student"]["path"] == str((students / "second").resolve())
        assert search(server)["results"][0]["id"] == "bake"
        (students / "CURRENT").write_text("gone\n")  # names no student: the reload is refused
        assert reload(server).status_code == 409
        assert admin_status(server)["student"]["path"] == str((students / "second").resolve())
