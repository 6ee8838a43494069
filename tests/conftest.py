"""Shared fixtures: real models, a tiny real corpus, bundle, student and server, built once per session.

Two tiers (docs/testing.md): `pytest` runs everything with real parts; `pytest -m "not slow"` (make
test-fast) runs the pure logic in well under a minute. A test is `slow` when its module says so or
when it asks, directly or through other fixtures, for one that loads a model (MODEL_FIXTURES). The
fast tier runs with an empty TANDEM_HOME, so a test that reaches for a model without saying so
fails there instead of quietly loading one.
"""

from __future__ import annotations

import ast
import os
import tempfile
import threading
from typing import Any

# Every Ray cluster a test starts is local: Ray's own switch keeps it on the loopback interface, and it is read when
# ray is first imported, which may be by any test module at collection (tests/cluster, tests/indexer/test_ray_engine).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest

from tests.durations import OneUnitScheduling, check_units, load_record, longest_first


def _threads_per_worker() -> None:
    """Under xdist, the cores are split among the workers: each worker's OpenMP (torch, FAISS, OpenBLAS), and every
    process it starts, runs `cores // workers` threads unless OMP_NUM_THREADS says otherwise.

    Why: two workers on two cores, each splitting every torch op over two threads, are four busy threads on two
    cores, and an OpenMP thread waiting for its partner spins. The tiny models' ops are too small to split anyway:
    a parity check took a quarter of the CPU on one thread. Set here, before the fixtures load (they import numpy,
    whose OpenBLAS reads it once, as torch's OpenMP does when it loads later), and inherited by every subprocess."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


_threads_per_worker()

pytest_plugins = [
    "tests.fixtures.corpus",
    "tests.fixtures.bundle",
    "tests.fixtures.student",
    "tests.fixtures.server",
    "tests.fixtures.metadata",
    "tests.fixtures.browser",
    "tests.fixtures.tiny_models",
    "tests.fixtures.tiny_service",
    "tests.fixtures.tiny_home",
    "tests.fixtures.ray_cluster",
]


def _parse_one_thread_at_a_time() -> None:
    """Serialize `ast.parse` across threads for the whole run.

    CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread, so two threads parsing
    at once can fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). Hypothesis
    parses the source of a strategy's lambdas while it draws (the schema fuzz tests, whose live servers' threads run
    beside it), and pytest's assertion rewriter parses a module a server's thread imports for the first time; one
    such parse failed a full run. Both call `ast.parse` by attribute, so one lock here covers every parse the test
    process makes in Python; a reentrant one, for a parse that starts another in the same thread."""
    lock = threading.RLock()
    parse = ast.parse

    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    ast.parse = locked


_parse_one_thread_at_a_time()

# Fixtures behind which a model loads or a process starts: everything that depends on them is slow.
MODEL_FIXTURES = frozenset({"tandem_home", "teacher_dir", "tiny_bundle", "tiny_student", "service_settings",
                            "live_server", "chromium_page", "tiny_models"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark model-backed tests slow before `-m` deselects (tryfirst: ahead of pytest's own mark filter); order
    the modules longest first for the xdist workers (tests/durations.py)."""
    for item in items:
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    check_units(items)
    longest_first(items, load_record())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> OneUnitScheduling | None:
    """Under `--dist loadscope`, the modules that share a per-process fixture go to one worker (tests/durations.py)."""
    return OneUnitScheduling(config, log) if config.getoption("dist") == "loadscope" else None


def pytest_configure(config: pytest.Config) -> None:
    """In the fast tier, point TANDEM_HOME at an empty directory: no model can be found, let alone loaded."""
    if config.option.markexpr.replace(" ", "") == "notslow":
        os.environ["TANDEM_HOME"] = tempfile.mkdtemp(prefix="tandem-fast-")
