"""`tandem serve --config FILE` re-read: on SIGHUP and when the file changes (polled, as the key file is), the
collections it declares are compared with those served, and only the difference is applied.

- a collection added starts loading at once (listed as loading; searchable once loaded, as at startup);
- a collection removed leaves the routes at once; its requests in flight finish on the searcher they hold, which is
  closed after the last of them (SearcherLoader.drain);
- a collection whose index or student changed is removed and added again (it answers 503 while the new one loads:
  to swap a version without a gap, use POST /admin/collections/{name}/reload);
- a collection unchanged is untouched (its searcher, its reloader, its history).

A file that does not read or validate keeps every collection served and logs why, naming the file and line
(service.collections_config.read_config). Collections from `--collection` flags and `--index/--student` are not
the file's: they stay. The default collection (POST /search) is chosen at startup and never removed by a reload.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from models.errors import InputError
from service.collections_config import read_config
from service.core.collections import CollectionSet
from service.file_watch import FileWatch
from service.redact import printable
from service.settings import CollectionSpec, check_unique

log = logging.getLogger(__name__)


class CollectionsConfigReloader:
    """Watches the --config file and applies its changes to `collections`; `on_change` runs after each change
    applied (the keyring re-checks its keys' filters against the collections now served)."""

    def __init__(self, path: Path, collections: CollectionSet, interval_s: float, from_file: Sequence[str],
                 on_change: Callable[[], None] = lambda: None) -> None:
        """`from_file`: the collections the file declared when `tandem serve` read it (settings.config_collections);
        what is not the file's (flags, --index/--student) stays whatever the file says."""
        self.path, self._collections, self._on_change = path, collections, on_change
        self._watch = FileWatch(path, interval_s, self.reload, "tandem-config")  # SIGHUP and the file's changes
        self._fixed = [spec for spec in collections.specs() if spec.name not in from_file]
        self.reloads = 0
        self._lock = threading.Lock()  # one reload at a time (the watch and SIGHUP)

    def reload(self, why: str) -> bool:
        """Re-read the file and apply it; False (the collections served kept) when it does not read or validate."""
        with self._lock:
            self._watch.mark()
            try:
                wanted = self._fixed + read_config(self.path)
                check_unique(wanted)
            except (InputError, ValueError) as exc:
                log.error("--config reload (%s) refused, the collections served stay: %s", why, printable(exc))
                return False
            changed = self._apply({spec.name: spec for spec in wanted})
            if changed is None:
                return False
            self.reloads += 1
        if changed:
            self._on_change()
        return True

    def _apply(self, wanted: dict[str, CollectionSpec]) -> bool | None:
        """Whether anything changed; None: refused, nothing applied."""
        served = {spec.name: spec for spec in self._collections.specs()}
        removed = [n for n, spec in served.items() if n not in wanted or wanted[n] != spec]
        added = [spec for n, spec in wanted.items() if n not in served or served[n] != spec]
        if self._collections.default in removed:
            log.error("--config reload refused: it removes or changes the default collection %r (POST /search), "
                      "which stays until restart; the collections served stay", self._collections.default)
            return None
        for name in removed:
            self._collections.remove(name)
            log.info("collection %r removed by --config: it closes after its requests in flight", name)
        for spec in added:
            self._collections.add(spec)
            log.info("collection %r added by --config: loading %s with student %s", spec.name,
                     printable(spec.index), printable(spec.student))
        return bool(removed or added)

    def start(self) -> None:
        """Watch the file and, on the main thread, take SIGHUP (the key file's handler, taken before, still runs)."""
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()
