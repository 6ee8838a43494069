"""Hot reload: validate a bundle off the event loop, swap it in atomically, keep previous versions for rollback.

One reload thread runs reloads and rollbacks in order, so POST /admin/reload, POST /admin/rollback
and the CURRENT-pointer watcher never race each other. A candidate must pass verification (the sha256
of every file it does not share, as the very file, with the version in service: loader.open_bundle), the
student/teacher check, a FAISS load and a warm-up query before it is swapped in; any failure leaves the
version in service untouched and is recorded as the last outcome.
Swapped-out versions keep their bundle loaded (up to TANDEM_KEEP_VERSIONS), so a rollback survives the indexer
pruning their files; older ones are closed once the requests holding them have finished. A kept version lets its
student go once its last request has finished (the pool keeps one a searcher in service shares), so the process
holds one student per collection however many versions it keeps; a rollback takes the kept version's student
again (loaded from its directory, checked as a reload checks one) before swapping it in, and is refused, naming
the directory, when it no longer loads: the version in service keeps serving.

With `--processes N` each process has its own Reloader, and one in a ProcessGroup (service.core.processes)
logs every change it makes (an admin reload or rollback, or its watcher's reload) to the group's shared
log; `follow` applies a change another process logged, on the same reload thread, so a change and the
logging of it are never interleaved with another. With one process there is no group and nothing changes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from models.bundle.versions import POINTER, is_bundle_root, read_current, resolve_bundle
from models.encoders.student_root import resolve_student
from models.errors import ContractMismatch
from models.manifest_io import utc_now
from service.core.loader import LoadState, NotReady, SearcherLoader, StudentUnavailable
from service.core.memory import mapped_bytes
from service.core.outcomes import (
    AdminStatus,
    AgreementInfo,
    MemoryInfo,
    ReloadOutcome,
    StudentInfo,
    Trigger,
    VersionInfo,
)
from service.core.processes import Change, ProcessGroup
from service.core.searcher import Searcher
from service.core.watch import PointerWatcher
from service.redact import printable, public_error
from service.runtime.descriptors import TooManyOpenFiles
from service.settings import ServiceSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


class ReloadMetrics(Protocol):
    """What the reload path reports to service.metrics.Metrics (duck-typed: the service runs without it)."""

    def observe_reload(self, outcome: str) -> None: ...
    def set_index(self, version: str, count: int, load_seconds: float) -> None: ...


class BadReloadRequest(ValueError):
    """The request cannot name a bundle (no path and no bundle root, or not a directory): a 422."""


class ForbiddenReload(ValueError):
    """The path lies outside the directories this service may load bundles from: a 403."""


def version_info(searcher: Searcher) -> VersionInfo:
    """What /admin/* says of a loaded version."""
    manifest = searcher.bundle.manifest
    loaded = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(searcher.loaded_at))
    bundle = searcher.bundle
    return VersionInfo(version=searcher.version, build_time=manifest.build_time, count=manifest.count,
                       path=str(bundle.directory), loaded_at=loaded, segments=len(manifest.parts),
                       deleted=manifest.deleted, shared_segments=bundle.reused)


def student_info(searcher: Searcher) -> StudentInfo:
    """What /admin/status says of the student in service, provenance included."""
    student = searcher.student
    manifest = student.manifest
    return StudentInfo(path=str(student.directory), precision=student.precision, teacher=manifest.teacher.name,
                       created=manifest.created, trained_on=manifest.trained_on)


class Reloader:
    """Owns the reload thread, the history of previous versions and the pointer watcher."""

    def __init__(self, settings: ServiceSettings, loader: SearcherLoader, metrics: ReloadMetrics | None = None,
                 group: ProcessGroup | None = None) -> None:
        self._settings, self._loader, self._metrics, self.group = settings, loader, metrics, group
        self.root = Path(settings.index) if is_bundle_root(settings.index) else None
        self.allowed = allowed_dirs(settings)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-reload")
        self._lock = threading.Lock()  # history, last outcome, pending count: read by the event loop
        self._history: deque[Searcher] = deque()
        self._last: ReloadOutcome | None = None
        self._pending = 0
        self._watcher: PointerWatcher | None = None
        self.agreement: Callable[[], AgreementInfo | None] | None = None  # the collection's monitor's status
        if self.root is not None and settings.watch_interval_s > 0:
            # Created (and the pointer first read) before the initial load starts, so no change is missed.
            self._watcher = PointerWatcher(self.root, settings.watch_interval_s, self._on_pointer_change)

    def start(self) -> None:
        if self._watcher is not None:
            log.info("watching %s every %g s for new versions", self._watcher.root / POINTER, self._watcher.interval_s)
            self._watcher.start()

    # --- requests -------------------------------------------------------------------------------------

    def reload(self, path: Path | None, trigger: Trigger = "admin") -> Future[ReloadOutcome]:
        """Queue a reload of `path` (a bundle, or a root's current version), or of CURRENT when None."""
        if path is None and self.root is None:
            raise BadReloadRequest(
                'no path given and the service was not started on a bundle root: send {"path": "BUNDLE_DIR"}'
            )
        if path is not None:
            path = self.confine(path)
            if not _is_dir(path):
                raise BadReloadRequest("path: not a directory on the server")
        return self._submit(lambda: self._reload(path, trigger))

    def confine(self, path: Path) -> Path:
        """`path` resolved (links followed), if it lies inside one of the allowed directories."""
        if not Path(path).is_absolute():
            raise BadReloadRequest("path: must be an absolute path on the server")
        try:
            resolved = Path(os.path.realpath(path))
        except (OSError, ValueError) as exc:
            raise BadReloadRequest("path: not a valid path on the server") from exc
        if not any(resolved.is_relative_to(allowed) for allowed in self.allowed):
            log.warning("reload refused: %s is outside the bundle directories %s", printable(resolved),
                        printable(":".join(map(str, self.allowed))))
            raise ForbiddenReload("path: outside the directories this service may load bundles from "
                                  "(its bundle root, or TANDEM_BUNDLE_DIRS)")
        return resolved

    def rollback(self) -> Future[ReloadOutcome]:
        return self._submit(lambda: self._rollback("admin"))

    def follow(self, change: Change) -> Future[ReloadOutcome | None]:
        """Apply a change another process of the group logged (None: nothing to do, e.g. already serving it)."""
        return self._submit(lambda: self._follow(change))

    def status(self) -> AdminStatus:
        state, _ = self._loader.state
        serving = self._serving()
        current = None if serving is None else version_info(serving)
        student = None if serving is None else student_info(serving)
        with self._lock:
            history = [version_info(s) for s in self._history]
            last, pending = self._last, self._pending
        return AdminStatus(
            state=state.value, current=current, history=history, keep_versions=self._settings.keep_versions,
            root=str(self.root) if self.root is not None else None,
            watch_interval_s=self._settings.watch_interval_s if self._watcher is not None else None,
            reloads_pending=pending, last_reload=last, student=student,
            processes=self.group.processes() if self.group is not None else None,
            memory=self._memory(current), agreement=self.agreement() if self.agreement is not None else None,
        )

    def _memory(self, current: VersionInfo | None) -> MemoryInfo | None:
        if current is None:
            return None
        return MemoryInfo(load_rss_growth_bytes=self._loader.load_rss_growth,
                          mapped_bytes=mapped_bytes(self.root if self.root is not None else Path(current.path)))

    def close(self) -> None:
        """Stop watching, let a running reload finish (queued ones are dropped), close the kept versions."""
        if self._watcher is not None:
            self._watcher.stop()
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            kept, self._history = list(self._history), deque()
        for searcher in kept:
            self._loader.retire(searcher)

    # --- the reload thread ----------------------------------------------------------------------------

    def _submit(self, job: Callable[[], T]) -> Future[T]:
        with self._lock:
            self._pending += 1
        try:
            future = self._executor.submit(job)
        except RuntimeError:  # shut down
            with self._lock:
                self._pending -= 1
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[T]) -> None:
        with self._lock:
            self._pending -= 1
            if not future.cancelled() and future.exception() is None:
                result = future.result()
                if isinstance(result, ReloadOutcome):
                    self._last = result

    def _reload(self, path: Path | None, trigger: Trigger) -> ReloadOutcome:
        started, started_at = time.perf_counter(), utc_now()
        tried: Path | None = path
        try:
            if path is None:
                assert self.root is not None  # reload() refuses a missing path without a root
                tried = read_current(self.root)
            else:
                tried = resolve_bundle(path)
            tried = self.confine(tried)  # CURRENT, or a link inside an allowed directory, may point outside
            log.info("reload (%s): validating %s", trigger, printable(tried))
            candidate = self._load_sharing(tried)
        except Exception as exc:
            quiet = isinstance(exc, ContractMismatch | TooManyOpenFiles | ValueError)  # ours: the text says it all
            log.error("reload (%s) of %s refused, the version in service keeps serving: %s", trigger,
                      printable(tried), printable(exc), exc_info=not quiet)
            error = str(exc) if isinstance(exc, ForbiddenReload) else public_error(exc)
            return self._refused("reload", trigger, tried, error, started, started_at)
        seconds = time.perf_counter() - started
        try:
            previous = self._loader.swap(candidate)
        except RuntimeError as exc:  # the service is shutting down
            candidate.close()
            return self._refused("reload", trigger, tried, str(exc), started, started_at)
        self._keep(previous)
        sequence = self._publish("reload", trigger, candidate)
        log.info("reload (%s): now serving %s (%s, %d docs) after %.2f s of validation", trigger,
                 candidate.version, candidate.bundle.manifest.build_time, candidate.bundle.manifest.count, seconds)
        self._report("success", candidate, seconds)
        return ReloadOutcome(
            action="reload", trigger=trigger, outcome="ok", path=str(tried), current=version_info(candidate),
            previous=version_info(previous) if previous is not None else None, started_at=started_at,
            seconds=round(seconds, 3), sequence=sequence,
        )

    def _rollback(self, trigger: Trigger) -> ReloadOutcome:
        started, started_at = time.perf_counter(), utc_now()
        with self._lock:
            target = self._history.popleft() if self._history else None
        if target is None:
            error = f"no previous version is kept to roll back to (TANDEM_KEEP_VERSIONS={self._settings.keep_versions})"
            return self._refused("rollback", trigger, None, error, started, started_at)
        try:
            target = self._loader.revive(target)  # its student again, before it serves
        except StudentUnavailable as exc:
            with self._lock:  # still kept: the rollback is refused, nothing changes
                self._history.appendleft(target)
            log.error("rollback (%s) to %s refused, the version in service keeps serving: %s", trigger,
                      target.version, printable(exc))
            return self._refused("rollback", trigger, target.bundle.directory, str(exc), started, started_at)
        try:
            replaced = self._loader.swap(target)
        except RuntimeError as exc:  # the service is shutting down
            self._loader.retire(target)
            return self._refused("rollback", trigger, None, str(exc), started, started_at)
        if replaced is not None:
            self._loader.retire(replaced)  # the version rolled back from is dropped, not kept
        log.warning("rollback: now serving %s again (was %s)", target.version,
                    replaced.version if replaced is not None else None)
        self._report("rolled_back", target, 0.0)
        sequence = self._publish("rollback", trigger, target)
        return ReloadOutcome(
            action="rollback", trigger=trigger, outcome="ok", path=str(target.bundle.directory),
            current=version_info(target), previous=version_info(replaced) if replaced is not None else None,
            started_at=started_at, seconds=round(time.perf_counter() - started, 3), sequence=sequence,
        )

    def _publish(self, action: Literal["reload", "rollback"], trigger: Trigger, searcher: Searcher) -> int | None:
        """Log a change made here for the group's other processes (a followed one is logged already)."""
        if self.group is None or trigger == "follow":
            return None
        return self.group.publish(action, trigger, searcher.bundle.directory, searcher.version)

    def _follow(self, change: Change) -> ReloadOutcome | None:
        """On the reload thread: a change already superseded here is skipped; a rollback to the version this
        process keeps first is instant; anything else reloads the bundle the change names (validated as ever)."""
        group = self.group
        assert group is not None, "follow() is for processes of a group"
        if change.sequence <= group.applied:
            return None
        outcome: ReloadOutcome | None = None
        current = self._current()
        if change.trigger == "watch":
            pass  # each process's own watcher follows the root; a late starter loaded CURRENT already
        elif current is not None and _same_dir(current.path, change.path):
            pass
        elif change.action == "rollback" and self._first_kept(change.path):
            outcome = self._rollback("follow")
        else:
            outcome = self._reload(Path(change.path), "follow")
        current = self._current()
        group.applied_to(change.sequence, current.version if current else None, current.path if current else None)
        return outcome

    def _first_kept(self, path: str) -> bool:
        with self._lock:
            return bool(self._history) and _same_dir(str(self._history[0].bundle.directory), path)

    def _load_sharing(self, directory: Path) -> Searcher:
        """Verify and load `directory`, sharing the segments the version in service holds. A file the version in
        service verified (hashed) and that kept its device, inode, size and mtime_ns (a hard link into the new
        version) is not read again; every other file, and always the space files and tombstones, is checked
        against its sha256 (a corrupted, half-copied or changed version stops here, naming the file). Only
        segments the service does not hold are loaded. The version in service is leased meanwhile, so its
        segments stay open until the candidate holds them too."""
        state, _ = self._loader.state
        if state is not LoadState.READY:  # after a failed start: nothing to share, and a student to load
            return self._loader.load(directory)  # verify, teacher check, FAISS load, warm-up, stage timers
        with self._loader.lease() as served:
            # a student root whose CURRENT moved (`index follow --refresh-student`): the new student loads with it
            moved = served.student.directory != resolve_student(self._settings.student).resolve()
            return self._loader.load(directory, None if moved else served.student, reuse=served.bundle)

    def _serving(self) -> Searcher | None:
        try:
            return self._loader.searcher()
        except NotReady:
            return None

    def _current(self) -> VersionInfo | None:
        serving = self._serving()
        return None if serving is None else version_info(serving)

    def _keep(self, previous: Searcher | None) -> None:
        if previous is None:
            return
        with self._lock:
            self._history.appendleft(previous)
            evicted = [self._history.pop() for _ in range(len(self._history) - self._settings.keep_versions)]
        if previous not in evicted:
            self._loader.park(previous)  # its bundle kept, its student let go after its last request
        for searcher in evicted:
            self._loader.retire(searcher)

    def _refused(self, action: Literal["reload", "rollback"], trigger: Trigger, tried: Path | None, error: str,
                 started: float, started_at: str) -> ReloadOutcome:
        if self._metrics is not None:
            self._metrics.observe_reload("failed")
        return ReloadOutcome(
            action=action, trigger=trigger, outcome="rejected", path=str(tried) if tried is not None else None,
            current=self._current(), error=error, started_at=started_at,
            seconds=round(time.perf_counter() - started, 3),
        )

    def _report(self, outcome: str, searcher: Searcher, load_seconds: float) -> None:
        if self._metrics is None:
            return
        self._metrics.observe_reload(outcome)
        self._metrics.set_index(searcher.version, searcher.bundle.manifest.count, load_seconds)

    def _on_pointer_change(self) -> str | None:
        """Reload CURRENT and wait for the outcome ("ok" or "rejected"), so changes never pile up; None (try
        later) while the initial load is still running, or when shutting down."""
        if self._loader.state[0] is LoadState.LOADING:
            return None
        try:
            return self._submit(lambda: self._reload(None, "watch")).result().outcome
        except (CancelledError, RuntimeError):  # shutting down
            return None


def allowed_dirs(settings: ServiceSettings) -> list[Path]:
    """TANDEM_BUNDLE_DIRS, or else the served bundle root, or else the served bundle's parent directory."""
    if settings.bundle_dirs:
        return [Path(os.path.realpath(d)) for d in settings.bundle_dirs.split(os.pathsep) if d.strip()]
    index = Path(os.path.realpath(settings.index))
    return [index if is_bundle_root(index) else index.parent]


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _is_dir(path: Path) -> bool:
    try:
        return Path(path).is_dir()
    except OSError:  # e.g. a name too long: not a directory either
        return False
