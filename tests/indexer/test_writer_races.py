"""One writer at a time per root (issue 42, item 1), attacked with real processes racing on one root.

Each race runs two `tandem index` commands as real child processes. The first is paused between reading its base
and publishing by the test-only fifo of indexer.pause (TANDEM_TEST_PAUSE_FIFO); the test opens the fifo once the
writer waits there, starts the second writer, and lets the first go only once the second has shown what it does
meanwhile (waits for the lock, or publishes). No sleep decides anything: every step waits for an event. The rule:
both changes are in CURRENT, or the loser exits non-zero naming the conflict and published nothing.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time
from pathlib import Path
from typing import IO

import numpy as np
import pytest

from indexer.pause import PAUSE_ENV
from indexer.sample import SAMPLE_SETTING
from indexer.versions.update import UpdateRequest, update
from models.bundle.version import Bundle, read_bundle_manifest
from models.bundle.versions import list_versions, read_current
from models.embeddings.store import EmbeddingStore
from models.search import documents
from tests.fixtures.kill_points import fork_cli

pytestmark = pytest.mark.slow

WAITING = "waiting for the writer lock"


def _lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def root(tiny_teacher_root: Path) -> Path:
    """A root whose CURRENT is the tiny corpus encoded by the tiny teacher, TANDEM_HOME the tiny home: the writers
    race on files and the lock."""
    return tiny_teacher_root


class _Writer:
    """`tandem index ARGS` running in a fork of this process: the subset of subprocess.Popen the races use (stderr
    read as it comes, poll, communicate, returncode)."""

    def __init__(self, pid: int, stdout: Path, stderr: IO[str]) -> None:
        self.pid, self.stdout_path, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def communicate(self) -> tuple[str, str]:
        err = self.stderr.read()  # to the child's end: it holds the pipe's only write end
        self.stderr.close()
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        out = self.stdout_path.read_text()
        self.stdout_path.unlink()
        return out, err


def _start(*args: str, fifo: Path | None = None) -> _Writer:
    """`tandem index ARGS` (tandem.cli.main) in a fork of this process, paused before it publishes where `fifo` is
    given.

    A fork, not a `python -m tandem` process: each race's two writers paid an interpreter's start and the CLI's
    imports (about a second each), which this process has made already; the child is still a process of its own,
    racing on the files and the lock as a command does. It logs to its own stderr as a fresh `tandem` does (the
    root logger's handlers, pytest's here, dropped in the child).

    The children write no agreement sample (TANDEM_AGREEMENT_SAMPLE=0): every change here is a deletion, a
    metadata-only change or imported vectors, so a sample would be the only reason a child loads the teacher,
    while what races (the lock, CURRENT, the pause in indexer.publish) comes after the sample and is the same
    without it. Samples are tested in tests/indexer/test_agreement_check.py."""
    env = {SAMPLE_SETTING: "0"}
    if fifo is not None:
        env[PAUSE_ENV] = str(fifo)
    fd, name = tempfile.mkstemp(prefix="writer-", suffix=".out")
    read_end, write_end = os.pipe()
    try:
        pid = fork_cli(["index", *args], env, fd, write_end, before=None if fifo else _unpaused)
    finally:
        os.close(fd)
        os.close(write_end)
    return _Writer(pid, Path(name), os.fdopen(read_end, "r"))


def _unpaused() -> None:
    os.environ.pop(PAUSE_ENV, None)


def _paused(proc: _Writer, fifo: Path) -> int:
    """Wait until `proc` waits at the fifo (it opened it for reading); returns our end, which lets it go when
    closed."""
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        if proc.poll() is not None:
            pytest.fail(f"the writer ended before its pause: {proc.communicate()}")
        time.sleep(0.02)  # polling for an event, not timing one


def _shows(proc: _Writer, text: str) -> list[str]:
    """Read `proc`'s stderr until a line holds `text`; the lines read."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return seen
    pytest.fail(f"the writer ended without {text!r}: {''.join(seen)}")


def _done(proc: _Writer) -> tuple[int, str]:
    out, err = proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out + err


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "pause.fifo"
    os.mkfifo(fifo)
    return fifo


