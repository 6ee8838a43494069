"""Micro-batching with admission control: queries queued by requests, run in batches by worker threads (or by
the event loop), answered one job at a time.

`MicroBatcher` batches over two plain functions, encode and search (service.core.searcher passes the student's
encode and a Searcher's retrieve; the tests pass their own), so it is tested without a model.

Concurrent requests can share one ONNX call and one search per distinct set of options (top_k,
mode, filter, ...: models.search.SearchOptions), up to `max_batch` queries (TANDEM_BATCH_MAX_QUERIES;
1 by default, because the int8 student's dynamic quantization scales activations per call, so batchmates
move a query's vector slightly). A worker waits at most `max_wait_s` for company, and only while other work
is pending: a lone request never pays the wait. A batch request is one job, whatever its size;
`QueryEncoder.encode` runs its queries `max_batch` per ONNX call.

Admission is bounded twice, and a request refused is refused at once (`Overloaded`, a 429),
never left to wait without bound:
- by count: at most `max_pending` queries may be queued or running;
- by time: while every worker is busy, a job is refused when the queue ahead of it would take
  longer than `max_queue_s`, judged from a moving average of the measured seconds per query.
  A count alone cannot keep a latency budget: the same queue drains in 40 ms on one machine
  and in 400 ms on another, or with a slower index.

With `workers` 0 there are no worker threads: the event loop runs each batch itself, between its rounds of
network I/O (`_drain`, one batch per round, so the requests that arrived meanwhile are read and admitted
between two batches). That saves the two thread hand-offs a query costs, and the cache the loop and a worker
thread evict from each other on a shared core: measured the cheapest per query with one process per core
(`--processes`, docs/decisions.md#batches-on-the-event-loop). The price: while a batch runs, nothing
else of that process runs, probes included, and a refusal waits for the batch in progress. The pace the
admission judges by then runs from the end of one batch to the end of the next behind a backlog, the loop's
I/O round between them included.

A job whose deadline passed while it was queued is dropped unrun (`DeadlineExceeded`), and a request
that gives up at its deadline cancels its queued job and returns its queries' capacity at once, so
abandoned work never crowds out live requests. `close` waits for the jobs running on the workers, so
the bundle they search is never closed under them.

A job without options (`embed`, for /v1/embeddings) is encoded like any other, in the same
micro-batches and under the same admission, and skips the search: its outcome carries the
student's vectors and their token counts instead of hits. A lexical job skips the encoding
instead, but is admitted, batched and timed alike (its BM25 time is `lexical` in the timings).

A request that fails, fails alone: when a batch's encode or one of its searches raises, each of its jobs runs
again by itself (`MicroBatcher._run_alone`), so that only the job that cannot be answered gets the error and
its batchmates get their answers. A lone job's error is its own at once.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np

from models.errors import TandemError
from models.search import Hit, Retrieved, SearchOptions

log = logging.getLogger(__name__)


# (the texts, and per text the scope of the key that asked: whose partition of the query-vector cache it may read
# and fill, service.core.query_cache) → vectors and tokens per text
Encode = Callable[[Sequence[str], Sequence[Hashable]], tuple[np.ndarray, list[int]]]
# (vectors of the queries, or None for a lexical search; the queries; their options) → hits
Search = Callable[[np.ndarray | None, list[str], SearchOptions], Retrieved]


class Overloaded(Exception):
    """More queries are pending than the service admits; the client should retry later."""


class DeadlineExceeded(Exception):
    """The request waited longer than its deadline; it was not (or no longer) worth running."""


@dataclass(frozen=True)
class BatchOutcome:
    hits: list[list[Hit]]  # one list per query of the job, in order (empty for an encode-only job)
    timing_ms: dict[str, float]  # queue, encode, search, lexical, filter
    batch_size: int  # queries in this job's micro-batch, its own included (encoded max_batch per call)
    vectors: np.ndarray | None = None  # encode-only jobs: float32 [queries, dim], the teacher's space
    tokens: list[int] | None = None  # encode-only jobs: tokens encoded per query


@dataclass
class _Job:
    queries: list[str]
    options: SearchOptions | None  # None: encode only
    deadline: float  # time.monotonic()
    scope: Hashable = ""  # who asked (the key's cache partition): its texts read and fill that partition only
    future: Future[BatchOutcome] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)
    released: bool = False  # its queries no longer count as pending (under MicroBatcher._lock)


def _settle(done: Future[BatchOutcome], waiter: asyncio.Future[BatchOutcome]) -> None:
    """On the event loop: pass a finished job's outcome to its waiting request, unless that one gave up."""
    if waiter.done():
        return
    if done.cancelled():
        waiter.cancel()
    elif (exc := done.exception()) is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(done.result())


