"""Queries in, hits or vectors out: the student and a bundle behind the micro-batcher (service/core/batcher.py).

In the core, a dense query goes from service/core/loader.py, which leases the searcher in service, to
`Searcher.search`, which hands it to the `MicroBatcher` (service/core/batcher.py): that admits and queues it
and runs its batch (on a worker thread, or on the event loop with `workers` 0), which encodes with
`QueryEncoder.encode` → models/encoders/student.py `StudentEncoder.encode_counted`, then searches with
`Searcher.retrieve` → models/search/query.py `search` (FAISS). docs/architecture.md#the-query-path maps the
whole path.

Two pieces, each usable without the next:
- `QueryEncoder`: the student behind a MicroBatcher; what /v1/embeddings needs, and no bundle.
- `Searcher`: a bundle searched through its own QueryEncoder, so that embed and search jobs share the same
  micro-batches and the same admission.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from models.bundle.version import Bundle
from models.encoders.student import StudentEncoder
from models.errors import ContractMismatch
from models.search import Hit, Mode, Retrieved, SearchOptions, dense_hits, search, set_search_threads
from models.timing import StageObserver
from service.core.batcher import BatchLimits, BatchOutcome, MicroBatcher, Search
from service.core.query_cache import QueryCache

Retrieve = Callable[[np.ndarray | None, list[str], SearchOptions, int], Retrieved]


class RemoteRetrieval(Protocol):
    """Where searchers retrieve instead of in this process (`tandem serve --cluster`: shards on Ray Serve, cluster/).
    `attach` runs once per loaded version, before it goes into service (a hot reload waits for it), and returns that
    version's retrieve, so a request, which leases one searcher, is pinned to one version."""

    def attach(self, bundle: Bundle) -> Retrieve: ...


_remote: RemoteRetrieval | None = None


def retrieve_remotely(remote: RemoteRetrieval | None) -> None:
    """Have every searcher loaded from now on retrieve through `remote` (None: in process, the default). Set once, by
    the CLI, before the server starts: the service itself never imports what implements it."""
    global _remote
    _remote = remote


class QueryEncoder:
    """The student behind admission and micro-batching: `embed` is what /v1/embeddings awaits.

    It needs no bundle. A Searcher builds its own, passing its search, so that its searches and the embed
    jobs share micro-batches and admission as they always have."""

    def __init__(self, student: StudentEncoder, limits: BatchLimits, search: Search | None = None) -> None:
        self.student = student
        self.cache: QueryCache | None = None  # set by service.core.loader when TANDEM_QUERY_CACHE > 0
        # One query per ONNX call, whatever max_batch: the int8 student scales activations per call, so a query
        # encoded with batchmates would get another vector, and a request's answer would depend on its neighbours.
        # Micro-batches share the search, never the encode (docs/decisions.md, "One query per ONNX call").
        self.encode_batch = 1
        self.batcher = MicroBatcher(
            self.encode, search, max_batch=limits.max_batch, max_wait_s=limits.max_wait_s,
            max_pending=limits.max_pending, max_queue_s=limits.max_queue_s, workers=limits.workers,
        )

    @property
    def dim(self) -> int:
        """The width of the vectors: the teacher's dim."""
        return self.student.dim

    @property
    def name(self) -> str:
        """The student's directory name, which /v1/embeddings answers as its `model`."""
        return self.student.directory.name

    def encode(self, texts: Sequence[str], scopes: Sequence[Hashable] = ()) -> tuple[np.ndarray, list[int]]:
        """A micro-batch's vectors and token counts, each text in an ONNX call of its own; run on the workers. With a
        cache, only the texts it lacks are encoded (service.core.query_cache), each looked up and kept in the
        partition of the key that asked it (`scopes`, one per text; none: the key-less partition)."""
        cache = self.cache
        if cache is None:
            return self.student.encode_counted(texts, batch_size=self.encode_batch)
        identity = self.student.identity
        owners = scopes or [""] * len(texts)
        keys = [(scope, identity, self.student.query_key(text)) for scope, text in zip(owners, texts, strict=True)]
        found = cache.get_many(keys)
        missing = [i for i, entry in enumerate(found) if entry is None]
        if missing:
            encoded, counts = self.student.encode_counted([texts[i] for i in missing], batch_size=self.encode_batch)
            cache.put_many([keys[i] for i in missing], encoded, counts)
            if len(missing) == len(texts):
                return encoded, counts
            for row, i in enumerate(missing):
                found[i] = (encoded[row], counts[row])
        entries = [entry for entry in found if entry is not None]  # every one, now
        return np.stack([vector for vector, _ in entries]), [tokens for _, tokens in entries]

    async def embed(self, texts: Sequence[str], timeout_s: float, scope: Hashable = "") -> BatchOutcome:
        """The student's vectors and token counts of `texts` (outcome.vectors, outcome.tokens): Overloaded at once
        when admission refuses, DeadlineExceeded after timeout_s. `scope`: the cache partition of the key asking."""
        return await self.batcher.embed(texts, timeout_s, scope)

    def close(self) -> None:
        """Run or drop what is queued and stop the workers; the student stays open (a reload shares it)."""
        self.batcher.close()


