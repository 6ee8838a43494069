"""The collections one service serves, each a bundle (or bundle root) with its own student, loader and reloader.

Each collection is what the service was before collections: a SearcherLoader (service.core.loader) and a Reloader
(service.core.reload) over the service's settings with the collection's index and student, so each loads, hot
reloads, rolls back and fails on its own. Collections whose students are the same directory (its real path) share
one StudentEncoder (`StudentPool`), loaded once. With `--processes N` every process serves every collection, and each
collection has its own process group (service.core.processes) and ChangeFollower (service.core.follow): a reload or
rollback of one, made by whichever process took the admin call, reaches the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from models.agreement.score import SegmentAgreement
from models.encoders.student import StudentEncoder
from models.encoders.student_root import resolve_student
from service.core.agreement import AgreementMonitor
from service.core.follow import ChangeFollower
from service.core.loader import SearcherLoader
from service.core.processes import ProcessGroup
from service.core.query_cache import QueryCache
from service.core.reload import Reloader
from service.metrics import Metrics
from service.settings import CollectionSpec, ServiceSettings

log = logging.getLogger(__name__)


class StudentPool:
    """One StudentEncoder per student directory (its real path): collections that share a student load it once.
    onnxruntime lets several searchers share a session, as a hot reload already does.

    The pool counts the searchers holding each student (in service, or swapped out and still answering the
    requests that leased them), and lets a student go when the last of them closes or is detached: a
    `--refresh-student` publish or a collection config change would otherwise add an ONNX session for the life of
    the process. A version kept for rollback lets its student go once its last lease ends (service.core.loader
    `park`), so a request in flight that still holds the old encoder finishes on it, and takes it again from the
    pool on rollback (`revive`): loaded from its directory unless a searcher in service shares it."""

    def __init__(self, settings: ServiceSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()  # held while a student loads: two collections never load the same one twice
        self._students: dict[str, StudentEncoder] = {}
        self._holders: dict[str, int] = {}  # real path → searchers holding its student

    def source(self, directory: Path) -> PooledStudents:
        """What a collection's loader acquires its students from: `directory` (a student, or a student root)."""
        return PooledStudents(self, directory)

    def acquire(self, directory: Path, shared: StudentEncoder | None = None) -> StudentEncoder:
        """`shared` (a student a searcher in service holds, which a reload keeps), else the student `directory`
        names now (a student root: the one its CURRENT names), loaded unless the pool holds it; one more holder
        either way, until `release`."""
        if shared is not None:
            with self._lock:
                real = os.path.realpath(shared.directory)
                if self._students.get(real) is shared:
                    self._holders[real] += 1
                return shared  # one the pool did not load is the caller's to keep (release ignores it too)
        directory = resolve_student(directory)  # a student root: the student its CURRENT names now
        real = os.path.realpath(directory)
        with self._lock:
            student = self._students.get(real)
            if student is None:
                student = StudentEncoder(Path(directory), self._settings.student_precision,
                                         self._settings.encode_threads)
                self._students[real], self._holders[real] = student, 0
            self._holders[real] += 1
            return student

    def release(self, student: StudentEncoder) -> None:
        """One holder fewer; the last one closes the student (its ONNX session and heap go back at once)."""
        real = os.path.realpath(student.directory)
        with self._lock:
            if self._students.get(real) is not student:
                return
            self._holders[real] -= 1
            if self._holders[real] > 0:
                return
            del self._students[real], self._holders[real]
        student.close()

    def holders(self) -> dict[str, int]:
        """Each student held (its real path) and how many searchers hold it."""
        with self._lock:
            return dict(self._holders)

    def __len__(self) -> int:
        with self._lock:
            return len(self._students)


@dataclass(frozen=True)
class PooledStudents:
    """A collection's view of the pool (service.core.loader.StudentSource): its own student directory."""

    pool: StudentPool
    directory: Path

    def acquire(self, shared: StudentEncoder | None = None, directory: Path | None = None) -> StudentEncoder:
        """`directory`: a rollback's student (the one its version served with), instead of the collection's."""
        return self.pool.acquire(self.directory if directory is None else directory, shared)

    def release(self, student: StudentEncoder) -> None:
        self.pool.release(student)


class CollectionMetrics:
    """A collection's reload reports (service.core.reload.ReloadMetrics): labelled with its name, and the service's
    unlabelled index gauges too for the default collection, as before collections existed."""

    def __init__(self, metrics: Metrics, name: str, default: bool) -> None:
        self._metrics, self._name, self._default = metrics, name, default

    def observe_reload(self, outcome: str) -> None:
        self._metrics.collection_reloads.labels(self._name, outcome).inc()
        if self._default:
            self._metrics.observe_reload(outcome)

    def set_index(self, version: str, count: int, load_seconds: float) -> None:
        if self._default:
            self._metrics.set_index(version, count, load_seconds)

    def set_agreement(self, scores: list[SegmentAgreement], gone: list[str]) -> None:
        self._metrics.set_agreement(self._name, scores, gone)