def _expire(waiter: asyncio.Future[BatchOutcome]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


_SMOOTHING = 0.1  # weight of the latest batch in the moving average of seconds per query


class MicroBatcher:
    """Worker threads (or, with `workers` 0, the event loop) drain a queue of jobs, coalescing up to `max_batch`
    queries per ONNX call.

    `encode` and `search` are plain functions (QueryEncoder passes its encode, a Searcher its retrieve), so the
    batching is tested without a model; without a `search` it takes encode-only jobs alone."""

    def __init__(
        self, encode: Encode, search: Search | None, *, max_batch: int, max_wait_s: float, max_pending: int,
        max_queue_s: float, workers: int,
    ) -> None:
        self._encode, self._search = encode, search
        self.max_batch, self.max_wait_s, self.max_pending = max_batch, max_wait_s, max_pending
        self.max_queue_s, self.workers = max_queue_s, workers
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0
        self._seconds_per_query: float | None = None  # unknown until a batch has run
        self._closed = False
        # workers == 0: jobs wait here for the event loop, which runs them in `_drain`, one batch per round
        self._inline: deque[_Job] = deque()
        self._drain_scheduled = False
        self._running = threading.Lock()  # held while the loop runs a batch: `close` waits for it
        self._backlog_since: float | None = None  # when the last batch ended with more queued (workers=0)
        self._threads = [
            threading.Thread(target=self._work, name=f"tandem-batch-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def _queue_wait_s(self) -> float:
        """Estimated wait of a job admitted now (under the lock): zero while a worker is free, else the queries
        ahead of it (one finishing on each busy worker, the rest queued) at the measured pace of all workers."""
        lanes = max(self.workers, 1)  # the event loop is one lane
        ahead = self._pending - lanes + 1
        if ahead <= 0 or self._seconds_per_query is None:
            return 0.0
        return ahead * self._seconds_per_query / lanes

    def submit(self, queries: Sequence[str], options: SearchOptions | int | None,
               timeout_s: float, scope: Hashable = "") -> Future[BatchOutcome]:
        """Queue a job, or raise Overloaded at once if admitting it would exceed max_pending or max_queue_s.

        `options` may be a bare top_k (a dense search), or None to encode only; `scope`: who asks (the encode is
        told it per text)."""
        return self._submit(queries, options, timeout_s, scope).future

    def _release(self, jobs: Sequence[_Job]) -> None:
        with self._lock:
            for job in jobs:
                if not job.released:
                    job.released = True
                    self._pending -= len(job.queries)

    def _submit(self, queries: Sequence[str], options: SearchOptions | int | None, timeout_s: float,
                scope: Hashable = "") -> _Job:
        if isinstance(options, int):
            options = SearchOptions(top_k=options)
        if options is not None and self._search is None:
            raise ValueError("this batcher only encodes: it was given no search")
        job = _Job(list(queries), options, time.monotonic() + timeout_s, scope)
        with self._lock:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            if self._pending + len(job.queries) > self.max_pending:
                raise Overloaded(f"{self._pending} queries pending, at most {self.max_pending} are admitted")
            if (wait := self._queue_wait_s()) > self.max_queue_s:
                raise Overloaded(f"the queue would take about {wait * 1e3:.0f} ms, more than the "
                                 f"{self.max_queue_s * 1e3:.0f} ms admitted")
            self._pending += len(job.queries)
        if self.workers:
            self._queue.put(job)
        else:
            self._enqueue_inline(job)
        return job

    def _enqueue_inline(self, job: _Job) -> None:
        """Queue `job` for the event loop (the caller runs on it) and make sure a `_drain` is coming."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._release([job])
            raise RuntimeError("with workers=0 jobs run on the event loop: submit them from it") from None
        self._inline.append(job)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            loop.call_soon(self._drain)

    def _drain(self) -> None:
        """On the event loop: run one batch of the queued jobs, then yield to the loop's I/O before the next.
        The requests it answers are woken before the next `_drain` (their waiters are settled in `_run`, on
        this thread), so each answer goes out before the next batch starts."""
        self._drain_scheduled = False
        with self._running:
            if jobs := self._take_inline():
                # Behind a backlog, a batch's turn came only after the loop's I/O round since the last one:
                # that round is part of the pace the queue drains at, so the admission's estimate counts it.
                self._run_released(jobs, self._backlog_since)
        if self._inline:
            self._backlog_since = time.monotonic()
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)
        else:
            self._backlog_since = None

    def _take_inline(self) -> list[_Job]:
        """The next queued job plus those behind it, while the batch has room: the loop never waits for company."""
        jobs: list[_Job] = []
        size = 0
        while self._inline and (not jobs or size + len(self._inline[0].queries) <= self.max_batch):
            job = self._inline.popleft()
            jobs.append(job)
            size += len(job.queries)
        return jobs

    async def search(self, queries: Sequence[str], options: SearchOptions | int, timeout_s: float,
                     scope: Hashable = "") -> BatchOutcome:
        """Submit and await without blocking the event loop; DeadlineExceeded after timeout_s."""
        return await self._await(self._submit(queries, options, timeout_s, scope), timeout_s)

    async def embed(self, queries: Sequence[str], timeout_s: float, scope: Hashable = "") -> BatchOutcome:
        """Encode only (outcome.vectors, outcome.tokens), admitted and batched like a search."""
        return await self._await(self._submit(queries, None, timeout_s, scope), timeout_s)

    async def _await(self, job: _Job, timeout_s: float) -> BatchOutcome:
        """The job's outcome, relayed to the event loop by one callback, with one timer for the deadline: the same
        as `wait_for(shield(wrap_future(...)))` (a request cancelled by its client leaves the job to run), without
        their two extra futures and task-level timeout on the event loop (docs/decisions.md#one-callback-per-job)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[BatchOutcome] = loop.create_future()
        loop_thread = threading.get_ident()

        def relay(done: Future[BatchOutcome]) -> None:  # on the thread that finished the job
            if threading.get_ident() == loop_thread:  # workers=0: the loop ran it
                _settle(done, waiter)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(_settle, done, waiter)

        job.future.add_done_callback(relay)
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            return await waiter
        except TimeoutError:
            if job.future.cancel():  # still queued: a worker will skip it, and its capacity is free now
                self._release([job])
            raise DeadlineExceeded(f"no answer within {timeout_s * 1e3:.0f} ms") from None
        finally:
            timer.cancel()

    def close(self) -> None:
        """Refuse new jobs, let the workers finish what is queued (expired jobs are dropped unrun), and return
        only once every worker has stopped: the caller may then close what the jobs use. With workers=0 the
        jobs still queued run here, after the batch the event loop may be running."""
        with self._lock:
            self._closed = True
        with self._running:
            while jobs := self._take_inline():
                self._run_released(jobs)
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def _gather(self, first: _Job) -> list[_Job]:
        """`first` plus whatever joins within max_wait_s, while other work is pending and the batch has room."""
        jobs, size = [first], len(first.queries)
        until = time.monotonic() + self.max_wait_s
        while size < self.max_batch:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                remaining = until - time.monotonic()
                if remaining <= 0 or self.pending <= size:  # nobody else is coming: do not wait
                    break
                try:
                    job = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if job is None:
                self._queue.put(None)  # a shutdown sentinel: leave it for this worker's next get
                break
            jobs.append(job)
            size += len(job.queries)
        return jobs

    def _work(self) -> None:
        while (first := self._queue.get()) is not None:
            self._run_released(self._gather(first))

    def _run_released(self, jobs: list[_Job], paced_from: float | None = None) -> None:
        """Run a batch, then return its queries' capacity to the admission, whatever happened."""
        try:
            self._run(jobs, paced_from)
        finally:
            self._release(jobs)

    def _run(self, jobs: list[_Job], paced_from: float | None = None) -> None:
        """Run a batch; its seconds per query, from `paced_from` (default: its start), feed the admission's pace.

        A job fails alone: when the batch's encode or one of its searches raises, each job runs again by itself
        (`_run_alone`), so that only a job that fails on its own gets the error, and its batchmates their answers."""
        started = time.monotonic()
        live = _live(jobs, started)
        if not live:
            return
        outcomes: list[BatchOutcome | Exception]
        try:
            done, answered = self._answer(live, started)
            outcomes = list(answered)
        except Exception as exc:  # the worker lives on
            if len(live) == 1:
                _log_failure(live[0], exc)
                live[0].future.set_exception(exc)
                return
            log.warning("a batch of %d jobs failed (%s: %s); each job runs again alone", len(live),
                        type(exc).__name__, exc)
            outcomes = [self._run_alone(job) for job in live]
            done = time.monotonic()
        size = sum(len(job.queries) for job in live)
        self._learn_pace((done - (started if paced_from is None else paced_from)) / size)
        for job, outcome in zip(live, outcomes, strict=True):
            if isinstance(outcome, Exception):  # the request gets its own error (a 500 unless the app maps it)
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)

    def _run_alone(self, job: _Job) -> BatchOutcome | Exception:
        """One job of a failed batch, answered by itself: its outcome, or the error it alone raises. Its queue time
        runs until now (the failed batch included), and its batch is its own queries."""
        started = time.monotonic()
        if job.deadline <= started:
            return DeadlineExceeded("the request expired while its batch failed")
        try:
            return self._answer([job], started)[1][0]
        except Exception as exc:
            _log_failure(job, exc)
            return exc

    def _answer(self, live: list[_Job], started: float) -> tuple[float, list[BatchOutcome]]:
        """Encode and search a batch: when the search ended, and each job's outcome, in order. Raises what the
        encode or a search raises."""
        encoded = self._encode_jobs(live)
        searched = self._search_jobs(live, encoded)
        done = time.monotonic()
        size = sum(len(job.queries) for job in live)
        outcomes = []
        for i, job in enumerate(live):
            timing = {"queue": (started - job.enqueued) * 1e3, "encode": (encoded.at - started) * 1e3}
            if job.options is None:
                outcomes.append(_embedded(encoded, i, timing, size))
            else:
                outcomes.append(_found(searched[i], timing, (done - encoded.at) * 1e3, size))
        return done, outcomes

    def _encode_jobs(self, live: list[_Job]) -> _Encoded:
        """One encode for every query of the batch that needs a vector (embed jobs, dense and hybrid searches)."""
        spans: dict[int, tuple[int, int]] = {}  # each encoded job's rows in `vectors`
        texts: list[str] = []
        scopes: list[Hashable] = []
        for i, job in enumerate(live):
            if job.options is None or job.options.needs_vectors:
                spans[i] = (len(texts), len(texts) + len(job.queries))
                texts += job.queries
                scopes += [job.scope] * len(job.queries)
        vectors, tokens = self._encode(texts, scopes) if texts else (None, [])
        return _Encoded(vectors, tokens, spans, time.monotonic())

    def _search_jobs(self, live: list[_Job], encoded: _Encoded) -> dict[int, Retrieved]:
        """One search per distinct set of options, each job's hits (and the group's BM25 time) cut back out.

        Jobs group by `SearchOptions.key`, their options tagged value by value with their types, never by Python's
        equality, under which `{"eq": true}` and `{"eq": 1}` are one filter and would share one answer."""
        groups: dict[object, list[int]] = {}
        for i, job in enumerate(live):
            if job.options is not None:
                groups.setdefault(job.options.key, []).append(i)
        searched: dict[int, Retrieved] = {}
        search = self._search
        for members in groups.values():
            assert search is not None  # _submit admits no search job without one
            options = live[members[0]].options
            assert options is not None
            group_vectors = None
            if options.needs_vectors and encoded.vectors is not None:
                group_vectors = encoded.vectors[np.concatenate([np.arange(*encoded.spans[i]) for i in members])]
            # the search stops between segments and stages once every member's deadline has passed
            deadline = max(live[i].deadline for i in members)
            found = search(group_vectors, [q for i in members for q in live[i].queries],
                           replace(options, deadline=deadline))
            answers = iter(found.hits)
            for i in members:
                searched[i] = Retrieved([next(answers) for _ in live[i].queries], found.lexical_s, found.filter_s)
        return searched

    def _learn_pace(self, pace: float) -> None:
        with self._lock:
            previous = self._seconds_per_query
            self._seconds_per_query = pace if previous is None else previous + _SMOOTHING * (pace - previous)


def _log_failure(job: _Job, exc: Exception) -> None:
    """A job's failure in the log: a TandemError (a past deadline, input the search refused) is the user's to fix
    and says so in one line; anything else is a defect, logged with its traceback."""
    if isinstance(exc, TandemError):
        log.warning("a job of %d queries failed: %s: %s", len(job.queries), type(exc).__name__, exc)
    else:
        log.exception("a job of %d queries failed", len(job.queries))


@dataclass(frozen=True)
class _Encoded:
    vectors: np.ndarray | None  # every encoded query of the batch, jobs in order
    tokens: list[int]
    spans: dict[int, tuple[int, int]]  # a job's (index in the batch) first and past-last row
    at: float  # time.monotonic() when the encode ended


def _live(jobs: list[_Job], started: float) -> list[_Job]:
    """The jobs still wanted: a cancelled one is skipped, one past its deadline fails unrun."""
    live = []
    for job in jobs:
        if not job.future.set_running_or_notify_cancel():
            continue
        if job.deadline <= started:
            job.future.set_exception(DeadlineExceeded("the request expired while queued"))
        else:
            live.append(job)
    return live


def _embedded(encoded: _Encoded, i: int, timing: dict[str, float], size: int) -> BatchOutcome:
    """An embed job's outcome: its rows of the batch's vectors and their token counts; no search time."""
    assert encoded.vectors is not None
    first, last = encoded.spans[i]
    return BatchOutcome(hits=[], timing_ms={**timing, "search": 0.0, "lexical": 0.0, "filter": 0.0}, batch_size=size,
                        vectors=encoded.vectors[first:last].copy(), tokens=encoded.tokens[first:last])


def _found(retrieved: Retrieved, timing: dict[str, float], searched_ms: float, size: int) -> BatchOutcome:
    """A search job's outcome: its hits; the batch's search time, less its group's BM25 time (`lexical`) and the
    time its filter took to become rows (`filter`)."""
    lexical, filtering = retrieved.lexical_s * 1e3, retrieved.filter_s * 1e3
    return BatchOutcome(hits=retrieved.hits, timing_ms={
        **timing, "search": max(0.0, searched_ms - lexical - filtering), "lexical": lexical, "filter": filtering},
        batch_size=size)


@dataclass(frozen=True)
class BatchLimits:
    """How queries are batched and admitted: service.core.loader reads them from the settings
    (TANDEM_BATCH_MAX_QUERIES, TANDEM_BATCH_WAIT_MS, TANDEM_MAX_PENDING, TANDEM_MAX_QUEUE_MS, TANDEM_WORKERS)."""

    max_batch: int
    max_wait_s: float
    max_pending: int
    max_queue_s: float
    workers: int
