"""One writer at a time in a bundle root: ROOT/.lock, and the check that CURRENT still names a writer's base.

Every writer of a root holds its lock (`root_lock`): `index update` and `index compact` for their whole step, from
reading CURRENT as their base to moving CURRENT to the version they made, and `index follow` for each of its steps
(never while it sleeps between them), so two of them never work from the same base: the second waits, saying
whom it waits for, and then starts from the version the first published. A build, which reads no base, and
`index current --set`, which verifies a version first (every byte of it), hold it only while they place a version
or move CURRENT; before they do, `check_base` refuses to go on when CURRENT no longer names what it named when they
started: they exit non-zero naming both versions, and nothing is published. No writer silently undoes another's.

The lock is re-entrant within a thread (an update holding it publishes, which takes it again). `flock` is released
by the kernel when its holder dies (a SIGKILL included), so a crashed writer never leaves the root locked. Only
writers lock: the service reads roots that may be mounted read-only and never takes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from models.bundle.versions import POINTER
from models.errors import InputError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
LOCK_TIMEOUT_ENV = "TANDEM_LOCK_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
_POLL_S = 0.05
_held = threading.local()  # resolved root → how deep this thread holds its lock


class LockTimeout(InputError):
    """Another writer held the root's lock longer than this one would wait."""


class StaleBase(InputError):
    """CURRENT moved to another version while a writer worked from the one it named: nothing was published."""


def _timeout_s() -> float:
    value = os.environ.get(LOCK_TIMEOUT_ENV, "")
    try:
        return float(value) if value.strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        raise InputError(f"{LOCK_TIMEOUT_ENV}={value!r} is not a number of seconds") from None


def _holder(fd: int) -> str:
    """What the holder wrote into the lock file (its pid and command), for the waiting writer's message."""
    try:
        return os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown"
    except OSError:
        return "unknown"


@contextlib.contextmanager
def root_lock(root: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the root's writer lock, waiting up to `timeout_s` (default TANDEM_LOCK_TIMEOUT_S, 600 s) for it, with a
    warning naming its holder; LockTimeout past that. Re-entrant within a thread."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    key = str(root.resolve())
    depths: dict[str, int] = _held.__dict__.setdefault("depths", {})
    if depths.get(key):
        depths[key] += 1
        try:
            yield
        finally:
            depths[key] -= 1
        return
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        wait = _timeout_s() if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        warned = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{root} is locked by another writer, {_holder(fd)} (a build, update, "
                                      f"compaction, follow step or `index current --set`); waited {wait:g} s: try "
                                      f"again, or raise {LOCK_TIMEOUT_ENV}") from None
                if not warned:
                    log.warning("waiting for the writer lock of %s, held by another writer, %s (up to %g s, %s)",
                                root, _holder(fd), wait, LOCK_TIMEOUT_ENV)
                    warned = True
                time.sleep(_POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({Path(sys.argv[0]).name} {' '.join(sys.argv[1:3])})\n".encode(), 0)
        depths[key] = 1
        try:
            yield
        finally:
            depths.pop(key, None)
    finally:
        os.close(fd)  # releases the lock


def writer_step(root: Path | None) -> contextlib.AbstractContextManager[object]:
    """The lock a writer that starts from CURRENT holds for its whole step (none when it publishes no root)."""
    return root_lock(root) if root is not None else contextlib.nullcontext()


def current_name(root: Path) -> str | None:
    """The name ROOT/CURRENT holds, or None for a root without one (yet). Not checked: a build may repair a root
    whose pointer names no bundle, and comparing names is all a base check needs."""
    try:
        return (Path(root) / POINTER).read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        return None


def check_base(root: Path, base: str | None, what: str) -> None:
    """Under the root's lock, before publishing: CURRENT must still name `base`, the version `what` started from."""
    now = current_name(root)
    if now != base:
        raise StaleBase(f"{root}/CURRENT moved from {base or '(none)'} to {now} while this {what} ran: nothing was "
                        f"published, so {now} and what it holds stay in service; run it again to start from {now}")
