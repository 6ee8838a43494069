"""Query → student vector → bundle hits, with no HTTP in sight (the app wraps it).

`check_compatible` reads only the two manifests, so a student aligned to another teacher
is refused before anything heavy loads. `SearcherLoader` loads in a background thread so
the process answers liveness probes while a large bundle is still opening.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import faiss

from models.bundle import Bundle, Hit, read_bundle_manifest
from models.contract import check_same_teacher
from models.errors import ContractMismatch
from models.manifest import BundleManifest, StudentManifest
from models.student import StudentEncoder, read_student_manifest
from models.vector_index import DEFAULT_OVERSAMPLE
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


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[Hit]
    timing_ms: dict[str, float]


class Searcher:
    """A loaded bundle and student; `search` is thread-safe (FAISS reads, ORT sessions, locked doc store)."""

    def __init__(
        self, bundle: Bundle, student: StudentEncoder, oversample: int = DEFAULT_OVERSAMPLE, search_threads: int = 1
    ) -> None:
        bundle.check_student(student.teacher)
        self.bundle = bundle
        self.student = student
        self.oversample = oversample
        self.search_threads = search_threads

    @classmethod
    def load(cls, settings: ServiceSettings) -> Searcher:
        bundle = Bundle(settings.index)
        try:
            student = StudentEncoder(settings.student, settings.student_precision, settings.encode_threads)
            searcher = cls(bundle, student, settings.binary_oversample, settings.search_threads)
            searcher.warmup()
        except BaseException:
            bundle.close()
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
        self.search("warmup", 1)

    def search(self, query: str, top_k: int) -> SearchOutcome:
        # OpenMP's thread count is per calling thread, so it is set here, in the worker that searches.
        faiss.omp_set_num_threads(self.search_threads)
        start = time.perf_counter()
        vectors = self.student.encode([query])
        encoded = time.perf_counter()
        hits = self.bundle.search(vectors, top_k, self.oversample)[0]
        done = time.perf_counter()
        return SearchOutcome(
            hits=hits, timing_ms={"encode": (encoded - start) * 1e3, "search": (done - encoded) * 1e3}
        )

    def close(self) -> None:
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