def _live(root: Path) -> dict[str, dict]:
    bundle = Bundle(read_current(root))
    try:
        return {d.id: d.meta() for d in documents(bundle, bundle.live_rows())}
    finally:
        bundle.close()


def _bake(lang: str) -> dict:
    from tests.fixtures.corpus import DOCS

    _, title, text = next(d for d in DOCS if d[0] == "bake")
    return {"_id": "bake", "title": title, "text": text, "metadata": {"lang": lang}}


def _race(first: _Writer, fifo: Path, second: list[str]) -> tuple[tuple[int, str], tuple[int, str]]:
    """`first` paused before publishing, holding the root's lock: `second` waits for it, and goes on after it."""
    end = _paused(first, fifo)
    other = _start(*second)
    _shows(other, WAITING)  # it saw the lock held, and waits rather than working from the same base
    os.close(end)
    return _done(first), _done(other)


def test_an_update_and_a_delete_racing_both_land(root: Path, tmp_path: Path) -> None:
    """The issue's case: a slow update and, meanwhile, a quick delete; the deleted document stays deleted."""
    fifo = _fifo(tmp_path)
    changes = _lines(tmp_path / "changes.jsonl", [_bake("fr")])
    (tmp_path / "gone.txt").write_text("git\n")
    slow = _start("update", "--root", str(root), "--changes", str(changes), fifo=fifo)
    (rc1, log1), (rc2, log2) = _race(slow, fifo, ["update", "--root", str(root), "--delete-ids",
                                                  str(tmp_path / "gone.txt")])
    assert (rc1, rc2) == (0, 0), log1 + log2
    live = _live(root)
    assert "git" not in live and live["bake"] == {"lang": "fr"}  # both changes served
    manifest = read_bundle_manifest(read_current(root))
    assert manifest.base is not None and manifest.base.deleted == 1
    started = read_bundle_manifest(root / manifest.base.version).base
    assert started is not None and started.replaced == 1  # the delete started from it


