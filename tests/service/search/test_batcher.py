"""Micro-batching (service.core.batcher): first over plain functions, loading no model (coalescing, grouping by
options, admission, deadlines, encode-only and lexical jobs, failures, each job's failure its own); then over the
real tiny bundle and ONNX student: same answers, coalesced, bounded, a failing job failing alone."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from models.corpus import Document
from models.encoders.student import StudentEncoder
from models.errors import InputError
from models.search import Filter, Hit, Mode, Retrieved, SearchOptions
from service.core.batcher import BatchLimits, BatchOutcome, DeadlineExceeded, MicroBatcher, Overloaded
from service.core.loader import open_searcher
from service.core.searcher import QueryEncoder, Searcher
from service.settings import ServiceSettings
from tests.fixtures.corpus import PROBES

DIM = 4


class Recorder:
    """Plain encode and search functions that record their calls: a query's vector is its length, its hits are
    top_k copies of itself; `gate` (when cleared) holds the worker inside encode. A search with the query "boom"
    raises InputError, an encode with the text "unencodable" ValueError."""

    def __init__(self) -> None:
        self.encoded: list[list[str]] = []
        self.scopes: list[list[Hashable]] = []
        self.searched: list[tuple[list[str], SearchOptions, bool]] = []
        self.gate, self.busy = threading.Event(), threading.Event()
        self.gate.set()

    def encode(self, texts: Sequence[str], scopes: Sequence[Hashable] = ()) -> tuple[np.ndarray, list[int]]:
        self.busy.set()
        self.gate.wait()
        if "unencodable" in texts:
            raise ValueError("encode failed")
        self.encoded.append(list(texts))
        self.scopes.append(list(scopes))
        return np.array([[len(t)] * DIM for t in texts], dtype=np.float32), [len(t) for t in texts]

    def search(self, vectors: np.ndarray | None, queries: list[str], options: SearchOptions) -> Retrieved:
        if "boom" in queries:
            raise InputError("search failed")
        self.searched.append((queries, options, vectors is not None))
        if vectors is not None:
            assert [int(v[0]) for v in vectors] == [len(q) for q in queries]  # each query got its own row
        return Retrieved([[Hit(row=r, score=1.0, doc=Document(id=q, title="", text=q)) for r in range(options.top_k)]
                          for q in queries], lexical_s=0.001 if options.mode is not Mode.DENSE else 0.0)


@contextmanager
def batcher(recorder: Recorder, **limits: float) -> Iterator[MicroBatcher]:
    settings: dict[str, float] = {"max_batch": 32, "max_wait_s": 0.2, "max_pending": 64, "max_queue_s": 60.0,
                                  "workers": 1, **limits}
    made = MicroBatcher(recorder.encode, recorder.search, max_batch=int(settings["max_batch"]),
                        max_wait_s=settings["max_wait_s"], max_pending=int(settings["max_pending"]),
                        max_queue_s=settings["max_queue_s"], workers=int(settings["workers"]))
    try:
        yield made
    finally:
        recorder.gate.set()
        made.close()


def test_queued_jobs_share_an_encode_and_keep_their_own_answers() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        recorder.gate.clear()
        first = queue.submit(["held"], 1, timeout_s=30)  # holds the only worker, so the rest queue up together
        assert recorder.busy.wait(30)
        rest = [queue.submit([q], 1, timeout_s=30) for q in ("a", "bb", "ccc")]
        recorder.gate.set()
        outcomes = [f.result(timeout=30) for f in rest]
        assert first.result(timeout=30).hits == [[Hit(0, 1.0, Document("held", "", "held"))]]
    assert recorder.encoded == [["held"], ["a", "bb", "ccc"]]
    assert [[h.doc.id for h in o.hits[0]] for o in outcomes] == [["a"], ["bb"], ["ccc"]]
    assert {o.batch_size for o in outcomes} == {3}
    assert queue.pending == 0


def test_jobs_with_different_options_share_an_encode_but_not_a_search() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        recorder.gate.clear()
        queue.submit(["held"], 1, timeout_s=30)
        assert recorder.busy.wait(30)
        futures = [queue.submit(["x", "yy"], k, timeout_s=30) for k in (1, 4, 1)]
        recorder.gate.set()
        outcomes = [f.result(timeout=30) for f in futures]
    assert recorder.encoded[1] == ["x", "yy"] * 3
    assert [(q, o.top_k) for q, o, _ in recorder.searched[1:]] == [(["x", "yy", "x", "yy"], 1), (["x", "yy"], 4)]
    assert [[len(hits) for hits in o.hits] for o in outcomes] == [[1, 1], [4, 4], [1, 1]]


def test_options_that_python_calls_equal_but_answer_differently_never_share_a_search() -> None:
    """`True == 1 == 1.0` in Python, with equal hashes: grouped by equality, `{"eq": true}` and `{"eq": 1}` shared a
    search and each other's answers (issue 55). Each job also tells the encode who asked it."""
    recorder = Recorder()
    values: list[object] = [True, 1, 1.0, "1", True]
    with batcher(recorder) as queue:
        recorder.gate.clear()
        queue.submit(["held"], 1, timeout_s=30)
        assert recorder.busy.wait(30)
        futures = [queue.submit(["x"], SearchOptions(top_k=1, filter=Filter(("eq", "flag", v))), timeout_s=30,
                                scope=f"key:{i}") for i, v in enumerate(values)]
        recorder.gate.set()
        for future in futures:
            future.result(timeout=30)
    searched = [(o.filter.tree[2] if o.filter else None, len(q)) for q, o, _ in recorder.searched[1:]]
    assert [(type(v), v, n) for v, n in searched] == [(bool, True, 2), (int, 1, 1), (float, 1.0, 1), (str, "1", 1)]
    assert recorder.scopes[1] == [f"key:{i}" for i in range(len(values))]


