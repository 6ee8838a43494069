"""Atomic publication of an output directory: stage beside the target, fsync, rename.

A crash at any point leaves either the old directory or the new one under the final name,
never a half-written one (staging names start with a dot and are removed on failure).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from models.errors import InputError


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(directory)


def check_target(out: Path, force: bool) -> None:
    """Fail before any expensive work if publishing would clobber a directory without --force."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if out.exists() and not force:
        raise InputError(f"{out} already exists; pass --force to replace it")


@contextlib.contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """Yield a staging directory; on success publish it as `out`, on failure remove it."""
    out = Path(out).absolute()
    check_target(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        fsync_tree(staging)
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            out.rename(old)
            staging.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(out)
        _fsync_dir(out.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
