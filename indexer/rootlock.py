"""One writer at a time in a bundle root: publish, prune and `index current --set` take ROOT/.lock.

Without it they race: a build with `--keep` reads CURRENT, another process moves CURRENT to an old
version, and the prune deletes exactly that version. `flock` is released by the kernel when its
holder dies (a SIGKILL included), so a crashed writer never leaves the root locked. Only writers
lock: the service reads roots that may be mounted read-only and never takes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from models.errors import InputError

LOCK_FILE = ".lock"
LOCK_TIMEOUT_ENV = "TANDEM_LOCK_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
_POLL_S = 0.05


def _timeout_s() -> float:
    value = os.environ.get(LOCK_TIMEOUT_ENV, "")
    try:
        return float(value) if value.strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        raise InputError(f"{LOCK_TIMEOUT_ENV}={value!r} is not a number of seconds") from None


@contextlib.contextmanager
def root_lock(root: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the root's writer lock, waiting up to `timeout_s` (default TANDEM_LOCK_TIMEOUT_S, 600 s) for it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + (_timeout_s() if timeout_s is None else timeout_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise InputError(f"{root} is locked by another writer (a build, update, prune or "
                                     f"`index current --set`); try again, or raise {LOCK_TIMEOUT_ENV}") from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock
