"""docs/architecture.md's query path names the files a dense POST /search really runs code in.

Two checks: every file and function the page names exists (fast), and a real request through the real app,
traced with a profiler on every thread, runs project code in exactly the files the page lists (slow).
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

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("models", "indexer", "service", "tandem")
# Run around every route, not on the query's path: the HTTP protocol, the request middleware, request ids and
# the access log.
AROUND_EVERY_REQUEST = frozenset(
    {"service/server.py", "service/http/middleware.py", "service/logs.py", "service/redact.py"})
# Files the page names for what binary bundles, lexical and hybrid modes add: not crossed by a dense float query.
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


def documented_files() -> set[str]:
    """The files the path lists, one per item (its first), without those named for other modes or types."""
    return {_paths(item)[0] for item in _items()}


def test_the_files_and_functions_the_query_path_names_exist() -> None:
    for item in _items():
        paths = _paths(item)
        assert paths, f"a query path item names no file: {item[:80]!r}"
        for path in paths:
            assert (ROOT / path).is_file(), f"docs/architecture.md names {path}, which does not exist"
        defined = set().union(*(_defined(ROOT / p) for p in paths))
        names = [t for t in TICKED.findall(JOINING.sub("", item)) if IDENTIFIER.match(t) and not t.endswith(".py")]
        missing = [name for name in names if name not in defined]
        assert not missing, f"docs/architecture.md names {missing} in {paths}, which define no such thing"


class _Recorder:
    """A profiler on every thread: the project files whose functions run while `on` is set."""

    def __init__(self) -> None:
        self.on = False
        self.files: set[str] = set()
        self._roots = tuple(str(ROOT / p) + "/" for p in PACKAGES)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call" and frame.f_code.co_filename.startswith(self._roots):
            self.files.add(str(Path(frame.f_code.co_filename).relative_to(ROOT)))


@contextmanager
def _recording() -> Iterator[_Recorder]:
    recorder = _Recorder()
    threading.setprofile(recorder)  # threads started from now on: the server's and the batch workers
    sys.setprofile(recorder)
    try:
        yield recorder
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dense_search_runs_code_in_the_files_the_page_lists(service_settings: ServiceSettings,
                                                              workers: int) -> None:
    settings = service_settings.model_copy(update={"workers": workers})
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
    assert recorder.files - AROUND_EVERY_REQUEST == documented_files()
