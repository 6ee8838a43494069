"""A configuration file re-read while serving: on SIGHUP, and when its identity (inode, size, mtime) changes, polled.

Shared by the key file (service.http.keyring.KeySource) and the collections config (service.collections_reload):
each gives a `reload(why)` that re-reads the file and calls `mark()` first, under its own lock, so a change made
while it reads is seen by the next poll. The stat follows links, so a Kubernetes secret swapped as a link counts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.redact import printable

log = logging.getLogger(__name__)

Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class FileWatch:
    """Calls `reload(why)` on SIGHUP (on the main thread only; the handler before it still runs) and, every
    `interval_s` (0: never), when the file's stamp differs from the one `mark()` took last."""

    def __init__(self, path: Path, interval_s: float, reload: Callable[[str], object], name: str) -> None:
        self.path, self.interval_s, self._reload, self._name = path, interval_s, reload, name
        self._stamp = _stamp(path)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_hup: Any = None
        self._took_hup = False

    def mark(self) -> None:
        """The file as it is now is the one being read."""
        self._stamp = _stamp(self.path)

    def start(self) -> None:
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._watch, name=self._name, daemon=True)
            self._thread.start()
        try:
            self._previous_hup = signal.signal(signal.SIGHUP, self._on_hup)
            self._took_hup = True
        except ValueError:  # not the main thread (tests serve from a thread): the file watch alone
            pass

    def _on_hup(self, signum: int, frame: object) -> None:
        # a signal handler must not block on the lock a reload holds
        threading.Thread(target=self._reload, args=("SIGHUP",), name=f"{self._name}-hup", daemon=True).start()
        if callable(self._previous_hup):
            self._previous_hup(signum, frame)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if _stamp(self.path) != self._stamp:
                    self._reload("file changed")
            except Exception:  # the watch never dies
                log.exception("watching %s failed", printable(self.path))

    def stop(self) -> None:
        self._stop.set()
        if self._took_hup:
            signal.signal(signal.SIGHUP, self._previous_hup)
            self._took_hup = False
        if self._thread is not None:
            self._thread.join(timeout=10)
