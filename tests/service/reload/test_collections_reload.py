"""`tandem serve --config FILE` re-read while serving, over a real uvicorn server: the file rewritten atomically adds a
collection (searchable once loaded) while requests to the first keep answering 200, removes it again, and a broken
file keeps the collections served and logs the file and line. On the tiny models (tests/fixtures/tiny_service.py)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.collections_config import collection_settings
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.server import LiveServer, local_client, serve_app

pytestmark = pytest.mark.slow

ADMIN = {"Authorization": "Bearer admin-token-0123456789"}
MAX_REQUESTS = 2000  # the loop's bound: it stops earlier, once the change has been applied and seen


def _table(name: str, index: Path, student: Path) -> str:
    return f'[[collection]]\nname = "{name}"\nindex = "{index}"\nstudent = "{student}"\n\n'


def _rewrite(path: Path, text: str) -> None:
    """As a deploy does: a new file renamed over the old one (never a half-written file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _until(condition: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s  # a bound on a hang, not a timing assertion
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def _names(server: LiveServer) -> dict[str, str]:
    return {c["name"]: c["state"] for c in server.client.get("/collections").json()["collections"]}


class Load:
    """Requests to collection 'docs', one after another from a thread of their own, until stopped (or the bound)."""

    def __init__(self, url: str) -> None:
        self.url, self.sent = url, 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with local_client(self.url, timeout=60.0) as client:
            while not self._stop.is_set() and self.sent < MAX_REQUESTS:
                response = client.post("/collections/docs/search", json={"query": "ocean tides", "top_k": 2})
                self.sent += 1
                if response.status_code != 200:
                    self.failed.append(f"{response.status_code} {response.text[:200]}")

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


@pytest.fixture()
def config(tmp_path: Path, mini_bundle: Path, mini_student: Path) -> Path:
    path = tmp_path / "collections.toml"
    path.write_text(_table("docs", mini_bundle, mini_student))
    return path


@pytest.fixture()
def server(config: Path) -> Iterator[LiveServer]:
    settings = ServiceSettings(**collection_settings(None, None, [], config),  # type: ignore[arg-type]
                               watch_interval_s=0.05, admin_token=ADMIN["Authorization"].split()[1])
    with serve_app(create_app(settings)) as live:
        yield live


def test_a_collection_added_and_removed_by_rewriting_the_config(
        server: LiveServer, config: Path, mini_meta_bundle: Path, mini_bundle: Path, mini_student: Path) -> None:
    assert _names(server) == {"docs": "ready"}
    with Load(server.url) as load:
        _until(lambda: load.sent >= 5, "requests to docs answered")
        _rewrite(config, _table("docs", mini_bundle, mini_student) + _table("meta", mini_meta_bundle, mini_student))
        _until(lambda: _names(server).get("meta") == "ready", "meta added and loaded")
        seen = load.sent
        _until(lambda: load.sent >= seen + 5 or load.sent >= MAX_REQUESTS, "requests to docs after the add")
    assert load.failed == [] and load.sent > 10
    lexical = server.client.post("/collections/meta/search", json={"query": "Odoacer", "mode": "lexical"})
    assert [h["id"] for h in lexical.json()["results"]] == ["rome"]
    assert server.client.post("/search", json={"query": "tides"}).status_code == 200  # docs stays the default
    status = server.client.get("/admin/status", headers=ADMIN).json()
    for name in ("docs", "meta"):
        memory = status["collections"][name]["memory"]
        assert isinstance(memory["load_rss_growth_bytes"], int)  # measured (may be small: the student is shared)
        assert memory["mapped_bytes"] > 0, memory  # its payload and postings are mapped from its files

    with Load(server.url) as load:
        _rewrite(config, _table("docs", mini_bundle, mini_student))
        _until(lambda: "meta" not in _names(server), "meta removed")
        seen = load.sent
        _until(lambda: load.sent >= seen + 5 or load.sent >= MAX_REQUESTS, "requests to docs after the removal")
    assert load.failed == []
    gone = server.client.post("/collections/meta/search", json={"query": "Odoacer"})
    assert gone.status_code == 404


def test_a_broken_config_keeps_the_collections_and_names_the_line(server: LiveServer, config: Path,
                                                                  mini_meta_bundle: Path, mini_student: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    good = config.read_text()
    caplog.set_level(logging.ERROR, logger="service.collections_reload")
    _rewrite(config, good + '[[collection]]\nname = "bad name!"\nindex = "x"\nstudent = "y"\n')
    _until(lambda: any("refused" in r.getMessage() for r in caplog.records), "the broken file refused")
    message = next(r.getMessage() for r in caplog.records if "refused" in r.getMessage())
    assert str(config) in message and "line 6" in message, message
    assert _names(server) == {"docs": "ready"}
    caplog.clear()
    _rewrite(config, _table("meta", mini_meta_bundle, mini_student))  # removing the default (POST /search): refused
    _until(lambda: any("default collection" in r.getMessage() for r in caplog.records), "the removal refused")
    assert _names(server) == {"docs": "ready"}
    assert server.client.post("/collections/docs/search", json={"query": "tides"}).status_code == 200
