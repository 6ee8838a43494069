"""The service scores the student's agreement with the teacher per segment in the background (issue 45): at load
and after a reload (the new segment only), exported as gauges, shown in /admin/status, and one warning naming the
segments below the threshold. Real models, a real server. The update it reloads is the run's `drift_root`'s v2
(tests/fixtures/bundle.py: the tiny root grown by standard-library docstrings), published into a copy."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from models.bundle.versions import set_current
from tests.fixtures.bundle import DRIFT_DOCS
from tests.fixtures.server import LiveServer
from tests.service.reload.test_service_reload import admin_status, reload, serving, wait_for

pytestmark = pytest.mark.slow


def _agreement(server: LiveServer) -> dict[str, Any]:
    agreement: dict[str, Any] = admin_status(server)["agreement"]
    return agreement


def _scored(server: LiveServer, segments: int) -> dict[str, Any]:
    wait_for(lambda: _agreement(server)["state"] == "scored" and len(_agreement(server)["segments"]) == segments,
             f"{segments} segment(s) scored")
    return _agreement(server)


def test_agreement_is_scored_at_load_and_for_a_reloads_new_segment_and_warned_of(
        drift_root: Path, tiny_student: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "root"
    shutil.copytree(drift_root, root)
    set_current(root, "v1")  # served before the update: v2 is published (CURRENT moved to it) while it serves
    with caplog.at_level(logging.INFO, logger="service.core.agreement"), \
            serving(root, tiny_student, metrics_names=True) as server:
        first = _scored(server, 1)
        (home,) = first["segments"]
        assert home["home"] and home["queries"] == 20 and home["below"] is False
        assert first["home"]["overlap"] == home["overlap"] and first["threshold"] == 0.80

        set_current(root, "v2")  # what `tandem index update` does last, the update built once for the run
        assert reload(server).status_code == 200
        after = _scored(server, 2)
        assert after["version"] == "v2"
        assert after["segments"][0] == home  # kept, not scored again
        other = after["segments"][1]
        assert other["segment"] == "v2" and not other["home"] and other["queries"] == DRIFT_DOCS
        assert other["below"] is True and after["below"] == ["v2"]

        metrics = server.client.get("/metrics").text
        assert f'tandem_segment_agreement{{collection="default",segment="v2"}} {other["overlap"]}' in metrics
        assert 'tandem_segment_agreement_below{collection="default",segment="v2"} 1.0' in metrics
        assert 'tandem_segment_agreement_below{collection="default",segment="base"} 0.0' in metrics
        assert 'tandem_segment_agreement{collection="default",segment="version"}' in metrics

    scored = [r.getMessage() for r in caplog.records if "scored the agreement" in r.getMessage()]
    assert [m.split(" segment(s)")[0].rsplit(" ", 1)[-1] for m in scored] == ["1", "1"]  # v2 scored its new one only
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "v2 (" in warnings[0] and "under 0.80" in warnings[0]


def test_a_budget_of_zero_turns_it_off(mini_root: Path, mini_student: Path) -> None:
    with serving(mini_root, mini_student, agreement_budget_s=0) as server:  # nothing scored: the tiny models do
        assert admin_status(server)["agreement"] is None
        assert "tandem_segment_agreement{" not in server.client.get("/metrics").text
