"""Query → student vector → bundle hits, with no HTTP in sight (the app wraps it).

`check_compatible` reads only the two manifests, so a student aligned to another teacher
is refused before anything heavy loads. `SearcherLoader` loads in a background thread so
the process answers liveness probes while a large bundle is still opening.
"""

from __future__ import annotations

import logging
import threading
import time
from enum import StrEnum
from pathlib import Path

import faiss
import numpy as np

from models.bundle import Bundle, Hit, read_bundle_manifest
from models.contract import check_same_teacher
from models.errors import ContractMismatch
from models.manifest import BundleManifest, StudentManifest
from models.student import StudentEncoder, read_student_manifest
from service.batcher import MicroBatcher
from service.settings import ServiceSettings

log = logging.getLogger(__name__)


def check_compatible(settings: ServiceSettings) -> tuple[BundleManifest, StudentManifest]:
    """Refuse a student/bundle pair from different teacher spaces, or with files missing; nothing heavy loads."""
    bundle = read_bundle_manifest(settings.index)
    student = read_student_manifest(settings.student)
    try:
        check_same_teacher(student.teacher, bundle.teacher)
    except ContractMismatch as exc:
        raise ContractMismatch(f"student {settings.student} does not match index {settings.index}: {exc}") from exc
    model = student.onnx_int8 if settings.student_precision == "int8" else student.onnx_fp32
    _require_files(settings.index, "index bundle", list(bundle.files))
    _require_files(settings.student, "student", [model, student.tokenizer])
    return bundle, student


def _require_files(directory: Path, what: str, names: list[str]) -> None:
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise ContractMismatch(f"{directory}: {what} is incomplete, missing {', '.join(missing)}")


class Searcher:
    """A loaded bundle and student behind a micro-batcher; every search goes through `batcher`."""

    def __init__(self, bundle: Bundle, student: StudentEncoder, settings: ServiceSettings) -> None:
        bundle.check_student(student.teacher)
        self.bundle = bundle
        self.student = student
        self.oversample = settings.binary_oversample
        self.search_threads = settings.search_threads
        self.batcher = MicroBatcher(
            self.student.encode, self.search_vectors, max_batch=settings.batch_max_queries,
            max_wait_s=settings.batch_wait_ms / 1e3, max_pending=settings.max_pending, workers=settings.workers,
        )

    @classmethod
    def load(cls, settings: ServiceSettings) -> Searcher:
        bundle = Bundle(settings.index)
        try:
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

    def search_vectors(self, vectors: np.ndarray, top_k: int) -> list[list[Hit]]:
        # OpenMP's thread count is per calling thread, so it is set here, in the worker that searches.
        faiss.omp_set_num_threads(self.search_threads)
        return self.bundle.search(vectors, top_k, self.oversample)

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
            log.error("loading %s with student %s failed: %s", self._settings.index, self._settings.student, exc,
                      exc_info=not isinstance(exc, ContractMismatch))
            with self._lock:
                self._state, self._error = LoadState.FAILED, str(exc)
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

    def close(self) -> None:
        with self._lock:
            self._closed = True
            searcher, self._searcher = self._searcher, None
        if searcher is not None:
            searcher.close()
