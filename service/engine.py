"""Query → student vector → bundle hits, with no HTTP in sight (the app wraps it).

`check_compatible` reads only the two manifests, so a student aligned to another teacher
is refused before anything heavy loads. `SearcherLoader` loads in a background thread so
the process answers liveness probes while a large bundle is still opening.
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

import faiss
import numpy as np

from models.bundle import Bundle, Hit, read_bundle_manifest
from models.contract import check_same_teacher
from models.errors import ContractMismatch
from models.manifest import BundleManifest, StudentManifest
from models.retrieve import Mode, Retrieved, SearchOptions, retrieve
from models.student import StudentEncoder, read_student_manifest
from models.versions import resolve_bundle
from service.batcher import MicroBatcher
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


class Searcher:
    """A loaded bundle and student behind a micro-batcher; every search goes through `batcher`.

    `leases` and `retired` belong to SearcherLoader: a searcher swapped out by a hot reload
    is closed only once the requests that leased it have finished.
    """

    def __init__(self, bundle: Bundle, student: StudentEncoder, settings: ServiceSettings) -> None:
        bundle.check_student(student.teacher)
        self.bundle = bundle
        self.student = student
        self.leases = 0
        self.retired = False
        self.loaded_at = time.time()
        self.oversample = settings.binary_oversample
        self.search_threads = settings.search_threads
        # batch_max_queries also caps each ONNX call of a batch request: with the default 1 a query's
        # vector never depends on the queries it came with (int8 scales activations per call).
        self.batcher = MicroBatcher(
            partial(self.student.encode_counted, batch_size=settings.batch_max_queries), self.search,
            max_batch=settings.batch_max_queries,
            max_wait_s=settings.batch_wait_ms / 1e3, max_pending=settings.max_pending,
            max_queue_s=settings.max_queue_ms / 1e3, workers=settings.workers,
        )

    @classmethod
    def load(cls, settings: ServiceSettings, directory: Path | None = None,
             student: StudentEncoder | None = None) -> Searcher:
        """Open `directory` (default: the bundle settings.index resolves to); a hot reload passes the student
        in service, which onnxruntime lets several searchers share."""
        bundle = Bundle(resolve_bundle(settings.index) if directory is None else directory)
        try:
            if student is None:
                student = StudentEncoder(settings.student, settings.student_precision, settings.encode_threads)
            searcher = cls(bundle, student, settings)
        except BaseException:
            bundle.close()
            raise
        try:
            searcher.warmup()
        except BaseException:
            searcher.close()
            raise
        return searcher

    def warmup(self) -> None:
        """Run one query end to end: the first ORT run is slow, and the graph's real output width is checked."""
        vec = self.student.encode(["warmup"])
        if vec.shape[1] != self.bundle.teacher.dim:
            raise ContractMismatch(
                f"student {self.student.directory} outputs {vec.shape[1]}-d vectors but its manifest and the index "
                f"say {self.bundle.teacher.dim}-d"
            )
        self.search_vectors(vec, 1)
        if self.bundle.lexical is not None:  # touches the memory-mapped BM25 arrays once
            self.search(None, ["warmup"], SearchOptions(top_k=1, mode=Mode.LEXICAL))

    @property
    def version(self) -> str:
        """The bundle directory's name: with the manifest's build_time, what a client sees switch on a reload."""
        return self.bundle.directory.name

    def index_summary(self) -> dict[str, object]:
        return {**self.bundle.manifest.summary(), "version": self.version}

    def search_vectors(self, vectors: np.ndarray, top_k: int) -> list[list[Hit]]:
        """Dense top-k of query vectors, unfiltered (warmup and tests)."""
        faiss.omp_set_num_threads(self.search_threads)
        return self.bundle.search(vectors, top_k, self.oversample)

    def search(self, vectors: np.ndarray | None, queries: list[str], options: SearchOptions) -> Retrieved:
        """Any mode, filters and pages (models.retrieve); the batcher calls it on its worker threads."""
        # OpenMP's thread count is per calling thread, so it is set here, in the worker that searches.
        faiss.omp_set_num_threads(self.search_threads)
        return retrieve(self.bundle, vectors, queries, options, self.oversample)

    def close(self) -> None:
        self.batcher.close()
        self.bundle.close()


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

    def __init__(self, settings: ServiceSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._state = LoadState.LOADING
        self._error: str | None = None
        self._searcher: Searcher | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._load, name="tandem-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            searcher = Searcher.load(self._settings)
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
