"""Each process of `tandem serve --processes N` follows the group's change log (service.core.processes).

A daemon thread polls the log every FOLLOW_INTERVAL_S (a read of one small file) and hands a newer
change to the process's Reloader, which applies it on its reload thread and records it in this
process's status file. It reports the process's first version once the initial load is done, so an
admin call waiting for "every process" knows this one exists. It never dies: an error is logged and
the next poll tries again.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import CancelledError

from service.core.loader import LoadState, SearcherLoader
from service.core.processes import ProcessGroup
from service.core.reload import Reloader

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 0.2


class ChangeFollower:
    def __init__(self, group: ProcessGroup, reloader: Reloader, loader: SearcherLoader,
                 interval_s: float = FOLLOW_INTERVAL_S) -> None:
        self._group, self._reloader, self._loader, self._interval_s = group, reloader, loader, interval_s
        self._reported = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._poll()
            except Exception:
                log.exception("following the process group's changes failed; trying again")

    def _poll(self) -> None:
        if self._loader.state[0] is LoadState.LOADING:
            return  # changes wait for the initial load, as admin reloads do
        if not self._reported:
            current = self._reloader.status().current
            self._group.applied_to(0, current.version if current else None, current.path if current else None)
            self._reported = True
        change = self._group.latest()
        if change is None or change.sequence <= self._group.applied:
            return
        log.info("following change %d (%s by process %d): %s", change.sequence, change.action, change.pid, change.path)
        try:
            self._reloader.follow(change).result()
        except (CancelledError, RuntimeError):  # the reload thread is shut down: this process is stopping
            self._stop.set()