def test_a_shared_search_carries_the_latest_deadline_of_its_jobs() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        recorder.gate.clear()
        queue.submit(["held"], 1, timeout_s=30)
        assert recorder.busy.wait(30)
        submitted = time.monotonic()
        futures = [queue.submit(["x"], 1, timeout_s=t) for t in (30, 300, 60)]  # equal options: one search
        recorder.gate.set()
        for future in futures:
            future.result(timeout=30)
    [(_, options, _)] = recorder.searched[1:]
    assert options.deadline is not None and submitted + 300 <= options.deadline <= time.monotonic() + 300


def test_an_encode_only_job_gets_vectors_and_tokens_and_no_search() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        outcome = queue.submit(["abc", "de"], None, timeout_s=30).result(timeout=30)
    assert outcome.hits == [] and outcome.tokens == [3, 2]
    assert outcome.vectors is not None and outcome.vectors[:, 0].tolist() == [3.0, 2.0]
    assert recorder.searched == []


def test_a_lexical_job_skips_the_encoder_and_reports_its_bm25_time() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        outcome = queue.submit(["tides"], SearchOptions(top_k=2, mode=Mode.LEXICAL), timeout_s=30).result(timeout=30)
    assert recorder.encoded == [] and recorder.searched[0][2] is False
    assert outcome.timing_ms["lexical"] == pytest.approx(1.0)
    assert set(outcome.timing_ms) == {"queue", "encode", "search", "lexical", "filter"}


def test_admission_refuses_past_max_pending_and_frees_capacity() -> None:
    recorder = Recorder()
    with batcher(recorder, max_pending=4, max_batch=4) as queue:
        with pytest.raises(Overloaded, match="at most 4"):
            queue.submit(["a"] * 5, 1, timeout_s=30)
        assert queue.pending == 0
        assert queue.submit(["a"] * 4, 1, timeout_s=30).result(timeout=30).batch_size == 4
    assert queue.pending == 0


def test_an_expired_job_is_dropped_unrun() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        with pytest.raises(DeadlineExceeded):
            queue.submit(["late"], 1, timeout_s=0).result(timeout=30)
        assert queue.pending == 0
    assert recorder.encoded == []


