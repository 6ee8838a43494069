"""The student's agreement with the teacher on each segment in service, scored in the background (issue 45).

At load and after every reload, a collection's `AgreementMonitor` scores the segments of the version in service that
it has not scored yet (models.agreement.score_segments on their samples), on a daemon thread of its own, each round
bounded by TANDEM_AGREEMENT_BUDGET_S (segments left over are scored in the next round): never on the request path.
It holds a lease on the searcher while it scores, so a version swapped out meanwhile closes once it is done.

A round that fails, or that runs out of budget before it has scored a single segment, is retried after a wait that
doubles each time in a row (`Backoff`: 2 s, 4 s, ... up to BACKOFF_CAP_S), and a round that scores resets it: a
broken student or a budget too small for one segment no longer reloads the student every second for the life of the
process. Each change of state (failing, over budget, recovered) is logged once, not each retry.

The student is loaded again for each round, alone (the served one's tokenize timer would count these encodes as
requests'), and let go after it: no memory held between rounds. A segment's score is kept by its key (its files'
sha256, models.bundle.version.segment_key) and the student's directory, so a reload that adds one segment scores
that one only.

What it found goes to the `tandem_segment_agreement{collection, segment}` and `tandem_segment_agreement_below`
gauges, to /admin/status (`agreement`), and to one warning per version naming the segments below the threshold.
"""

from __future__ import annotations

import logging
import threading
import time
from enum import StrEnum
from typing import Protocol

from models.agreement.score import THRESHOLD, SegmentAgreement, score_segments, verdict
from models.encoders.student import StudentEncoder
from service.core.loader import NotReady, SearcherLoader
from service.core.outcomes import AgreementInfo
from service.core.searcher import Searcher
from service.redact import printable
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often the monitor looks for a version it has not scored
BACKOFF_CAP_S = 600.0  # the longest wait before retrying a failed or fruitless round
EMPTY = SegmentAgreement(segment="none", queries=0)  # the figures of a version not scored yet


class Round(StrEnum):
    """What one round did."""

    IDLE = "idle"  # nothing to score: no version in service yet, or every segment scored
    SCORED = "scored"  # scored one segment at least
    OVER_BUDGET = "over_budget"  # the budget ran out before a single segment was scored
    FAILED = "failed"  # raised


class Backoff:
    """The wait before the next round: `base` while rounds do their work; after a failed or fruitless one, `base`
    doubled once per such round in a row, at most `cap`. A round that works resets it."""

    def __init__(self, base: float = POLL_S, cap: float = BACKOFF_CAP_S) -> None:
        self.base, self.cap = base, cap
        self.misses = 0  # failed or fruitless rounds in a row

    def after(self, outcome: Round) -> float:
        if outcome in (Round.FAILED, Round.OVER_BUDGET):
            self.misses += 1
            return min(self.base * 2.0 ** min(self.misses, 64), self.cap)
        self.misses = 0
        return self.base


class AgreementMetrics(Protocol):
    def set_agreement(self, scores: list[SegmentAgreement], gone: list[str]) -> None: ...


