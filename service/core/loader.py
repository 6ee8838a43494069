"""Which searcher is in service: the background initial load, leases, retired searchers and the swaps of a hot reload.

`check_compatible` reads only the two manifests, so a student aligned to another teacher is
refused before anything heavy loads. `SearcherLoader` loads in a background thread so the
process answers liveness probes while a large bundle is still opening. Every searcher enters
service through `SearcherLoader.load`, which verifies every file's sha256 before it loads the bundle (the
initial load too: /readyz turns 200 only for a verified bundle, docs/operations.md#verification), and wires the
metrics' stage observers (tokenize, rescore) once, when it is loaded, so requests never touch them.

A request leases the searcher in service for as long as it uses it; a searcher swapped out by a hot
reload is retired, and closed only once the last lease on it has ended, or parked (kept for rollback): once its last
lease has ended it lets its student go and keeps its bundle, and `revive` takes a student again before a rollback
swaps it back in. The loader keeps the counts: a searcher knows nothing of who holds it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Protocol

from models.bundle.manifest import BundleManifest
from models.bundle.storage.integrity import check_unchanged
from models.bundle.version import Bundle, read_bundle_manifest, verify_version
from models.bundle.versions import resolve_bundle
from models.contract import check_same_teacher
from models.encoders.student import StudentEncoder, read_student_manifest
from models.encoders.student_manifest import StudentManifest
from models.encoders.student_root import resolve_student
from models.errors import ContractMismatch
from models.timing import StageObserver
from service.core.batcher import BatchLimits
from service.core.memory import rss_bytes
from service.core.query_cache import QueryCache
from service.core.searcher import QueryEncoder, Searcher
from service.redact import printable, public_error
from service.runtime.descriptors import TooManyOpenFiles, out_of_descriptors, too_many_open_files
from service.settings import ServiceSettings

log = logging.getLogger(__name__)


def check_compatible(settings: ServiceSettings) -> tuple[BundleManifest, StudentManifest]:
    """Refuse a student/bundle pair from different teacher spaces, or with files missing; nothing heavy loads."""
    index = resolve_bundle(settings.index)  # a bundle root serves the version its CURRENT pointer names
    bundle = read_bundle_manifest(index)
    student_dir = resolve_student(settings.student)  # a student root serves the student its CURRENT names
    student = read_student_manifest(student_dir)
    try:
        check_same_teacher(student.teacher, bundle.teacher)
    except ContractMismatch as exc:
        raise ContractMismatch(f"student {student_dir} does not match index {index}: {exc}") from exc
    model = student.model_file(settings.student_precision)
    _require_files(index, "index bundle", list(bundle.files))
    _require_files(student_dir, "student", [model, student.tokenizer])
    return bundle, student


def _require_files(directory: Path, what: str, names: list[str]) -> None:
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise ContractMismatch(f"{directory}: {what} is incomplete, missing {', '.join(missing)}")


class StudentSource(Protocol):
    """Where a loader's students come from when collections pool them (service.core.collections.StudentPool):
    each searcher it loads holds its student from `acquire` until the searcher closes or is detached (`release`);
    `directory` names the student to load (a rollback's), instead of the collection's current one."""

    def acquire(self, shared: StudentEncoder | None = None,
                directory: Path | None = None) -> StudentEncoder: ...
    def release(self, student: StudentEncoder) -> None: ...


class StudentUnavailable(Exception):
    """The student a version kept for rollback served with no longer loads (its directory deleted or broken)."""

    def __init__(self, directory: Path, cause: BaseException) -> None:
        reason = printable(cause) if isinstance(cause, ContractMismatch | OSError) else type(cause).__name__
        super().__init__(f"the student {directory} no longer loads ({reason})")
        self.directory = directory


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
                 initial: Path | None = None, students: StudentSource | None = None,
                 query_cache: QueryCache | None = None) -> None:
        """`observe` (the metrics' stage timer) is wired into every searcher this loader loads; `initial` is the
        bundle to load first instead of settings.index (a worker catching up with its group's last admin change);
        `students` gives each searcher its student (the one a reload shares, or the collection's current one) and
        takes it back when the searcher closes (collections pool them: service.core.collections.StudentPool),
        instead of each searcher loading settings.student; `query_cache`, the
        service's query-vector cache, is what every searcher it loads encodes through."""
        self._settings, self._observe, self._initial = settings, observe, initial
        self._query_cache = query_cache
        self._students = students
        self._lock = threading.Lock()
        self._state = LoadState.LOADING
        self._error: str | None = None
        self._searcher: Searcher | None = None
        self._leases: dict[Searcher, int] = {}  # requests holding each searcher (absent: none)
        self._retired: set[Searcher] = set()  # swapped out, closed when their last lease ends
        self._parked: set[Searcher] = set()  # kept for rollback, their student let go when their last lease ends
        self._closed = False
        self.load_rss_growth: int | None = None  # VmRSS after its initial load less before (service.core.memory)
        self._thread = threading.Thread(target=self._load, name="tandem-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self) -> None:
        """Until the initial load has ended, loaded or failed (`state` tells which)."""
        self._thread.join()

    def load(self, directory: Path | None = None, student: StudentEncoder | None = None,
             reuse: Bundle | None = None) -> Searcher:
        """A verified, warmed-up searcher of `directory` (default: the bundle settings.index resolves to), its stage
        timers wired after the warm-up (which is not a request); a hot reload passes the student in service, and
        the bundle in service, whose segments the new version shares and whose verified files it may trust."""
        if self._students is None:
            searcher = open_searcher(self._settings, directory, student, reuse)
        else:
            student = self._students.acquire(student)
            try:
                searcher = open_searcher(self._settings, directory, student, reuse)
            except BaseException:
                self._students.release(student)
                raise
            searcher.on_close(partial(self._students.release, student))
        if self._observe is not None:
            searcher.observe_stages(self._observe)
        searcher.encoder.cache = self._query_cache
        return searcher

    def _load(self) -> None:
        started, rss_before = time.perf_counter(), rss_bytes()
        try:
            searcher = self.load(self._initial)
        except Exception as exc:
            log.error("loading %s with student %s failed: %s", printable(self._settings.index),
                      printable(self._settings.student), printable(exc),
                      exc_info=not isinstance(exc, ContractMismatch | TooManyOpenFiles))
            with self._lock:  # /readyz shows it: no host paths, no library internals
                self._state, self._error = LoadState.FAILED, public_error(exc)
            return
        with self._lock:
            if self._closed:
                searcher.close()
                return
            self._searcher, self._state = searcher, LoadState.READY
            rss_after = rss_bytes()
            if rss_before is not None and rss_after is not None:
                self.load_rss_growth = rss_after - rss_before
        log.info("ready in %.1f s (resident memory %+.1f MiB)", time.perf_counter() - started,
                 (self.load_rss_growth or 0) / 2**20)

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
            self._leases[searcher] = self._leases.get(searcher, 0) + 1
        try:
            yield searcher
        finally:
            with self._lock:
                left = self._leases.pop(searcher) - 1
                if left:
                    self._leases[searcher] = left
                drained = not left and searcher in self._retired
                if drained:
                    self._retired.discard(searcher)
                parked = not left and searcher in self._parked
            if drained:
                _close_later(searcher)
            elif parked:
                self._detach_later(searcher)

    @contextmanager
    def lease_encoder(self) -> Iterator[QueryEncoder]:
        """The encoder of the searcher in service (the student, batched and admitted with its searches), leased
        alike: all /v1/embeddings needs."""
        with self.lease() as searcher:
            yield searcher.encoder

    def swap(self, searcher: Searcher) -> Searcher | None:
        """Put `searcher` in service at once and return the one it replaces, still open: the caller keeps it
        for rollback or retires it. Raises RuntimeError once the loader is closed (the caller closes `searcher`)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the service is shutting down")
            old, self._searcher = self._searcher, searcher
            self._state, self._error = LoadState.READY, None
        return old

    def park(self, searcher: Searcher) -> None:
        """Keep `searcher` (swapped out, kept for rollback) with its bundle, and let its student go as soon as no
        request holds a lease on it (on a thread of its own, as `retire` closes): a request in flight finishes on
        the student it started with. The pool keeps a student another searcher holds (the one in service, when
        the student did not change), so only a student nothing serves goes."""
        with self._lock:
            self._parked.add(searcher)
            idle = searcher not in self._leases
        if idle:
            self._detach_later(searcher)

    def _detach_later(self, searcher: Searcher) -> None:
        def detach() -> None:
            with searcher.student_lock:  # `revive` and `close` take it too: none runs halfway through another
                with self._lock:
                    if searcher not in self._parked or searcher in self._leases:
                        return  # revived or retired meanwhile
                searcher.detach()
            log.info("bundle version %s kept for rollback; its student let go", searcher.version)

        threading.Thread(target=detach, name="tandem-park", daemon=True).start()

    def revive(self, searcher: Searcher) -> Searcher:
        """`searcher`, parked, ready to be swapped back in (a rollback): its student taken again from the pool,
        loaded from the directory it served with unless the pool holds it, and checked as a reload checks one
        (teacher, files, warm-up). A searcher whose student was not let go yet keeps it. Raises
        StudentUnavailable, naming the student's directory, when it no longer loads; the searcher stays parked."""
        with searcher.student_lock:
            with self._lock:
                self._parked.discard(searcher)
            if not searcher.detached:
                return searcher
            directory = searcher.student.directory
            try:
                if self._students is None:
                    student = searcher.student  # not pooled: never let go (StudentEncoder.close was not called)
                    searcher.attach(student)
                else:
                    student = self._students.acquire(directory=directory)
                    try:
                        searcher.attach(student)
                    except BaseException:
                        self._students.release(student)
                        raise
                    searcher.on_close(partial(self._students.release, student))
            except Exception as exc:
                with self._lock:
                    self._parked.add(searcher)
                raise StudentUnavailable(directory, exc) from exc
        if self._observe is not None:
            searcher.observe_stages(self._observe)
        searcher.encoder.cache = self._query_cache
        return searcher

    def retire(self, searcher: Searcher) -> None:
        """Close `searcher` as soon as no request holds a lease on it, on a thread of its own (closing drains the
        batcher, which must never block the event loop or the reload thread)."""
        with self._lock:
            self._parked.discard(searcher)
            drained = searcher not in self._leases
            if not drained:
                self._retired.add(searcher)
        if drained:
            _close_later(searcher)

    def drain(self) -> None:
        """Stop serving (a collection removed from the config): new leases answer NotReady (its load, if still
        running, closes what it loads), and the searcher in service is closed once its last lease ends."""
        with self._lock:
            self._closed = True
            searcher, self._searcher = self._searcher, None
            self._state, self._error = LoadState.FAILED, "removed from the service's collections"
        if searcher is not None:
            self.retire(searcher)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            searcher, self._searcher = self._searcher, None
        if searcher is not None:
            searcher.close()


def open_searcher(settings: ServiceSettings, directory: Path | None = None,
                  student: StudentEncoder | None = None, reuse: Bundle | None = None) -> Searcher:
    """A warmed-up searcher of `directory` (default: the bundle settings.index resolves to), every file checked
    against the sha256 its manifest gives it before anything is loaded (`open_bundle`); a hot reload passes the
    student in service, which onnxruntime lets several searchers share, and the bundle in service, whose loaded
    segments the new version shares rather than loads again."""
    bundle = open_bundle(resolve_bundle(settings.index) if directory is None else directory, reuse)
    try:
        if student is None:
            student = StudentEncoder(resolve_student(settings.student), settings.student_precision,
                                     settings.encode_threads)
        searcher = Searcher(bundle, student, limits=batch_limits(settings), oversample=settings.binary_oversample,
                            search_threads=settings.search_threads)
    except BaseException:
        bundle.close()
        raise
    try:
        searcher.warmup()
    except BaseException:
        searcher.close()
        raise
    return searcher


def open_bundle(directory: Path, reuse: Bundle | None = None) -> Bundle:
    """The version at `directory`, its manifest read once and every file verified against it first (so neither
    FAISS nor SQLite ever reads a corrupted file), trusting only the files `reuse` verified that kept their
    identity; checked once more after loading, so a file changed while the version loaded is refused too."""
    started = time.perf_counter()
    manifest = read_bundle_manifest(directory)
    try:
        verification = verify_version(directory, manifest, reuse.verified if reuse is not None else None)
        log.info("verified %s: %d files hashed (%.1f MB) in %.2f s, %d trusted as the very files verified before "
                 "(device, inode, size, mtime_ns)", printable(directory), len(verification.hashed),
                 verification.hashed_bytes / 1e6, time.perf_counter() - started, verification.trusted)
        bundle = Bundle(directory, reuse=reuse, manifest=manifest, verified=verification.files)
    except Exception as exc:
        if out_of_descriptors(exc):  # named, with its remedies, rather than as the file that happened to fail
            served = {s.name for s in reuse.manifest.parts} if reuse is not None else set()
            shared = sum(s.name in served for s in manifest.parts)
            raise too_many_open_files(directory, len(manifest.parts), shared) from exc
        raise
    try:
        check_unchanged(directory, verification.files)
    except BaseException:
        bundle.close()
        raise
    return bundle


def batch_limits(settings: ServiceSettings) -> BatchLimits:
    return BatchLimits(max_batch=settings.batch_max_queries, max_wait_s=settings.batch_wait_ms / 1e3,
                       max_pending=settings.max_pending, max_queue_s=settings.max_queue_ms / 1e3,
                       workers=settings.workers)


def _close_later(searcher: Searcher) -> None:
    def close() -> None:
        searcher.close()
        log.info("closed bundle version %s", searcher.version)

    threading.Thread(target=close, name="tandem-retire", daemon=True).start()
