"""Which searcher is in service: the background initial load, leases, and the swaps of a hot reload.

`check_compatible` reads only the two manifests, so a student aligned to another teacher is
refused before anything heavy loads. `SearcherLoader` loads in a background thread so the
process answers liveness probes while a large bundle is still opening. Every searcher enters
service through `SearcherLoader.load`, which wires the metrics' stage observers (tokenize,
rescore) once, when it is loaded, so requests never touch them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

from models.bundle import read_bundle_manifest
from models.contract import check_same_teacher
from models.errors import ContractMismatch
from models.manifest import BundleManifest, StudentManifest
from models.student import StudentEncoder, read_student_manifest
from models.timing import StageObserver
from models.versions import resolve_bundle
from service.engine import Searcher
from service.redact import printable, public_error
from service.settings import ServiceSettings

log = logging.getLogger(__name__)


def check_compatible(settings: ServiceSettings) -> tuple[BundleManifest, StudentManifest]:
    """Refuse a student/bundle pair from different teacher spaces, or with files missing; nothing heavy loads."""
    index = resolve_bundle(settings.index)  # a bundle root serves the version its CURRENT pointer names
    bundle = read_bundle_manifest(index)
    student = read_student_manifest(settings.student)
    try:
        check_same_teacher(student.teacher, bundle.teacher)
    except ContractMismatch as exc:
        raise ContractMismatch(f"student {settings.student} does not match index {index}: {exc}") from exc
    model = student.onnx_int8 if settings.student_precision == "int8" else student.onnx_fp32
    _require_files(index, "index bundle", list(bundle.files))
    _require_files(settings.student, "student", [model, student.tokenizer])
    return bundle, student


def _require_files(directory: Path, what: str, names: list[str]) -> None:
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise ContractMismatch(f"{directory}: {what} is incomplete, missing {', '.join(missing)}")


class LoadState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


class NotReady(Exception):
    """The searcher is still loading, or failed to load."""

    def __init__(self, state: LoadState, error: str | None) -> None:
        super().__init__(error or state.value)
        self.state = state
        self.error = error


class SearcherLoader:
    """Loads a Searcher in a daemon thread and reports its state; closing while loading is safe."""

    def __init__(self, settings: ServiceSettings, observe: StageObserver | None = None,
                 initial: Path | None = None) -> None:
        """`observe` (the metrics' stage timer) is wired into every searcher this loader loads; `initial` is the
        bundle to load first instead of settings.index (a worker catching up with its group's last admin change)."""
        self._settings, self._observe, self._initial = settings, observe, initial
        self._lock = threading.Lock()
        self._state = LoadState.LOADING
        self._error: str | None = None
        self._searcher: Searcher | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._load, name="tandem-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def load(self, directory: Path | None = None, student: StudentEncoder | None = None) -> Searcher:
        """A warmed-up searcher of `directory` (default: the bundle settings.index resolves to), its stage timers
        wired after the warm-up (which is not a request); a hot reload passes the student in service."""
        searcher = Searcher.load(self._settings, directory, student)
        if self._observe is not None:
            searcher.observe_stages(self._observe)
        return searcher

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            searcher = self.load(self._initial)
        except Exception as exc:
            log.error("loading %s with student %s failed: %s", printable(self._settings.index),
                      printable(self._settings.student), printable(exc), exc_info=not isinstance(exc, ContractMismatch))
            with self._lock:  # /readyz shows it: no host paths, no library internals
                self._state, self._error = LoadState.FAILED, public_error(exc)
            return
        with self._lock:
            if self._closed:
                searcher.close()
                return
            self._searcher, self._state = searcher, LoadState.READY
        log.info("ready in %.1f s", time.perf_counter() - started)

    @property
    def state(self) -> tuple[LoadState, str | None]:
        with self._lock:
            return self._state, self._error

    def searcher(self) -> Searcher:
        with self._lock:
            if self._searcher is None:
                raise NotReady(self._state, self._error)
            return self._searcher

    @contextmanager
    def lease(self) -> Iterator[Searcher]:
        """The searcher in service, kept open until the block ends even if a hot reload swaps it out meanwhile."""
        with self._lock:
            searcher = self._searcher
            if searcher is None:
                raise NotReady(self._state, self._error)
            searcher.leases += 1
        try:
            yield searcher
        finally:
            with self._lock:
                searcher.leases -= 1
                drained = searcher.retired and searcher.leases == 0
            if drained:
                _close_later(searcher)

    def swap(self, searcher: Searcher) -> Searcher | None:
        """Put `searcher` in service at once and return the one it replaces, still open: the caller keeps it
        for rollback or retires it. Raises RuntimeError once the loader is closed (the caller closes `searcher`)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the service is shutting down")
            old, self._searcher = self._searcher, searcher
            self._state, self._error = LoadState.READY, None
        return old

    def retire(self, searcher: Searcher) -> None:
        """Close `searcher` as soon as no request holds a lease on it, on a thread of its own (closing drains the
        batcher, which must never block the event loop or the reload thread)."""
        with self._lock:
            searcher.retired = True
            drained = searcher.leases == 0
        if drained:
            _close_later(searcher)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            searcher, self._searcher = self._searcher, None
        if searcher is not None:
            searcher.close()


def _close_later(searcher: Searcher) -> None:
    def close() -> None:
        searcher.close()
        log.info("closed bundle version %s", searcher.version)

    threading.Thread(target=close, name="tandem-retire", daemon=True).start()
