"""`tandem serve` and its file descriptors (issue 42, item 6): the limit raised at startup, and a version that needs
more than the process may open refused by name while the old one keeps serving.

Real processes: `tandem serve` started with a low RLIMIT_NOFILE (set in the child before it runs), watching a root
into which `tandem index follow --no-compact` publishes a version of many segments (about ten open files each). And
a closed version's files are closed at once, not when it is collected.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from indexer.follow import FollowRequest, follow
from models.bundle.version import Bundle, read_bundle_manifest
from models.bundle.versions import list_versions, read_current, set_current
from tests.fixtures import service_fast
from tests.fixtures.corpus import DOCS
from tests.fixtures.server import free_port, local_client
from tests.service.reload.test_service_reload import AUTH, TOKEN, wait_for

pytestmark = pytest.mark.slow

LIMIT = 160  # enough for the server and a version of one segment; a version of FILES + 1 segments needs ~400
FILES = 40
BAKE = next(d for d in DOCS if d[0] == "bake")


@pytest.fixture
def root(mini_bundle: Path, tmp_path: Path) -> Path:
    """A root whose CURRENT is a copy of the mini bundle (one segment), on the tiny models: descriptors, not answers."""
    root = tmp_path / "bundles"
    shutil.copytree(mini_bundle, root / "v1")
    set_current(root, "v1")
    return root


@dataclass(frozen=True)
class Many:
    """A root as `root` is, beside a version of FILES + 1 segments that `tandem index follow` published in it and
    CURRENT set back to v1: a test copies it and publishes that version again (CURRENT, as follow does) to a server
    started on v1. Following FILES files once for the module, not once per test."""

    root: Path
    version: str


@pytest.fixture(scope="module")
def many(mini_bundle: Path, mini_teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> Many:
    work = tmp_path_factory.mktemp("many")
    root = work / "bundles"
    shutil.copytree(mini_bundle, root / "v1")
    set_current(root, "v1")
    version = _follow_many(root, mini_teacher, work)
    set_current(root, "v1")
    return Many(root, version)


def _many_root(many: Many, tmp_path: Path) -> Path:
    """The test's own copy of `many`'s root, CURRENT naming v1 (links kept as links: the layout follow left)."""
    root = tmp_path / "bundles"
    shutil.copytree(many.root, root, symlinks=True)
    assert read_current(root).name == "v1"
    return root


@dataclass(frozen=True)
class Served:
    client: httpx.Client
    log: Path
    pid: int


@contextmanager
def serving(root: Path, student: Path, log: Path, soft: int, hard: int) -> Iterator[Served]:
    """`tandem serve` on `root` with RLIMIT_NOFILE (soft, hard) from its first instruction (set in the child before
    it runs the command), watching CURRENT; forked warm (tests/fixtures/service_fast.py)."""
    port = free_port()
    env = {**os.environ, "TANDEM_ADMIN_TOKEN": TOKEN, "TANDEM_LOG_FORMAT": "text", "TANDEM_WORKERS": "1",
           "TANDEM_WATCH_INTERVAL_S": "0.2", "OMP_NUM_THREADS": "1"}
    proc = service_fast.start(["serve", "--index", str(root), "--student", str(student), "--port", str(port)], env,
                              log, nofile=(soft, hard))
    try:
        with local_client(f"http://127.0.0.1:{port}", timeout=30.0) as client:
            service_fast.wait_until(proc, log, lambda: client.get("/readyz").status_code == 200)
            yield Served(client=client, log=log, pid=proc.pid)
    finally:
        service_fast.stop(proc)


def _follow_many(root: Path, teacher: Path, tmp_path: Path) -> str:
    """Publish a version of FILES + 1 segments (a metadata change per file: no encoding), by the follower itself
    (`tandem index follow --once --no-compact --batch-files FILES`, in this process: the server under test is the
    other process, and a second interpreter would only import the indexer again)."""
    changes = tmp_path / "changes"
    changes.mkdir()
    for n in range(FILES):
        line = {"_id": BAKE[0], "title": BAKE[1], "text": BAKE[2], "metadata": {"n": n}}
        (changes / f"{n:04d}.jsonl").write_text(json.dumps(line) + "\n")
    follow(FollowRequest(root=root, changes_dir=changes, once=True, compact=False, max_files=FILES, teacher=teacher))
    version = read_current(root).name
    assert len(read_bundle_manifest(root / version).parts) == FILES + 1
    return version


def _status(served: Served) -> dict[str, Any]:
    response = served.client.get("/admin/status", headers=AUTH)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _served_version(served: Served) -> str:
    response = served.client.post("/search", json={"query": "how do I make a loaf of bread rise", "top_k": 3})
    assert response.status_code == 200, response.text
    version: str = response.json()["index"]["version"]
    return version


def test_a_version_past_the_descriptor_limit_is_refused_by_name_and_the_old_one_serves(
        many: Many, mini_student: Path, tmp_path: Path) -> None:
    root = _many_root(many, tmp_path)
    with serving(root, mini_student, tmp_path / "serve.log", LIMIT, LIMIT) as served:
        assert f"file descriptor limit: {LIMIT} (hard {LIMIT})" in served.log.read_text()
        set_current(root, many.version)  # published, as follow publishes it
        wait_for(lambda: _status(served)["last_reload"] is not None, "the watcher tried the new version")
        status = _status(served)
        last = status["last_reload"]
        assert last["outcome"] == "rejected" and last["path"].endswith(many.version), last
        assert f"{many.version}: too many open files: {FILES + 1} segments" in last["error"], last
        assert "raise the descriptor limit" in last["error"] and "compact" in last["error"]
        assert status["current"]["version"] == "v1"
        assert _served_version(served) == "v1"  # the old version keeps serving, its files still open
        log = served.log.read_text()
        assert "refused, the version in service keeps serving" in log and "too many open files" in log
        assert "Traceback" not in log


def test_serve_raises_its_soft_limit_to_the_hard_one_and_loads_the_version(
        many: Many, mini_student: Path, tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4 * LIMIT:
        pytest.fail(f"this machine's hard descriptor limit ({hard}) is too low for the test")
    raised = 4 * LIMIT
    root = _many_root(many, tmp_path)
    with serving(root, mini_student, tmp_path / "serve.log", LIMIT, raised) as served:
        assert f"file descriptor limit raised from {LIMIT} to {raised}" in served.log.read_text()
        with open(f"/proc/{served.pid}/limits") as fh:
            assert any(line.startswith("Max open files") and line.split()[3] == str(raised) for line in fh)
        set_current(root, many.version)  # published, as follow publishes it
        wait_for(lambda: _status(served)["current"]["version"] == many.version, "the new version in service")
        assert _served_version(served) == many.version


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_closed_version_lets_go_of_its_descriptors_at_once(root: Path, mini_teacher: Path,
                                                             tmp_path: Path) -> None:
    """A segment's memory maps (lexical, payload) are let go when its last version closes, while the closed
    version object is still referenced (a retired searcher collected late): not when the garbage collector runs."""
    changes = tmp_path / "changes"
    changes.mkdir()
    for n in range(6):
        line = {"_id": BAKE[0], "title": BAKE[1], "text": BAKE[2], "metadata": {"n": n}}
        (changes / f"{n:04d}.jsonl").write_text(json.dumps(line) + "\n")
    follow(FollowRequest(root=root, changes_dir=changes, once=True, compact=False, max_files=3,
                         teacher=mini_teacher))
    first, second = sorted((v for v in list_versions(root) if v != "v1"), key=lambda v: v == read_current(root).name)
    before = _descriptors()
    older = Bundle(root / first)
    newer = Bundle(root / second, reuse=older)
    assert newer.reused == 4 and _descriptors() > before + 20
    older.close()
    held = _descriptors()
    assert held > before + 20  # its four segments serve on in the newer version
    newer.close()
    assert _descriptors() == before
    assert older.segments == newer.segments == []  # both still referenced here, their files closed
