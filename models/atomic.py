"""Durable writes: a file replaced by rename after fsync, and the directory entry made durable too.

A reader sees the old file or the new one, never a torn write, and a crash after the rename
keeps the new one: the temporary name is unique, so concurrent writers never share it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from models.errors import ContractMismatch


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write through `write` to a uniquely named temporary file, fsync it, rename it over `path`, fsync the dir."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_pointer(pointer: Path, name: str) -> None:
    """Replace `pointer` (a one-line text file naming a directory beside it: a root's CURRENT) by rename, so a
    reader sees the old name or the new one, never a torn write."""
    atomic_write(pointer, lambda fh: fh.write(f"{name}\n".encode()))


def read_pointer(pointer: Path, what: str) -> str:
    """The name `pointer` holds; ContractMismatch naming the file (and `what` it points at) if it cannot be read."""
    try:
        return pointer.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ContractMismatch(f"{pointer}: cannot read the {what} pointer: {exc}") from exc
    except UnicodeDecodeError:
        raise ContractMismatch(f"{pointer}: the {what} pointer is not UTF-8 text") from None
