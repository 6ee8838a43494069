"""Students under one root, and the `CURRENT` pointer naming the one in service, as bundle roots have.

Layout: `ROOT/<name>/` holds complete student directories (each published atomically: models.bundle.staging) and
`ROOT/CURRENT` is a one-line text file naming the one in service, replaced by rename, so a reader sees the old
name or the new one. `tandem index follow --refresh-student ROOT` publishes refreshed students this way, and
`tandem serve --student ROOT` serves the one CURRENT names (picking up a new one at its next reload).
"""

from __future__ import annotations

from pathlib import Path

from models.atomic import read_pointer, write_pointer
from models.encoders.student_manifest import STUDENT_MANIFEST
from models.errors import ContractMismatch
from models.paths import is_plain_name

POINTER = "CURRENT"


def is_student_root(path: Path) -> bool:
    return (Path(path) / POINTER).is_file() and not (Path(path) / STUDENT_MANIFEST).is_file()


def current_student(root: Path) -> Path:
    """The student directory `root/CURRENT` names."""
    pointer = Path(root) / POINTER
    name = read_pointer(pointer, "current-student")
    if not is_plain_name(name):
        raise ContractMismatch(f"{pointer} names {name!r}: not a plain directory name")
    student = Path(root) / name
    if not (student / STUDENT_MANIFEST).is_file():
        raise ContractMismatch(f"{pointer} names {name!r}, but {student} is not a student directory")
    return student


def resolve_student(path: Path) -> Path:
    """A student directory as given, or the current one when `path` is a student root."""
    return current_student(path) if is_student_root(path) else Path(path)


def set_current_student(root: Path, name: str) -> None:
    """Point `root/CURRENT` at the student `name` atomically (write a temporary file, fsync, rename)."""
    if not is_plain_name(name) or not (Path(root) / name / STUDENT_MANIFEST).is_file():
        raise ContractMismatch(f"{Path(root) / name} is not a student directory; refusing to point "
                               f"{Path(root) / POINTER} at it")
    write_pointer(Path(root) / POINTER, name)
