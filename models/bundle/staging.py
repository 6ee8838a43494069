"""Atomic publication of an output directory: stage beside the target, fsync, rename.

A crash at any point leaves either the old directory or the new one under the final name,
never a half-written one and never nothing (staging names start with a dot and are removed on
failure). Replacing an existing directory (`--force`) swaps the two in one `renameat2` call
(RENAME_EXCHANGE); where the kernel or file system cannot, the replacement is refused rather
than done in two renames with a gap between them. A new name is taken with RENAME_NOREPLACE,
so two writers of the same name cannot overwrite each other: the second one fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from models.atomic import fsync_dir
from models.errors import InputError

_AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


def _renameat2() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not Linux, or a libc older than glibc 2.28
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def rename2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(src, dst, flags): True when done, False when unsupported here; OSError otherwise."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(dst))


def fsync_tree(directory: Path) -> None:
    """fsync every file and directory below `directory` (a bundle's lexical/ too), then `directory` itself."""
    for path in directory.iterdir():
        if path.is_dir() and not path.is_symlink():
            fsync_tree(path)
        elif path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(directory)


def check_target(out: Path, force: bool) -> None:
    """Fail before any expensive work if publishing would clobber a directory without --force."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if out.exists() and not force:
        raise InputError(f"{out} already exists; pass --force to replace it")


def place(staging: Path, out: Path, force: bool) -> None:
    """Rename the complete `staging` to `out`: never over an existing one without `force`, and with it by an
    atomic exchange (the old directory, now under the staging name, is then removed)."""
    if out.exists():
        if not force:
            raise InputError(f"{out} was published by another writer meanwhile; it is never overwritten")
        if not rename2(staging, out, RENAME_EXCHANGE):
            raise InputError(f"cannot replace {out} atomically on this system (no renameat2 RENAME_EXCHANGE); "
                             "remove it first, or publish under another name")
        shutil.rmtree(staging, ignore_errors=True)  # the old version
        return
    try:
        if not rename2(staging, out, RENAME_NOREPLACE):
            os.rename(staging, out)  # fails over a non-empty directory; an empty one holds nothing to lose
    except FileExistsError:
        raise InputError(f"{out} was published by another writer meanwhile; it is never overwritten") from None
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            raise InputError(f"{out} was published by another writer meanwhile; it is never overwritten") from None
        raise


@contextlib.contextmanager
def staged(out: Path, force: bool, lock: Callable[[], AbstractContextManager[object]] | None = None,
           after: Callable[[], None] | None = None) -> Iterator[Path]:
    """Yield a staging directory; on success publish it as `out`, on failure remove it.

    `lock` (a context factory) is held while the directory is placed and while `after` runs, e.g. a
    bundle root's writer lock around the rename and the CURRENT pointer's move.
    """
    out = Path(out).absolute()
    check_target(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        fsync_tree(staging)
        with lock() if lock is not None else contextlib.nullcontext():
            place(staging, out, force)
            fsync_dir(out.parent)
            if after is not None:
                after()
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
