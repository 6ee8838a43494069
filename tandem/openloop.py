"""An open-loop generator that runs, in a thread of its own, until stopped: across a change made meanwhile (a
collections config reload, a rollback, a key file rotation), so that what the change did to requests shows in what
each request got, never in fewer requests sent.

Request i is sent at start + i / rps whatever happened to earlier ones (as `tandem loadtest`, tandem.loadtest, does
for a fixed schedule of one request); the requests cycle through `Target`s (a collection and a key each). Every
request is recorded with the instant it was sent and the instant its answer came (time.monotonic, so the code
making the change can compare its own instants), so a check can say exactly which answers were allowed: one answered
before the change was made saw the old state, one sent after the change was seen to be complete sees the new one.
The client is tandem.loadclient's (keep-alive connections parsed by httptools), which is cheap beside the server.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from tandem.loadclient import Answer, ConnectionPool, Request

MAX_REQUESTS = 100_000  # a bound on a run nobody stopped


@dataclass(frozen=True)
class Target:
    """One kind of request of the mix: `name` labels its records."""

    name: str
    request: Request


@dataclass(frozen=True)
class Record:
    target: str
    sent: float  # time.monotonic() just before the request was written (never after)
    answered: float  # time.monotonic() once its answer, or its failure, came (never before)
    status: int  # 0: no answer (`error` says why)
    error: str | None
    answer: Answer | None


class OpenLoop:
    """`with OpenLoop(url, targets, rps) as load:` sends until the block ends; `load.records` holds the answers."""

    def __init__(self, url: str, targets: Sequence[Target], rps: float, timeout_s: float = 30.0,
                 max_requests: int = MAX_REQUESTS) -> None:
        if rps <= 0 or not targets:
            raise ValueError("an open loop needs a positive rate and at least one target")
        self.url, self.targets, self.rps = url, list(targets), rps
        self.timeout_s, self.max_requests = timeout_s, max_requests
        self.records: list[Record] = []  # appended on the loop's thread; read once stopped, or as a snapshot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-open-loop", daemon=True)

    def __enter__(self) -> OpenLoop:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """No request is sent after this; those in flight are awaited (each within timeout_s)."""
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 30)
        if self._thread.is_alive():
            raise RuntimeError("the open loop did not stop")

    def answered(self, target: str | None = None) -> int:
        return sum(1 for r in list(self.records) if target is None or r.target == target)

    def wait_answered(self, count: int, target: str | None = None, limit_s: float = 120.0) -> None:
        """Until `count` more answers (of `target`) than now have come; the limit bounds a hang, it times nothing."""
        wanted = self.answered(target) + count
        deadline = time.monotonic() + limit_s
        while self.answered(target) < wanted:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the open loop got {self.answered(target)} answers, not {wanted}")
            time.sleep(0.02)

    def statuses(self, target: str | None = None) -> Counter[int]:
        return Counter(r.status for r in self.records if target is None or r.target == target)

    def _run(self) -> None:
        asyncio.run(self._drive())

    async def _drive(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        async with ConnectionPool(self.url, self.timeout_s) as pool:
            start = time.perf_counter()
            for i in range(self.max_requests):
                delay = start + i / self.rps - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._stop.is_set():
                    break
                task = asyncio.create_task(self._one(pool, self.targets[i % len(self.targets)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)

    async def _one(self, pool: ConnectionPool, target: Target) -> None:
        sent = time.monotonic()
        answer: Answer | None = None
        error: str | None = None
        try:
            answer = await pool.request(target.request)
        except TimeoutError:
            error = "timeout"
        except OSError as exc:  # refused, reset, or closed before the answer (loadclient.ServerDisconnected)
            error = f"{type(exc).__name__}: {exc}"
        self.records.append(Record(target.name, sent, time.monotonic(), answer.status if answer else 0, error,
                                   answer))


def violations(records: Sequence[Record], changed: float, complete: float, before: set[int], after: set[int],
               between: set[int] | None = None) -> list[Record]:
    """The requests a change, begun at `changed` and seen complete at `complete`, does not allow: one answered
    before it began not answering one of `before`, one sent after it was complete not one of `after`, one in
    between neither (nor one of `between`)."""
    during = before | after | (between or set())
    return [r for r in records
            if (r.answered < changed and r.status not in before) or (r.sent > complete and r.status not in after)
            or r.status not in during]
