"""docs/architecture.md's query path is a map of the modules a dense POST /search runs through, in order.

Two checks: every module and function the map names exists (fast), and a real request through the real app,
traced with a profiler on every thread, runs project code only in modules the map names, reaching them in the
map's order (slow). The map may name more than one request runs (what binary bundles, lexical and hybrid modes
and filters add, in the step where they join); nothing here asks it to be short.
"""

from __future__ import annotations

import ast
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.server import serve_app

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("models", "indexer", "service", "tandem")
# Run around every route, not on the query's path: the HTTP protocol, the request middleware, request ids and
# the access log. The map leaves them out.
AROUND_EVERY_REQUEST = frozenset(
    {"service/runtime/server.py", "service/http/middleware.py", "service/runtime/logs.py", "service/redact.py"})
# What the page names for binary bundles, lexical and hybrid modes and filters: not defined in an item's own file.
JOINING = re.compile(r"\(they add .*?\)|BM25 \(.*?\)|filters \(.*?\)|fusion \(.*?\)|declared in .*?\)", re.S)
ITEM = re.compile(r"^\d+\. (.+?)(?=^\d+\. |^\n)", re.S | re.M)
TICKED = re.compile(r"`([^`]+)`")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")


def _items() -> list[str]:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("## The query path", 1)[1].split("\n## ", 1)[0]
    items = ITEM.findall(section + "\n\n")
    assert items, "docs/architecture.md has no numbered query path"
    return items


def _paths(text: str) -> list[str]:
    return [t for t in TICKED.findall(text) if t.endswith(".py")]


def _defined(path: Path) -> set[str]:
    """Top-level names, and Class.method for each method, defined in a module."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{n.name}" for n in node.body
                         if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return names


def mapped_steps() -> dict[str, int]:
    """Each module the map names, and the step (item) that first names it."""
    steps: dict[str, int] = {}
    for step, item in enumerate(_items()):
        for path in _paths(item):
            steps.setdefault(path, step)
    return steps


def test_the_modules_and_functions_the_query_path_names_exist() -> None:
    for item in _items():
        paths = _paths(item)
        assert paths, f"a query path item names no module: {item[:80]!r}"
        for path in paths:
            assert (ROOT / path).is_file(), f"docs/architecture.md names {path}, which does not exist"
        defined = set().union(*(_defined(ROOT / p) for p in paths))
        names = [t for t in TICKED.findall(JOINING.sub("", item)) if IDENTIFIER.match(t) and not t.endswith(".py")]
        missing = [name for name in names if name not in defined]
        assert not missing, f"docs/architecture.md names {missing} in {paths}, which define no such thing"


class _Recorder:
    """A profiler on every thread: the project modules whose functions run while `on` is set, in the order
    each first runs."""

    def __init__(self) -> None:
        self.on = False
        self.modules: dict[str, None] = {}  # insertion-ordered: first call first
        self._roots = tuple(str(ROOT / p) + "/" for p in PACKAGES)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call" and frame.f_code.co_filename.startswith(self._roots):
            self.modules.setdefault(str(Path(frame.f_code.co_filename).relative_to(ROOT)), None)


@contextmanager
def _recording() -> Iterator[_Recorder]:
    recorder = _Recorder()
    threading.setprofile(recorder)  # threads started from now on: the server's and the batch workers
    sys.setprofile(recorder)
    try:
        yield recorder
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dense_search_runs_through_the_mapped_modules_in_order(mini_settings: ServiceSettings,
                                                                 workers: int) -> None:
    # agreement scoring off: its background rounds would run beside the request while recording
    settings = mini_settings.model_copy(update={"workers": workers, "agreement_budget_s": 0})
    app = create_app(settings)
    with _recording() as recorder, serve_app(app) as server:
        for _ in range(3):  # warm: first calls build caches that a steady request never touches
            assert server.client.post("/search", json={"query": "tides", "top_k": 3}).status_code == 200
        # The app's one background task, which sets the index gauges once the first load is done, polls until
        # then: let it end first, so that only the request runs while recording.
        deadline = time.monotonic() + 30
        while not app.state.metrics.index_set and time.monotonic() < deadline:
            time.sleep(0.01)
        assert app.state.metrics.index_set
        recorder.on = True
        response = server.client.post("/search", json={"query": "how do tides work", "top_k": 3})
        recorder.on = False
    assert response.status_code == 200, response.text
    traced = [module for module in recorder.modules if module not in AROUND_EVERY_REQUEST]
    assert traced, "the trace saw no project code"
    steps = mapped_steps()
    unmapped = [module for module in traced if module not in steps]
    assert not unmapped, f"a dense search runs code in {unmapped}, which docs/architecture.md's query path omits"
    reached = [(steps[module], module) for module in traced]
    assert reached == sorted(reached, key=lambda pair: pair[0]), (
        f"a dense search reaches the modules in another order than docs/architecture.md's query path: {reached}")