@dataclass(frozen=True)
class Collection:
    name: str
    settings: ServiceSettings  # the service's, with this collection's index and student
    loader: SearcherLoader
    reloader: Reloader
    agreement: AgreementMonitor
    follower: ChangeFollower | None  # with --processes N: the changes other processes make to this collection

    def start(self) -> None:
        self.loader.start()  # /healthz answers at once; the collection turns ready when it has loaded
        self.reloader.start()  # its CURRENT-pointer watcher, when it serves a bundle root
        self.agreement.start()  # scores the student's agreement in the background (service.core.agreement)
        if self.follower is not None:
            self.follower.start()

    def stop(self) -> None:
        """Stop scoring, following and reloading (the loader is closed or drained by the caller); with
        --processes N the collection's group no longer counts this process."""
        self.agreement.close()
        if self.follower is not None:
            self.follower.stop()
        self.reloader.close()
        if self.reloader.group is not None:
            self.reloader.group.leave()


class CollectionSet:
    """Every collection of the service, each loading, reloading, rolling back and failing on its own: a collection
    that fails to load reports it (its loader's state) while the others serve."""

    def __init__(self, settings: ServiceSettings, metrics: Metrics, group: ProcessGroup | None = None) -> None:
        self.default = settings.default_collection()  # chosen at startup: a config reload never changes it
        self.students = StudentPool(settings)
        # one for every collection: its keys name the student (service.core.query_cache)
        self.query_cache = (QueryCache(settings.query_cache, metrics.observe_query_cache)
                            if settings.query_cache else None)
        self._settings, self._metrics, self._group = settings, metrics, group
        self._lock = threading.Lock()  # one add or remove at a time; readers take the dict in service, never locked
        self._collections: dict[str, Collection] = {}  # replaced whole on add and remove, never mutated
        self._started = False
        for spec in settings.collection_specs():
            self._collections[spec.name] = self._build(spec)

    def _build(self, spec: CollectionSpec) -> Collection:
        own = self._settings.model_copy(update={"index": spec.index, "student": spec.student})
        is_default = spec.name == self.default
        group = None if self._group is None else self._group if is_default else \
            self._group.collection(spec.name, f"{spec.index}\0{spec.student}")
        # a process of --processes N starting late catches up with the collection's last admin change
        initial = group.catch_up() if group is not None else None
        loader = SearcherLoader(own, observe=self._metrics.observe_stage, initial=initial,
                                students=self.students.source(spec.student), query_cache=self.query_cache)
        reported = CollectionMetrics(self._metrics, spec.name, is_default)
        reloader = Reloader(own, loader, metrics=reported, group=group)
        agreement = AgreementMonitor(spec.name, own, loader, reported)
        reloader.agreement = agreement.status
        follower = ChangeFollower(group, reloader, loader) if group is not None else None
        return Collection(spec.name, own, loader, reloader, agreement, follower)

    def specs(self) -> list[CollectionSpec]:
        """What is served now, as declared (name, index, student)."""
        return [CollectionSpec(name=c.name, index=c.settings.index, student=c.settings.student) for c in self]

    def add(self, spec: CollectionSpec) -> Collection:
        """Serve `spec` too: listed at once (loading), searchable once its load ends, as at startup."""
        with self._lock:
            if spec.name in self._collections:
                raise ValueError(f"collection {spec.name!r} is already served")
            collection = self._build(spec)
            if self._started:
                collection.start()
            self._collections = {**self._collections, spec.name: collection}
        return collection

    def remove(self, name: str) -> None:
        """Stop serving `name`: it leaves the list and the routes at once; requests that already hold its searcher
        finish, and the searcher closes after the last of them (SearcherLoader.drain)."""
        with self._lock:
            if name == self.default:
                raise ValueError(f"collection {name!r} is the default one (POST /search): it stays until restart")
            rest = dict(self._collections)
            collection = rest.pop(name)
            self._collections = rest
        collection.stop()
        collection.loader.drain()
        scored = collection.agreement.status()
        if scored is not None:  # its agreement gauges go with it
            self._metrics.set_agreement(name, [], [s.segment for s in [*scored.segments, scored.overall]])
        for gauge in (self._metrics.collection_ready, self._metrics.collection_documents):
            with contextlib.suppress(KeyError):  # KeyError: never scraped
                gauge.remove(name)

    def __iter__(self) -> Iterator[Collection]:
        return iter(list(self._collections.values()))

    def __len__(self) -> int:
        return len(self._collections)

    def get(self, name: str) -> Collection | None:
        return self._collections.get(name)

    def default_collection(self) -> Collection | None:
        return self._collections.get(self.default) if self.default is not None else None

    def start(self) -> None:
        with self._lock:
            self._started = True
        for collection in self:
            collection.start()

    def wait(self) -> None:
        for collection in self:
            collection.loader.wait()

    def others_serve(self) -> bool:
        """With --processes N: another process already serves one of these collections (this one replaces a
        process, or joins late)."""
        return any(c.reloader.group.others_serve() for c in self if c.reloader.group is not None)

    def close(self) -> None:
        for collection in self:
            collection.stop()
            collection.loader.close()