class AgreementMonitor:
    """One collection's background scorer (a daemon thread, started and stopped with the collection)."""

    def __init__(self, name: str, settings: ServiceSettings, loader: SearcherLoader,
                 metrics: AgreementMetrics | None = None) -> None:
        self.name, self._settings, self._loader, self._metrics = name, settings, loader, metrics
        self._budget_s = settings.agreement_budget_s
        self._lock = threading.Lock()
        self._info = AgreementInfo(state="pending", threshold=THRESHOLD, home=EMPTY, overall=EMPTY, segments=[],
                                   below=[])
        self._scores: dict[tuple[str, str], SegmentAgreement] = {}  # (student dir, segment key) → raw score
        self._done: tuple[str, str] | None = None  # (version dir, student dir) fully scored
        self._warned: tuple[str, tuple[str, ...]] | None = None
        self._stop = threading.Event()
        self._backoff = Backoff()
        self._trouble: Round | None = None  # FAILED or OVER_BUDGET while rounds keep missing: logged once
        self._thread = threading.Thread(target=self._run, name=f"tandem-agreement-{name}", daemon=True)

    def start(self) -> None:
        if self._budget_s > 0:
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def status(self) -> AgreementInfo | None:
        if self._budget_s <= 0:
            return None
        with self._lock:
            return self._info

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(self.step())

    def step(self) -> float:
        """One round, then how long to wait before the next (what the thread loops on)."""
        error: Exception | None = None
        try:
            outcome = self.poll()
        except Exception as exc:  # a defect or a broken student: the service keeps serving, a later round retries
            outcome, error = Round.FAILED, exc
            with self._lock:
                if self._info.state == "scoring":  # no round is running now
                    self._info = self._info.model_copy(update={"state": "pending" if self._info.version is None
                                                               else "partial"})
        missed_before = self._backoff.misses
        wait = self._backoff.after(outcome)
        self._log_change(outcome, error, wait, missed_before)
        return wait

    def _log_change(self, outcome: Round, error: Exception | None, wait: float, missed_before: int) -> None:
        """One line when rounds start failing (or running out of budget) and one when they recover; the retries
        in between log at DEBUG."""
        missed = self._backoff.misses
        if outcome in (Round.FAILED, Round.OVER_BUDGET):
            if outcome is self._trouble:
                log.debug("collection %s: agreement round %s again (%d in a row); next in %g s", self.name,
                          outcome.value, missed, wait)
                return
            self._trouble = outcome
            if error is not None:
                log.error("collection %s: scoring the student's agreement failed: %s; retrying in %g s, the wait "
                          "doubling up to %g s while it fails (logged again when that changes)", self.name,
                          printable(error), wait, self._backoff.cap, exc_info=error)
            else:
                log.warning("collection %s: the agreement budget (TANDEM_AGREEMENT_BUDGET_S=%g) ran out before one "
                            "segment was scored; retrying in %g s, the wait doubling up to %g s (logged again when "
                            "that changes)", self.name, self._budget_s, wait, self._backoff.cap)
        elif self._trouble is not None:
            log.info("collection %s: agreement rounds %s again (after %d %s)", self.name,
                     "score" if outcome is Round.SCORED else "have nothing to score", missed_before,
                     self._trouble.value.replace("_", " "))
            self._trouble = None

    def poll(self) -> Round:
        """Score what the version in service lacks, within the budget (a no-op once it is all scored)."""
        try:
            with self._loader.lease() as searcher:
                return self._score(searcher)
        except NotReady:
            return Round.IDLE

    def _score(self, searcher: Searcher) -> Round:
        bundle, served = searcher.bundle, searcher.student
        student_dir = str(served.directory)
        identity = (str(bundle.directory), student_dir)
        if identity == self._done:
            return Round.IDLE
        todo = {s.info.name for s in bundle.segments if (student_dir, s.key) not in self._scores}
        scored_now = 0
        if todo:
            with self._lock:
                self._info = self._info.model_copy(update={"state": "scoring"})
            started = time.perf_counter()
            student = StudentEncoder(served.directory, served.precision, threads=1)  # its own: see the docstring
            deadline = time.monotonic() + self._budget_s
            keys = {s.info.name: s.key for s in bundle.segments}
            for score in score_segments(bundle, student, only=todo, deadline=deadline,
                                        oversample=searcher.oversample, stop=self._stop.is_set):
                self._scores[(student_dir, keys[score.segment])] = score
            del student
            scored_now = sum((student_dir, keys[n]) in self._scores for n in todo)
            if scored_now:
                log.info("collection %s: scored the agreement of %d segment(s) of %s in %.1f s", self.name,
                         scored_now, searcher.version, time.perf_counter() - started)
        current = {(student_dir, s.key) for s in bundle.segments}
        self._scores = {k: v for k, v in self._scores.items() if k in current}
        scored = [self._scores[(student_dir, s.key)] for s in bundle.segments if (student_dir, s.key) in self._scores]
        complete = len(scored) == len(bundle.segments)
        judged = verdict(scored, bundle.manifest, served.manifest)
        info = AgreementInfo(state="scored" if complete else "partial", version=searcher.version, **judged.model_dump())
        with self._lock:
            gone = [s.segment for s in self._info.segments if s.segment not in {j.segment for j in judged.segments}]
            self._info = info
        if self._metrics is not None:
            self._metrics.set_agreement([*judged.segments, judged.overall], gone)
        if complete:
            self._done = identity
        self._warn(info)
        if not todo:
            return Round.IDLE
        return Round.SCORED if scored_now or self._stop.is_set() else Round.OVER_BUDGET

    def _warn(self, info: AgreementInfo) -> None:
        """One warning per version and set of segments below the threshold."""
        if not info.below or info.home.overlap is None:
            return
        key = (info.version or "", tuple(info.below))
        if key == self._warned:
            return
        self._warned = key
        low = ", ".join(f"{s.segment} ({s.overlap:.3f})" for s in info.segments if s.below and s.overlap is not None)
        log.warning("collection %s: the student agrees with the teacher less on %d segment(s) of %s than on its own "
                    "corpus: top-10 overlap %s, under %.2f × %.3f (its home segments'); `tandem index check` tells "
                    "more, and distilling on them restores it", self.name, len(info.below), printable(info.version),
                    low, info.threshold, info.home.overlap)

