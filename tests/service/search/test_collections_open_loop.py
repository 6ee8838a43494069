"""Changes to a running `tandem serve` under open-loop load (tandem.openloop: requests sent at a fixed rate on their
own schedule, never waiting for earlier answers): a collection added by a config reload, one collection reloaded and
rolled back, and the key file rotated, each with one and with several processes. No request fails: every answer is
the one its send and answer instants allow. What answered before the change began saw the old state, what was sent
after the change was seen complete sees the new one, and in between only the old or the new answer is allowed.

The servers' admission is opened wide (queue time and request deadline): on a small shared machine a burst while a
collection loads may rightly be shed with 429 or 503, which is the overload policy, not what these tests test. The tiny
models serve (tests/fixtures/tiny_service.py): every answer checked is a version, a status or a lexical hit."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tandem.loadclient import Request
from tandem.openloop import OpenLoop, Record, Target
from tests.fixtures import service_fast
from tests.fixtures.server import Served, serve_process


@pytest.fixture
def root(mini_v1_v2_root: Path) -> Path:
    """The mini bundle (v1) and its v2 under a root of the test's own (tests/fixtures/tiny_service.py)."""
    return mini_v1_v2_root


pytestmark = pytest.mark.slow

TOKEN = "admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
KEYS = {"stay": "stay-key-0123456789", "gone": "gone-key-0123456789", "new": "new-key-0123456789"}
RPS = 40.0
SETTLE = 20  # answers of a target awaited before a change and after it is complete


def _config(**collections: tuple[Path, Path]) -> str:
    return "".join(f'[[collection]]\nname = "{name}"\nindex = "{index}"\nstudent = "{student}"\n\n'
                   for name, (index, student) in collections.items())


def _keys(*ids: str) -> str:
    return "".join(f'[[key]]\nid = "{i}"\nkey = "{KEYS[i]}"\ncollections = ["*"]\n\n' for i in ids)


def _rewrite(path: Path, text: str) -> None:
    """As a deploy does: a new file renamed over the old one (never a half-written file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _search(name: str, collection: str, key: str, body: dict[str, Any] | None = None) -> Target:
    """A search is replayable: one written on a keep-alive connection just as the server closed it, idle (a worker
    replaced by SIGHUP closes its idle connections after the shutdown grace; any worker after the keep-alive
    time), met a reset with no byte of answer and was read by no one, so the client sends it again
    (tandem.loadclient), as browsers and Go's net/http do. One that met a new connection's failure, or got part of
    an answer, is never sent again: it fails the test. That a request already on its way to a worker as it stops
    is answered is tests/service/api/test_service_limits.py's."""
    payload = json.dumps(body or {"query": "ocean tides", "top_k": 3}).encode()
    return Target(name, Request("POST", f"/collections/{collection}/search", payload,
                                headers=(("Authorization", f"Bearer {KEYS[key]}"),), replayable=True))


