"""The service stays alive through anything (issue 24, item 5): a broken CURRENT pointer, a refused version
fixed in place, abandoned requests, retired versions with work in flight, hostile names and bad keys."""

from __future__ import annotations

import asyncio
import io
import logging
import shutil
import sys
import threading
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from models.atomic import atomic_write
from service.core.batcher import DeadlineExceeded, MicroBatcher
from service.core.loader import open_searcher
from service.core.searcher import Searcher
from service.http.app import create_app
from service.runtime.logs import make_handler
from service.settings import ServiceSettings
from tests.fixtures.server import serve_app
from tests.service.reload.test_service_reload import (
    admin_status,
    flip_bytes,
    root,
    serving,
    version,
    wait_for,
)

__all__ = ["root"]  # fixture shared with test_service_reload: the mini bundle and its v2 (tiny_service.py)

pytestmark = pytest.mark.slow

WATCH_S = 0.05


@contextmanager
def captured(logger: str, fmt: str = "text") -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = make_handler(fmt, stream)  # type: ignore[arg-type]
    log = logging.getLogger(logger)
    previous = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        log.removeHandler(handler)
        log.setLevel(previous)


def test_watcher_survives_a_non_utf8_pointer(root: Path, mini_student: Path) -> None:
    # Pointers are replaced whole here, as `set_current` does: written in place, the watcher could read one empty
    # between the truncation and the write, and refuse that (an empty name) before it ever saw the bytes under test.
    with serving(root, mini_student, watch_interval_s=WATCH_S) as server:
        atomic_write(root / "CURRENT", lambda fh: fh.write(b"\xff\xfe\x00v2\n"))
        wait_for(lambda: (admin_status(server)["last_reload"] or {}).get("outcome") == "rejected",
                 "the watcher tries, and refuses, the garbled pointer")
        assert "not UTF-8" in admin_status(server)["last_reload"]["error"]
        atomic_write(root / "CURRENT", lambda fh: fh.write(b"v2\n"))
        wait_for(lambda: version(server) == "v2", "the watcher, still alive, follows CURRENT to v2")


def test_a_refused_version_is_retried_when_its_files_change(root: Path, mini_student: Path) -> None:
    fixed = root / "v3"
    shutil.copytree(root / "v2", fixed)
    flip_bytes(fixed)
    with serving(root, mini_student, watch_interval_s=WATCH_S) as server:
        atomic_write(root / "CURRENT", lambda fh: fh.write(b"v3\n"))
        wait_for(lambda: (admin_status(server)["last_reload"] or {}).get("outcome") == "rejected",
                 "v3 is refused")
        assert version(server) == "v1"
        shutil.copyfile(root / "v2" / "index.faiss", fixed / "index.faiss")  # the operator repairs it in place
        wait_for(lambda: version(server) == "v3", "the repaired v3 is tried again and served")


def test_logged_names_cannot_forge_log_lines(root: Path, mini_student: Path) -> None:
    with captured("service.core.reload") as stream, serving(root, mini_student, watch_interval_s=WATCH_S) as server:
        atomic_write(root / "CURRENT", lambda fh: fh.write(b"v2\nFORGED line\x1b[31m\n"))  # whole: one name, one try
        wait_for(lambda: (admin_status(server)["last_reload"] or {}).get("outcome") == "rejected",
                 "the hostile pointer is refused")
        first = admin_status(server)["last_reload"]["started_at"]
        threading.Event().wait(20 * WATCH_S)  # twenty polls: a refused name that did not change is not retried
        assert admin_status(server)["last_reload"]["started_at"] == first
    lines = stream.getvalue().splitlines()
    assert any("FORGED" in line for line in lines)
    assert not any(line.startswith("FORGED") for line in lines)
    assert "\x1b" not in stream.getvalue()


