"""The agreement monitor backs off a failing or fruitless round (issue 55, deliverable 6): the wait doubles per
round missed in a row up to a cap and a round that scores resets it, and each change of state is logged once.
Rounds run one by one through `step` (which returns the wait the thread would sleep), never sleeping: a real
loader and student, a student file moved away as the failure, a budget too small for one segment as the other."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from models.encoders.student import read_student_manifest
from service.core.agreement import BACKOFF_CAP_S, POLL_S, AgreementMonitor, Backoff, Round
from service.core.loader import LoadState, SearcherLoader
from service.settings import ServiceSettings

LOGGER = "service.core.agreement"
DOUBLING = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 600.0, 600.0, 600.0]


def test_the_wait_doubles_per_round_missed_in_a_row_up_to_the_cap_and_resets_on_success() -> None:
    backoff = Backoff()
    assert (POLL_S, BACKOFF_CAP_S) == (1.0, 600.0)
    assert [backoff.after(Round.FAILED) for _ in range(12)] == DOUBLING
    assert backoff.after(Round.SCORED) == POLL_S and backoff.misses == 0
    assert [backoff.after(Round.OVER_BUDGET) for _ in range(3)] == [2.0, 4.0, 8.0]
    assert backoff.after(Round.IDLE) == POLL_S
    assert backoff.after(Round.FAILED) == 2.0  # counted afresh
    capped = Backoff(cap=5.0)
    assert [capped.after(Round.FAILED) for _ in range(3)] == [2.0, 4.0, 5.0]
    many = Backoff()
    assert [many.after(Round.FAILED) for _ in range(2000)][-1] == BACKOFF_CAP_S  # no overflow, however long


@pytest.fixture
def student(tmp_path: Path, mini_student: Path) -> Path:
    """A copy of the mini student whose files a test may move."""
    out = tmp_path / "student"
    shutil.copytree(mini_student, out)
    return out


@contextmanager
def _loaded(settings: ServiceSettings) -> Iterator[SearcherLoader]:
    loader = SearcherLoader(settings)
    loader.start()
    loader.wait()
    assert loader.state[0] is LoadState.READY, loader.state
    try:
        yield loader
    finally:
        loader.close()


def _at(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_a_failing_round_backs_off_logs_once_and_recovers(student: Path, mini_bundle: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    settings = ServiceSettings(index=mini_bundle, student=student)
    model = student / read_student_manifest(student).onnx_int8
    with _loaded(settings) as loader:
        monitor = AgreementMonitor("c", settings, loader)
        model.rename(model.with_name("away"))  # each round loads the student again: now it cannot
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            waits = [monitor.step() for _ in range(len(DOUBLING))]
            assert waits == DOUBLING  # 12 attempts over ~45 minutes, where it made 12 in 12 seconds
            assert len(_at(caplog, logging.ERROR)) == 1 and "retrying in 2 s" in _at(caplog, logging.ERROR)[0]
            assert len(_at(caplog, logging.DEBUG)) == len(DOUBLING) - 1
            assert monitor.status() is not None and monitor.status().state == "pending"  # type: ignore[union-attr]
            (student / "away").rename(model)
            assert monitor.step() == POLL_S  # scored: the wait resets
            assert monitor.status().state == "scored"  # type: ignore[union-attr]
            assert monitor.step() == POLL_S  # nothing left to score
        recovered = _at(caplog, logging.INFO)
        assert [m for m in recovered if "again" in m] == ["collection c: agreement rounds score again (after 12 "
                                                          "failed)"]
        assert len(_at(caplog, logging.ERROR)) == 1


def test_a_budget_too_small_for_one_segment_backs_off_and_warns_once(student: Path, mini_bundle: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    settings = ServiceSettings(index=mini_bundle, student=student, agreement_budget_s=1e-9)
    with _loaded(settings) as loader:
        monitor = AgreementMonitor("c", settings, loader)
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert [monitor.step() for _ in range(4)] == [2.0, 4.0, 8.0, 16.0]
        warned = _at(caplog, logging.WARNING)
        assert len(warned) == 1 and "TANDEM_AGREEMENT_BUDGET_S=1e-09" in warned[0]
        assert monitor.status().state == "partial"  # type: ignore[union-attr]