def test_a_failed_job_gets_its_error_and_the_worker_lives_on(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        with pytest.raises(InputError, match="search failed"):
            queue.submit(["boom"], 1, timeout_s=30).result(timeout=30)
        assert queue.submit(["after"], 1, timeout_s=30).result(timeout=30).hits[0][0].doc.id == "after"
    # an error the user can fix (a TandemError: refused input, a past deadline) is one line, not a traceback
    failed = [r for r in caplog.records if "queries failed" in r.getMessage()]
    assert [(r.levelname, r.exc_info) for r in failed] == [("WARNING", None)]
    assert "InputError" in failed[0].getMessage()


def test_a_job_whose_search_fails_fails_alone_and_its_batchmates_get_their_answers() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        recorder.gate.clear()
        queue.submit(["held"], 1, timeout_s=30)  # holds the only worker, so the rest queue up together
        assert recorder.busy.wait(30)
        futures = [queue.submit(q, 1, timeout_s=30) for q in (["a"], ["boom"], ["cc", "ddd"])]
        recorder.gate.set()
        with pytest.raises(InputError, match="search failed"):
            futures[1].result(timeout=30)
        good = [futures[0].result(timeout=30), futures[2].result(timeout=30)]
        assert queue.pending == 0
    assert recorder.encoded[1] == ["a", "boom", "cc", "ddd"]  # one batch, whose one search raised
    assert [[h.doc.id for h in hits] for o in good for hits in o.hits] == [["a"], ["cc"], ["ddd"]]
    assert [o.batch_size for o in good] == [1, 2]  # each answered by itself
    assert [q for q, _, _ in recorder.searched[1:]] == [["a"], ["cc", "ddd"]]


def test_a_job_whose_encode_fails_fails_alone_and_an_embed_batchmate_gets_its_vectors() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        recorder.gate.clear()
        queue.submit(["held"], 1, timeout_s=30)
        assert recorder.busy.wait(30)
        embedded = queue.submit(["abc"], None, timeout_s=30)
        failing = queue.submit(["unencodable"], 1, timeout_s=30)
        searched = queue.submit(["de"], 1, timeout_s=30)
        recorder.gate.set()
        with pytest.raises(ValueError, match="encode failed"):
            failing.result(timeout=30)
        vectors = embedded.result(timeout=30).vectors
        assert vectors is not None and vectors[:, 0].tolist() == [3.0]
        assert searched.result(timeout=30).hits[0][0].doc.id == "de"
        assert queue.pending == 0


def test_a_closed_batcher_refuses_new_jobs() -> None:
    recorder = Recorder()
    with batcher(recorder) as queue:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        queue.submit(["a"], 1, timeout_s=30)


class LoopRecorder(Recorder):
    """A Recorder for workers=0 that notes which thread encoded, and when: beside the answers' arrival in `events`."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()
        self.events: list[str] = []

    def encode(self, texts: Sequence[str], scopes: Sequence[Hashable] = ()) -> tuple[np.ndarray, list[int]]:
        self.threads.add(threading.get_ident())
        self.events.append("encode " + ",".join(texts))
        return super().encode(texts)


def test_with_no_workers_the_event_loop_runs_one_batch_per_round_and_answers_between() -> None:
    recorder = LoopRecorder()

    async def ask(queue: MicroBatcher, query: str) -> list[str]:
        outcome = await queue.search([query], 1, timeout_s=30)
        recorder.events.append("answer " + query)
        return [hit.doc.id for hit in outcome.hits[0]]

    async def scenario() -> tuple[list[list[str]], int]:
        with batcher(recorder, workers=0, max_batch=2) as queue:
            answers = await asyncio.gather(*(ask(queue, q) for q in ("a", "bb", "ccc")))
            assert queue.pending == 0
            return answers, threading.get_ident()

    answers, loop_thread = asyncio.run(scenario())
    assert answers == [["a"], ["bb"], ["ccc"]]
    assert recorder.threads == {loop_thread}  # no worker thread: the loop encoded
    # Two queries per batch; each batch's answers are out before the next batch starts.
    assert recorder.events == ["encode a,bb", "answer a", "answer bb", "encode ccc", "answer ccc"]


def test_with_no_workers_admission_and_deadlines_hold() -> None:
    recorder = LoopRecorder()

    async def scenario() -> None:
        with batcher(recorder, workers=0, max_pending=2, max_batch=2) as queue:
            first = asyncio.ensure_future(queue.search(["a", "b"], 1, timeout_s=30))
            await asyncio.sleep(0)  # admitted and queued; the loop has not run it yet
            with pytest.raises(Overloaded, match="at most 2"):
                queue.submit(["c"], 1, timeout_s=30)
            assert (await first).batch_size == 2
            with pytest.raises(DeadlineExceeded):
                await queue.search(["late"], 1, timeout_s=0)
            assert queue.pending == 0

    asyncio.run(scenario())
    assert recorder.encoded == [["a", "b"]]  # the expired job was dropped unrun


def test_with_no_workers_a_failing_job_fails_alone() -> None:
    recorder = LoopRecorder()

    async def scenario() -> list[BaseException | BatchOutcome]:
        with batcher(recorder, workers=0, max_batch=3) as queue:
            return await asyncio.gather(*(queue.search([q], 1, timeout_s=30) for q in ("a", "boom", "ccc")),
                                        return_exceptions=True)

    first, failed, last = asyncio.run(scenario())
    assert isinstance(failed, InputError)
    assert isinstance(first, BatchOutcome) and first.hits[0][0].doc.id == "a"
    assert isinstance(last, BatchOutcome) and last.hits[0][0].doc.id == "ccc"
    assert recorder.encoded[0] == ["a", "boom", "ccc"]  # they were one batch


def test_with_no_workers_the_admission_paces_the_queue_by_the_loops_whole_round() -> None:
    """Behind a backlog the event loop runs one batch per round, and whatever else it does in a round (other
    requests' I/O, here a 20 ms hog) delays the next batch: the admission's estimate must count it, even though
    each encode takes no time at all."""
    recorder = LoopRecorder()

    async def scenario() -> list[bool]:
        loop = asyncio.get_running_loop()
        hogging = True

        def hog() -> None:
            time.sleep(0.02)
            if hogging:
                loop.call_soon(hog)

        with batcher(recorder, workers=0, max_batch=1, max_queue_s=0.05) as queue:
            loop.call_soon(hog)
            await asyncio.gather(*(queue.search([q], 1, timeout_s=30) for q in "abcdefgh"))  # a backlog, drained
            admitted: list[Future[BatchOutcome] | None] = []
            for q in "ijklmnopqr":  # ten at once: the last ones would wait nine rounds of over 20 ms
                try:
                    admitted.append(queue.submit([q], 1, timeout_s=30))
                except Overloaded:
                    admitted.append(None)
            hogging = False
            await asyncio.gather(*(asyncio.wrap_future(f) for f in admitted if f is not None))
            return [f is not None for f in admitted]

    outcome = asyncio.run(scenario())
    assert outcome[0] and not outcome[-1], outcome  # the first admitted at once, the last refused


def test_with_no_workers_jobs_come_from_the_event_loop_and_close_runs_what_is_queued() -> None:
    recorder = LoopRecorder()
    with batcher(recorder, workers=0) as queue:
        with pytest.raises(RuntimeError, match="event loop"):
            queue.submit(["a"], 1, timeout_s=30)  # no loop in this thread to run it
        assert queue.pending == 0

    async def queued_then_closed() -> None:
        with batcher(recorder, workers=0) as closing:
            job = closing.submit(["queued"], 1, timeout_s=30)
        assert job.result(timeout=0).hits[0][0].doc.id == "queued"  # `close` ran it before returning

    asyncio.run(queued_then_closed())


COALESCE: dict[str, object] = {"workers": 1, "batch_wait_ms": 200.0, "batch_max_queries": 32}


@contextmanager
def _searcher(bundle: Path, student: Path, **settings: object) -> Iterator[Searcher]:
    searcher = open_searcher(ServiceSettings(index=bundle, student=student, **settings))
    try:
        yield searcher
    finally:
        searcher.close()


@pytest.fixture()
def searcher(mini_bundle: Path, mini_student: Path) -> Iterator[Searcher]:
    # One worker and a generous wait, so that jobs queued together are encoded together. fp32, because
    # int8 dynamic quantization scales activations per batch: batchmates move a vector (cosine ≥ 0.99).
    # The tiny models (tests/fixtures/tiny_service.py): these tests compare answers with those alone.
    with _searcher(mini_bundle, mini_student, student_precision="fp32", **COALESCE) as loaded:
        yield loaded


def _ids(hits: list) -> list[str]:
    return [hit.doc.id for hit in hits]


@pytest.mark.slow
def test_coalesced_jobs_get_the_answers_they_would_get_alone(searcher: Searcher) -> None:
    queries = sorted(PROBES)
    alone = {q: _ids(searcher.search_vectors(searcher.student.encode([q]), 3)[0]) for q in queries}
    futures = [searcher.batcher.submit([q], 3, timeout_s=30) for q in queries]
    outcomes = [f.result(timeout=30) for f in futures]
    assert [_ids(o.hits[0]) for o in outcomes] == [alone[q] for q in queries]
    assert max(o.batch_size for o in outcomes) > 1  # some of them shared an ONNX call
    assert searcher.batcher.pending == 0


@pytest.mark.slow
def test_int8_batches_keep_each_querys_best_hit(tiny_bundle: Path, tiny_student: Path) -> None:
    with _searcher(tiny_bundle, tiny_student, **COALESCE) as searcher:
        futures = [searcher.batcher.submit([q], 1, timeout_s=30) for q in sorted(PROBES)]
        assert [_ids(f.result(timeout=30).hits[0]) for f in futures] == [[PROBES[q]] for q in sorted(PROBES)]


@pytest.mark.slow
def test_jobs_with_different_top_k_share_a_batch_but_not_a_cutoff(searcher: Searcher) -> None:
    futures = [searcher.batcher.submit(sorted(PROBES)[:2], k, timeout_s=30) for k in (1, 4, 2)]
    outcomes = [f.result(timeout=30) for f in futures]
    assert [[len(hits) for hits in o.hits] for o in outcomes] == [[1, 1], [4, 4], [2, 2]]
    assert outcomes[1].hits[0][:1] == outcomes[0].hits[0]


@pytest.mark.slow
def test_a_failing_request_fails_alone_beside_real_searches(searcher: Searcher,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The (tiny) student and bundle behind a batcher whose search raises InputError for one query, as a search
    refusing a request would: that request gets the error, its batchmates the hits they would get alone."""
    gate, busy = threading.Event(), threading.Event()

    def encode(texts: Sequence[str], scopes: Sequence[Hashable] = ()) -> tuple[np.ndarray, list[int]]:
        busy.set()
        gate.wait()
        return searcher.encoder.encode(texts, scopes)

    def search(vectors: np.ndarray | None, queries: list[str], options: SearchOptions) -> Retrieved:
        if "refused" in queries:
            raise InputError("this query is refused")
        return searcher.retrieve(vectors, queries, options)

    queries = sorted(PROBES)[:3]
    alone = {q: _ids(searcher.search_vectors(searcher.student.encode([q]), 3)[0]) for q in queries}
    made = MicroBatcher(encode, search, max_batch=32, max_wait_s=0.2, max_pending=64, max_queue_s=60.0, workers=1)
    try:
        made.submit(["held"], 3, timeout_s=30)  # holds the only worker, so the rest queue up together
        assert busy.wait(30)
        good = [made.submit([q], 3, timeout_s=30) for q in queries[:2]]
        refused = made.submit(["refused"], 3, timeout_s=30)
        good.append(made.submit([queries[2]], 3, timeout_s=30))
        gate.set()
        with pytest.raises(InputError, match="refused"):
            refused.result(timeout=30)
        assert [_ids(f.result(timeout=30).hits[0]) for f in good] == [alone[q] for q in queries]
        assert made.pending == 0
    finally:
        gate.set()
        made.close()
    assert "a batch of 4 jobs failed" in caplog.text  # they were one batch, and the batch failed first


@pytest.mark.slow
def test_admission_is_bounded(mini_bundle: Path, mini_student: Path) -> None:
    with _searcher(mini_bundle, mini_student, max_pending=4, max_batch_queries=4) as searcher:
        with pytest.raises(Overloaded, match="at most 4"):
            searcher.batcher.submit(["a"] * 5, 1, timeout_s=30)
        assert searcher.batcher.pending == 0
        assert searcher.batcher.submit(["a"] * 4, 1, timeout_s=30).result(timeout=30).batch_size == 4


@pytest.mark.slow
def test_a_job_past_its_deadline_is_not_run(searcher: Searcher) -> None:
    with pytest.raises(DeadlineExceeded):
        searcher.batcher.submit(["tides"], 1, timeout_s=0).result(timeout=30)
    assert searcher.batcher.pending == 0


def test_settings_refuse_a_batch_larger_than_admission() -> None:
    with pytest.raises(Exception, match="TANDEM_MAX_BATCH_QUERIES"):
        ServiceSettings(index=Path("i"), student=Path("s"), max_pending=8, max_batch_queries=16)


def test_a_batcher_without_a_search_encodes_and_refuses_searches() -> None:
    recorder = Recorder()
    made = MicroBatcher(recorder.encode, None, max_batch=4, max_wait_s=0.0, max_pending=8, max_queue_s=60.0,
                        workers=1)
    try:
        outcome = made.submit(["abc"], None, timeout_s=30).result(timeout=30)
        assert outcome.tokens == [3] and outcome.vectors is not None
        with pytest.raises(ValueError, match="only encodes"):
            made.submit(["abc"], 1, timeout_s=30)
        assert made.pending == 0
    finally:
        made.close()


@pytest.mark.slow
def test_the_query_encoder_needs_no_bundle(mini_student: Path) -> None:
    """/v1/embeddings' encoder alone: the student's own vectors, batched and admitted, without any index."""
    student = StudentEncoder(mini_student, "fp32", 1)
    encoder = QueryEncoder(student, BatchLimits(max_batch=1, max_wait_s=0.0, max_pending=8, max_queue_s=60.0,
                                                workers=1))
    try:
        texts = sorted(PROBES)[:2]

        async def embed() -> BatchOutcome:
            return await encoder.embed(texts, timeout_s=30)

        outcome = asyncio.run(embed())
        assert outcome.vectors is not None and outcome.vectors.shape == (2, encoder.dim)
        np.testing.assert_allclose(outcome.vectors, student.encode(texts), atol=1e-5)
        assert encoder.name == mini_student.name and outcome.tokens is not None and len(outcome.tokens) == 2
    finally:
        encoder.close()


@pytest.mark.slow
def test_batchmates_never_share_an_onnx_call(tiny_student: Path) -> None:
    """With micro-batches of 8, each query is still encoded in an ONNX call of its own: the int8 student scales
    activations per call, so a shared call would move a query's vector with its batchmates (issue 55)."""
    student = StudentEncoder(tiny_student, "int8", 1)
    encoder = QueryEncoder(student, BatchLimits(max_batch=8, max_wait_s=0.0, max_pending=8, max_queue_s=60.0,
                                                workers=1))
    try:
        texts = sorted(PROBES)[:6]
        together, _ = encoder.encode(texts)
        alone = np.stack([encoder.encode([text])[0][0] for text in texts])
        assert np.array_equal(together, alone)
        shared, _ = student.encode_counted(texts, batch_size=8)
        assert not np.array_equal(shared, alone)  # the control: one call for all of them does move the vectors
    finally:
        encoder.close()
