"""The CURRENT-pointer watcher: a bundle root's new version is reloaded without an admin call.

The indexer publishes a version by rewriting ROOT/CURRENT; `PointerWatcher` polls it and hands a change to the
Reloader (service.core.reload), which validates and swaps as for POST /admin/reload.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from models.bundle.versions import POINTER
from service.redact import printable

log = logging.getLogger(__name__)


Stamp = tuple[tuple[str, int, int], ...]
_MAX_BACKOFF_S = 60.0


def _stamp(directory: Path) -> Stamp | None:
    """Names, sizes and mtimes of a version's files: a refused version is tried again when they change."""
    try:
        return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()))
    except (OSError, ValueError):
        return None


class PointerWatcher:
    """Polls ROOT/CURRENT every `interval_s`; a changed name calls `on_change`, which reloads, waits and returns
    the outcome ("ok", "rejected", or None to try again later).

    A refused version is not retried every poll, only once its files change (or POST /admin/reload retries it).
    The thread never dies: an error while polling is logged and the next poll waits longer (up to a minute).
    """

    def __init__(self, root: Path, interval_s: float, on_change: Callable[[], str | None]) -> None:
        self.root, self.interval_s, self._on_change = root, interval_s, on_change
        self._seen = self._read()
        self._refused = False  # CURRENT still names a version that was refused...
        self._refused_stamp: Stamp | None = None  # ...when its files looked like this
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _read(self) -> str | None:
        try:
            raw = (self.root / POINTER).read_bytes()
        except OSError as exc:
            log.warning("cannot read %s: %s", printable(self.root / POINTER), printable(exc))
            return None
        return raw.decode("utf-8", errors="backslashreplace").strip()

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(min(self.interval_s * 2**failures, max(self.interval_s, _MAX_BACKOFF_S))):
            try:
                self._poll()
                failures = 0
            except Exception:
                failures = min(failures + 1, 16)
                log.exception("watching %s failed; retrying with backoff", printable(self.root / POINTER))

    def _poll(self) -> None:
        name = self._read()
        if name is None:
            return
        if name == self._seen:
            if not self._refused or _stamp(self.root / name) == self._refused_stamp:
                return
            log.info("%s: the refused version %s changed on disk; trying it again", printable(self.root / POINTER),
                     printable(name))
        else:
            log.info("%s changed: %s → %s", printable(self.root / POINTER), printable(self._seen), printable(name))
        stamp = _stamp(self.root / name)
        outcome = self._on_change()
        if outcome is not None:
            self._seen = name
            self._refused, self._refused_stamp = outcome == "rejected", stamp