class Searcher:
    """A loaded bundle searched through a QueryEncoder: `search` is what /search awaits.

    Which searcher is in service, who holds it (leases) and when a replaced one closes is service.core.loader's
    business; a searcher only answers."""

    def __init__(self, bundle: Bundle, student: StudentEncoder, *, limits: BatchLimits, oversample: int,
                 search_threads: int) -> None:
        bundle.check_student(student.teacher)
        self.bundle = bundle
        self.student = student
        self.loaded_at = time.time()
        self.limits = limits
        self._summary: Mapping[str, object] | None = None
        self.oversample = oversample
        self.search_threads = search_threads
        # the version's retrieve on the shards (`retrieve_remotely`), or None: in this process
        self._remote: Retrieve | None = None if _remote is None else _remote.attach(bundle)
        # numpy's BLAS (OpenBLAS) is process-wide and starts a thread per core: a binary bundle's query spin,
        # one 1×d by d×d product per query, then hands off to threads that spin-wait on the cores ONNX Runtime
        # and FAISS need. Under load that product took 12% of the server's samples (py-spy);
        # with search_threads BLAS threads, like FAISS, it runs in the calling worker
        # (docs/decisions.md#one-blas-thread-per-search-thread).
        threadpool_limits(limits=search_threads, user_api="blas")
        self.encoder = QueryEncoder(student, limits, search=self.retrieve)
        self.batcher = self.encoder.batcher
        self._on_close: list[Callable[[], None]] = []
        # held while the student is let go or taken again (service.core.loader: a version kept for rollback)
        self.student_lock = threading.Lock()
        self.detached = False

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
            self.retrieve(None, ["warmup"], SearchOptions(top_k=1, mode=Mode.LEXICAL))

    def observe_stages(self, observe: StageObserver) -> None:
        """Time tokenization (the student) and int8 rescoring (the index) from now on: service.core.loader wires
        the metrics here once per loaded searcher. A shared student is wired again, to the same observer."""
        self.student.observe = observe
        for segment in self.bundle.segments:
            segment.vectors.observe = observe

    @property
    def version(self) -> str:
        """The bundle directory's name: with the manifest's build_time, what a client sees switch on a reload."""
        return self.bundle.directory.name

    def index_summary(self) -> Mapping[str, object]:
        """What every answer says of the bundle that gave it: built once, since a searcher's bundle never changes."""
        if self._summary is None:
            self._summary = {**self.bundle.manifest.summary(), "version": self.version}  # read-only: shared
        return self._summary

    @property
    def pending(self) -> int:
        """Queries queued or running (the tandem_queue_depth gauge)."""
        return self.batcher.pending

    async def search(self, queries: Sequence[str], options: SearchOptions | int, timeout_s: float,
                     scope: Hashable = "") -> BatchOutcome:
        """The hits of `queries`, once a worker has encoded and searched them in a micro-batch: Overloaded at once
        when admission refuses, DeadlineExceeded after timeout_s. The event loop only awaits. `scope`: the cache
        partition of the key asking (service.http.keyring.KeyScope.partition)."""
        return await self.batcher.search(queries, options, timeout_s, scope)

    def retrieve(self, vectors: np.ndarray | None, queries: list[str], options: SearchOptions) -> Retrieved:
        """Any mode, filters and pages (models.search) for the queries of one set of options; run on the workers."""
        if self._remote is not None:  # the shards of this version (models.search.shards): the same answer
            return self._remote(vectors, queries, options, self.oversample)
        # OpenMP's thread count is per calling thread, so it is set here, in the worker that searches.
        set_search_threads(self.search_threads)
        return search(self.bundle, vectors, queries, options, self.oversample)

    def search_vectors(self, vectors: np.ndarray, top_k: int) -> list[list[Hit]]:
        """Dense top-k of query vectors, unfiltered (warmup and tests)."""
        set_search_threads(self.search_threads)
        return dense_hits(self.bundle, vectors, top_k, self.oversample)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` once this searcher lets its student go (closed, or detached, after its last request):
        how a pooled student learns that one fewer searcher holds it (service.core.collections.StudentPool)."""
        self._on_close.append(callback)

    def detach(self) -> None:
        """Stop encoding and let the student go, keeping the bundle open: a version kept for rollback holds its
        bundle (which the indexer may prune from disk), not its student (which it can load again); `attach`
        brings one back. The caller holds `student_lock`."""
        if self.detached:
            return
        self.detached = True
        self.encoder.close()
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()

    def attach(self, student: StudentEncoder) -> None:
        """Encode with `student` again after `detach` (a rollback), checked as a reload checks a student: the
        bundle's teacher, then a warm-up query (its output width). The caller holds `student_lock`; on failure the
        searcher stays detached and the caller gives the student back."""
        self.bundle.check_student(student.teacher)
        encoder = QueryEncoder(student, self.limits, search=self.retrieve)
        try:
            vec = student.encode(["warmup"])
            if vec.shape[1] != self.bundle.teacher.dim:
                raise ContractMismatch(f"student {student.directory} outputs {vec.shape[1]}-d vectors but its "
                                       f"manifest and the index say {self.bundle.teacher.dim}-d")
        except BaseException:
            encoder.close()
            raise
        self.student, self.encoder, self.batcher = student, encoder, encoder.batcher
        self.detached = False

    def close(self) -> None:
        with self.student_lock:
            self.encoder.close()
            self.bundle.close()
            self.detached = True
            callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()