def test_bad_key_warnings_are_rate_limited(mini_bundle: Path, mini_student: Path) -> None:
    settings = ServiceSettings(index=mini_bundle, student=mini_student, api_keys="good-key-0123456789")
    with captured("service.http.auth") as stream, serve_app(create_app(settings)) as server:
        for i in range(100):
            response = server.client.post("/search", json={"query": "tides"},
                                          headers={"Authorization": f"Bearer wrong-{i}"})
            assert response.status_code == 403
    warnings = [line for line in stream.getvalue().splitlines() if "invalid API key" in line]
    assert 1 <= len(warnings) <= 20


@pytest.fixture(scope="module")
def searcher(mini_bundle: Path, mini_student: Path) -> Iterator[Searcher]:
    loaded = open_searcher(ServiceSettings(index=mini_bundle, student=mini_student))
    try:
        yield loaded
    finally:
        loaded.close()


def _gated(searcher: Searcher, gate: threading.Event, started: threading.Event, **limits: int) -> MicroBatcher:
    """A batcher over the (tiny) student and bundle whose encoding waits for `gate`: a worker held busy."""

    def encode(queries: Sequence[str], scopes: Sequence[Hashable] = ()) -> tuple[np.ndarray, list[int]]:
        started.set()
        gate.wait()
        return searcher.student.encode_counted(list(queries))

    return MicroBatcher(encode, searcher.retrieve, max_batch=1, max_wait_s=0.0, max_queue_s=60.0,
                        workers=1, **limits)


def _alone(searcher: Searcher, query: str) -> str:
    """The document `query` gets first when searched directly, without a batcher."""
    return str(searcher.search_vectors(searcher.student.encode([query]), 1)[0][0].doc.id)


def test_a_request_past_its_deadline_frees_its_queue_capacity(searcher: Searcher) -> None:
    gate, started = threading.Event(), threading.Event()
    batcher = _gated(searcher, gate, started, max_pending=2)
    try:
        running = batcher.submit(["ocean tides"], 1, timeout_s=60.0)  # holds the only worker
        assert started.wait(30)
        with pytest.raises(DeadlineExceeded):
            asyncio.run(batcher.search(["queued then abandoned"], 1, timeout_s=0.05))
        assert batcher.pending == 1
        admitted = batcher.submit(["moon phases"], 1, timeout_s=60.0)  # the abandoned query's slot is free
        gate.set()
        assert running.result(timeout=30).hits[0][0].doc.id == _alone(searcher, "ocean tides")
        assert admitted.result(timeout=30).hits[0]
    finally:
        gate.set()
        batcher.close()
    assert batcher.pending == 0


def _timed_waits(thread: threading.Thread) -> list[str]:
    """The frames of `thread`'s stack, innermost last, that block with a timeout: `<function> timeout=<t>`.

    Every blocking call of threading and queue (Thread.join, Lock.acquire, Condition.wait, Event.wait, Queue.get)
    holds its deadline in a local named `timeout`: None, or -1 for the lock's own "forever"."""
    frame = sys._current_frames().get(thread.ident or -1)
    timed = []
    while frame is not None:
        timeout = frame.f_locals.get("timeout", None)
        if timeout not in (None, -1):
            timed.append(f"{frame.f_code.co_name} timeout={timeout!r}")
        frame = frame.f_back
    return timed


def test_close_waits_for_the_jobs_running_on_the_workers(searcher: Searcher) -> None:
    """Closing a retired version must not pull the bundle from under a job still running (the old close gave up
    after 10 s): close blocks while the job runs, and on nothing that has a deadline, so it waits for as long as the
    job takes (the stack is read rather than waiting past any particular timeout)."""
    gate, started = threading.Event(), threading.Event()
    batcher = _gated(searcher, gate, started, max_pending=4)
    running = batcher.submit(["ocean tides"], 1, timeout_s=60.0)
    assert started.wait(30)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    try:
        for _ in range(10):  # close is blocked in a wait with no deadline, each time we look
            closer.join(timeout=0.05)
            assert closer.is_alive(), "close returned while a job was still running"
            assert _timed_waits(closer) == [], "close waits with a deadline"
        assert not running.done()
    finally:
        gate.set()
    closer.join(timeout=30)
    assert not closer.is_alive()
    assert running.result(timeout=1).hits[0][0].doc.id == _alone(searcher, "ocean tides")