def test_a_follower_and_an_update_racing_both_land(root: Path, tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    changes = tmp_path / "changes"
    changes.mkdir()
    _lines(changes / "0001.jsonl", [{"_id": "bees", "delete": True}, _bake("de")])
    (tmp_path / "gone.txt").write_text("git\n")
    follower = _start("follow", "--root", str(root), "--changes-dir", str(changes), "--once", fifo=fifo)
    (rc1, log1), (rc2, log2) = _race(follower, fifo, ["update", "--root", str(root), "--delete-ids",
                                                      str(tmp_path / "gone.txt")])
    assert (rc1, rc2) == (0, 0), log1 + log2
    live = _live(root)
    assert "bees" not in live and "git" not in live and live["bake"] == {"lang": "de"}
    state = read_bundle_manifest(read_current(root)).follow
    assert state is not None and state.last == "0001.jsonl"  # the update kept the follower's record


def test_a_compaction_and_an_update_racing_both_land(root: Path, tmp_path: Path) -> None:
    (tmp_path / "tides.txt").write_text("tides\n")
    update(UpdateRequest(delete_ids=tmp_path / "tides.txt", root=root, version="v2"))
    fifo = _fifo(tmp_path)
    (tmp_path / "gone.txt").write_text("git\n")
    compaction = _start("compact", "--root", str(root), "--all", fifo=fifo)
    (rc1, log1), (rc2, log2) = _race(compaction, fifo, ["update", "--root", str(root), "--delete-ids",
                                                        str(tmp_path / "gone.txt")])
    assert (rc1, rc2) == (0, 0), log1 + log2
    live = _live(root)
    assert "tides" not in live and "git" not in live and len(live) == 18
    manifest = read_bundle_manifest(read_current(root))
    assert manifest.base is not None and manifest.base.action == "update"
    compacted = read_bundle_manifest(root / manifest.base.version)
    assert compacted.base is not None and compacted.base.action == "compact" and compacted.base.version == "v2"


def test_current_set_loses_to_a_follower_that_published_meanwhile_and_says_so(root: Path, tmp_path: Path) -> None:
    (tmp_path / "sleep.txt").write_text("sleep\n")
    update(UpdateRequest(delete_ids=tmp_path / "sleep.txt", root=root, version="v2"))
    fifo = _fifo(tmp_path)
    changes = tmp_path / "changes"
    changes.mkdir()
    _lines(changes / "0001.jsonl", [{"_id": "bees", "delete": True}])
    rollback = _start("current", str(root), "--set", "v1", fifo=fifo)
    end = _paused(rollback, fifo)  # it read CURRENT (v2) and verified v1
    rc, log = _done(_start("follow", "--root", str(root), "--changes-dir", str(changes), "--once"))
    assert rc == 0, log
    followed = read_current(root).name
    assert followed not in {"v1", "v2"}
    os.close(end)
    rc, log = _done(rollback)
    assert rc != 0
    assert f"CURRENT moved from v2 to {followed}" in log and "nothing was published" in log, log
    assert read_current(root).name == followed  # the follower's version stays in service
    assert "bees" not in _live(root) and "sleep" not in _live(root)
    assert set(list_versions(root)) == {"v1", "v2", followed}


def _imported(bundle: Path, tiny_corpus: Path, work: Path) -> list[str]:
    """`index build` arguments for the tiny corpus with its teacher vectors imported (no encoding)."""
    key = read_bundle_manifest(bundle).embeddings.store_key
    assert key is not None
    vectors = EmbeddingStore().load(key)
    assert vectors is not None
    np.save(work / "vectors.npy", (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32))
    ids = [json.loads(line)["_id"] for line in tiny_corpus.read_text().splitlines()]
    (work / "ids.json").write_text(json.dumps(ids))
    return ["--corpus", str(tiny_corpus), "--embeddings", str(work / "vectors.npy"), "--ids", str(work / "ids.json")]


def _lost(root: Path, rc: int, log: str, base: str, winner: str, before: set[str]) -> None:
    """The build lost: non-zero, naming the conflict; it published nothing (no version, no staging left)."""
    assert rc != 0, log
    assert f"CURRENT moved from {base} to {winner}" in log and "nothing was published" in log, log
    assert read_current(root).name == winner
    assert set(list_versions(root)) == before | {winner}
    assert sorted(p.name for p in root.iterdir() if p.name not in before | {winner}) == [".lock", "CURRENT"]


def test_a_build_that_an_update_overtook_publishes_nothing_and_says_so(root: Path, tiny_teacher_bundle: Path,
                                                                         tiny_corpus: Path, tmp_path: Path) -> None:
    """`build --root` paused with its version staged; an update lands meanwhile: the build exits non-zero."""
    fifo = _fifo(tmp_path)
    (tmp_path / "gone.txt").write_text("git\n")
    build = _start("build", "--root", str(root), *_imported(tiny_teacher_bundle, tiny_corpus, tmp_path), fifo=fifo)
    end = _paused(build, fifo)  # staged, CURRENT read as v1, not placed
    rc, log = _done(_start("update", "--root", str(root), "--delete-ids", str(tmp_path / "gone.txt")))
    assert rc == 0, log
    updated = read_current(root).name
    os.close(end)
    rc, log = _done(build)
    _lost(root, rc, log, "v1", updated, {"v1"})
    assert "git" not in _live(root)  # the update's change is served


def test_a_build_waits_for_an_update_holding_the_lock_and_then_publishes_nothing(
        root: Path, tiny_teacher_bundle: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    """An update paused holding the root's lock: the build waits for it (saying so), then finds CURRENT moved."""
    fifo = _fifo(tmp_path)
    (tmp_path / "gone.txt").write_text("git\n")
    slow = _start("update", "--root", str(root), "--delete-ids", str(tmp_path / "gone.txt"), fifo=fifo)
    (rc1, log1), (rc2, log2) = _race(slow, fifo, ["build", "--root", str(root),
                                                  *_imported(tiny_teacher_bundle, tiny_corpus, tmp_path)])
    assert rc1 == 0, log1
    _lost(root, rc2, log2, "v1", read_current(root).name, {"v1"})
    assert "git" not in _live(root)
