"""The student's agreement with the teacher on each segment in service, scored in the background (issue 45).

At load and after every reload, a collection's `AgreementMonitor` scores the segments of the version in service that
it has not scored yet (models.agreement.score_segments on their samples), on a daemon thread of its own, each round
bounded by TANDEM_AGREEMENT_BUDGET_S (segments left over are scored in the next round): never on the request path.
It holds a lease on the searcher while it scores, so a version swapped out meanwhile closes once it is done.

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
EMPTY = SegmentAgreement(segment="none", queries=0)  # the figures of a version not scored yet


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
            try:
                self.poll()
            except Exception:  # a defect: logged, the service keeps serving, the next round tries again
                log.exception("collection %s: scoring the student's agreement failed", self.name)
            self._stop.wait(POLL_S)

    def poll(self) -> None:
        """Score what the version in service lacks, within the budget (a no-op once it is all scored)."""
        try:
            with self._loader.lease() as searcher:
                self._score(searcher)
        except NotReady:
            return

    def _score(self, searcher: Searcher) -> None:
        bundle, served = searcher.bundle, searcher.student
        student_dir = str(served.directory)
        identity = (str(bundle.directory), student_dir)
        if identity == self._done:
            return
        todo = {s.info.name for s in bundle.segments if (student_dir, s.key) not in self._scores}
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
            log.info("collection %s: scored the agreement of %d segment(s) of %s in %.1f s", self.name,
                     sum((student_dir, keys[n]) in self._scores for n in todo), searcher.version,
                     time.perf_counter() - started)
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

