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