def _status(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/admin/collections", headers=ADMIN)
    assert response.status_code == 200, response.text
    collections: dict[str, Any] = response.json()["collections"]
    return collections


def _everywhere(client: httpx.Client, processes: int, names: set[str]) -> bool:
    """Every collection is ready and, with several processes, served by the same `processes` live processes (a
    replaced process has left every collection's list: it takes no request any more)."""
    status = _status(client)
    if not names <= set(status) or any(status[n]["state"] != "ready" for n in status):
        return False
    if processes == 1:
        return True
    pids = [{p["pid"] for p in c["processes"] or [] if p["version"]} for c in status.values()]
    return all(len(p) == processes for p in pids) and all(p == pids[0] for p in pids)


def _until(condition: Callable[[], bool], what: str, limit_s: float = 120.0) -> float:
    """time.monotonic() once `condition` held (the limit bounds a hang; nothing is timed)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)
    return time.monotonic()


@contextmanager
def _serving(tmp_path: Path, config: Path, keys: Path, processes: int, watch_s: float) -> Iterator[Served]:
    env = {**os.environ, "TANDEM_ADMIN_TOKEN": TOKEN, "TANDEM_WORKERS": "1", "TANDEM_LOG_FORMAT": "text",
           "OMP_NUM_THREADS": "1", "TANDEM_MAX_QUEUE_MS": "60000", "TANDEM_REQUEST_TIMEOUT_MS": "60000",
           "TANDEM_MAX_PENDING": "1000", "TANDEM_WATCH_INTERVAL_S": str(watch_s)}
    args = ["--config", str(config), "--keys-file", str(keys), "--processes", str(processes)]
    names = set(_config_names(config))
    ready = partial(_everywhere, processes=processes, names=names)
    # one process exits 130 on SIGINT (uvicorn re-raises the signal it handled); a supervisor exits 0. Both are forked
    # warm (tests/fixtures/service_fast.py: the interpreter's imports skipped); a supervisor's workers fork from its own
    # forkserver (service/runtime/workers.py) as users' do. A supervisor started as users start it, and the
    # forkserver: tests/service/runtime/test_service_processes.py's watched servers.
    exits = (0, 130) if processes == 1 else (0,)
    with serve_process(args, env, tmp_path / "serve.log", ready, exits=exits, start=service_fast.start) as server:
        yield server


def _config_names(config: Path) -> list[str]:
    return [line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("name = ")]


def _by(load: OpenLoop, target: str) -> list[Record]:
    return [r for r in load.records if r.target == target]


def _only(records: list[Record], status: int, what: str) -> None:
    assert records, f"no request {what}"
    wrong = [(r.status, r.error, r.answer.body[:200] if r.answer else b"") for r in records if r.status != status]
    assert not wrong, f"{len(wrong)} of {len(records)} requests {what} did not answer {status}: {wrong[:5]}"


def _top(record: Record) -> str:
    assert record.answer is not None
    return str(record.answer.json()["results"][0]["id"])


def _meta_added(load: OpenLoop, changed: float, complete: float, steady: str = "docs") -> None:
    """`steady` (a search of docs) never failed; meta answered 404 until the change, and once complete the one it was
    added with."""
    meta = _by(load, "meta")
    _only(_by(load, steady), 200, "to docs")
    _only([r for r in meta if r.answered < changed], 404, "to meta before the reload")
    after = [r for r in meta if r.sent > complete]
    _only(after, 200, "to meta once added")
    assert {_top(r) for r in after} == {"rome"}
    assert {r.status for r in meta} <= {404, 503, 200}, load.statuses("meta")  # 503: listed, still loading


def _key_rotated(load: OpenLoop, changed: float, complete: float) -> None:
    """'stay' never failed; 'gone' answered 200 until the change and 403 once it was complete, 'new' the other way."""
    _only(_by(load, "stay"), 200, "with the key that stays")
    for key, old, new in (("gone", 200, 403), ("new", 403, 200)):
        records = _by(load, key)
        _only([r for r in records if r.answered < changed], old, f"with key {key} before the rotation")
        _only([r for r in records if r.sent > complete], new, f"with key {key} after the rotation")
        assert {r.status for r in records} == {old, new}, load.statuses(key)


def _pids(client: httpx.Client) -> set[int]:
    return {p["pid"] for p in _status(client)["docs"]["processes"] or []}


META_SEARCH = {"query": "Odoacer", "mode": "lexical", "top_k": 1}


def test_a_collection_added_by_a_config_reload_under_open_loop_load(tmp_path: Path, mini_bundle: Path,
                                                                    mini_student: Path, mini_meta_bundle: Path) -> None:
    """SIGHUP re-reads --config in one process, whose watch is off. (The file's change seen by each process's watch:
    test_one_collection_reloaded_and_rolled_back_then_another_added_by_the_config_file_under_open_loop_load; SIGHUP to
    several processes: test_sighup_replaces_every_process_with_the_new_config_and_keys_under_open_loop_load.)"""
    config, keys = tmp_path / "collections.toml", tmp_path / "keys.toml"
    config.write_text(_config(docs=(mini_bundle, mini_student)))
    keys.write_text(_keys("stay"))
    targets = [_search("docs", "docs", "stay"), _search("meta", "meta", "stay", META_SEARCH)]
    with _serving(tmp_path, config, keys, 1, 0.0) as server, OpenLoop(server.url, targets, RPS) as load:
        load.wait_answered(SETTLE)
        changed = time.monotonic()
        _rewrite(config, _config(docs=(mini_bundle, mini_student), meta=(mini_meta_bundle, mini_student)))
        os.kill(server.pid, signal.SIGHUP)
        complete = _until(lambda: _everywhere(server.client, 1, {"docs", "meta"}), "meta served")
        load.wait_answered(SETTLE, "meta")
    _meta_added(load, changed, complete)


def test_sighup_replaces_every_process_with_the_new_config_and_keys_under_open_loop_load(
        tmp_path: Path, mini_bundle: Path, mini_student: Path, mini_meta_bundle: Path) -> None:
    """With several processes SIGHUP has the supervisor replace each by one that reads both files as they are now:
    a collection added to --config and key 'gone' replaced by 'new' in the key file, in one replacement (this was
    two tests, each starting two processes and replacing them; they assert the same together)."""
    config, keys = tmp_path / "collections.toml", tmp_path / "keys.toml"
    config.write_text(_config(docs=(mini_bundle, mini_student)))
    keys.write_text(_keys("stay", "gone"))
    targets = [_search("meta", "meta", "stay", META_SEARCH), *(_search(key, "docs", key) for key in KEYS)]
    with _serving(tmp_path, config, keys, 2, 0.0) as server, OpenLoop(server.url, targets, RPS) as load:
        load.wait_answered(SETTLE)
        before = _pids(server.client)
        changed = time.monotonic()
        _rewrite(config, _config(docs=(mini_bundle, mini_student), meta=(mini_meta_bundle, mini_student)))
        _rewrite(keys, _keys("stay", "new"))
        os.kill(server.pid, signal.SIGHUP)

        def replaced() -> bool:  # every process replaced by one that read both files
            return _everywhere(server.client, 2, {"docs", "meta"}) and not _pids(server.client) & before

        complete = _until(replaced, "every process replaced, serving meta")
        load.wait_answered(SETTLE * len(targets))  # the targets take turns: SETTLE of each, give or take
    _meta_added(load, changed, complete, steady="stay")
    _key_rotated(load, changed, complete)


@pytest.mark.parametrize("processes", [1, 2])
def test_one_collection_reloaded_and_rolled_back_then_another_added_by_the_config_file_under_open_loop_load(
        tmp_path: Path, root: Path, mini_bundle: Path, mini_student: Path, mini_meta_bundle: Path,
        processes: int) -> None:
    """/admin/collections/docs/reload then /rollback: docs answers v1, then v2, then v1; plain is never touched. Then
    meta is added to --config, which each process's own watch sees (this was two tests, each starting a server; a
    server of several processes costs a supervisor, its forkserver and a worker each: they assert the same
    together)."""
    config, keys = tmp_path / "collections.toml", tmp_path / "keys.toml"
    config.write_text(_config(docs=(root, mini_student), plain=(mini_bundle, mini_student)))
    keys.write_text(_keys("stay"))
    targets = [_search("docs", "docs", "stay"), _search("plain", "plain", "stay"),
               _search("meta", "meta", "stay", META_SEARCH)]
    with _serving(tmp_path, config, keys, processes, watch_s=0.05) as server, \
            OpenLoop(server.url, targets, RPS) as load:
        load.wait_answered(SETTLE)
        marks = [time.monotonic()]
        for action, body in (("reload", {"path": str(root / "v2")}), ("rollback", None)):
            response = server.client.post(f"/admin/collections/docs/{action}", json=body, headers=ADMIN)
            assert response.status_code == 200, response.text
            marks.append(time.monotonic())
            load.wait_answered(SETTLE, "docs")
            marks.append(time.monotonic())
        changed = time.monotonic()
        _rewrite(config, _config(docs=(root, mini_student), plain=(mini_bundle, mini_student),
                                 meta=(mini_meta_bundle, mini_student)))
        complete = _until(lambda: _everywhere(server.client, processes, {"docs", "plain", "meta"}),
                          "meta served everywhere")
        load.wait_answered(SETTLE, "meta")
    docs, plain = _by(load, "docs"), _by(load, "plain")
    _only(plain, 200, "to plain")

    def versions(records: list[Record]) -> set[str]:
        return {r.answer.json()["index"]["version"] for r in records if r.answer is not None}

    assert versions([r for r in docs if r.answered < marks[0]]) == {"v1"}
    assert versions([r for r in docs if marks[1] < r.sent and r.answered < marks[2]]) == {"v2"}
    assert versions([r for r in docs if r.sent > marks[3]]) == {"v1"}
    assert versions(docs) == {"v1", "v2"}
    assert versions(plain) == {mini_bundle.name}
    _meta_added(load, changed, complete)  # docs never failed, across the reload, the rollback and meta's addition


def test_the_key_file_rotated_under_open_loop_load(tmp_path: Path, mini_bundle: Path, mini_student: Path) -> None:
    """Key 'gone' is replaced by 'new', the file's change seen by the process's watch (several processes: SIGHUP,
    test_sighup_replaces_every_process_with_the_new_config_and_keys_under_open_loop_load)."""
    config, keys = tmp_path / "collections.toml", tmp_path / "keys.toml"
    config.write_text(_config(docs=(mini_bundle, mini_student)))
    keys.write_text(_keys("stay", "gone"))
    targets = [_search(key, "docs", key) for key in ("stay", "gone", "new")]
    with _serving(tmp_path, config, keys, 1, 0.05) as server, OpenLoop(server.url, targets, RPS) as load:
        load.wait_answered(SETTLE)
        changed = time.monotonic()
        _rewrite(keys, _keys("stay", "new"))

        def rotated() -> bool:  # one process swaps its keyring at once: one answer shows it
            probe = server.client.post("/collections/docs/search", json={"query": "tides"},
                                       headers={"Authorization": f"Bearer {KEYS['new']}"})
            return probe.status_code == 200

        complete = _until(rotated, "the key file rotated")
        load.wait_answered(SETTLE, "new")
    _key_rotated(load, changed, complete)
