"""Publishing never loses or half-publishes a version (issue 24, item 4): atomic --force swaps, no
silent overwrite of a version, one writer at a time in a root, and a full disk is a clean error.

Crashes are real: a forked child publishes with an audit hook that SIGKILLs it at its N-th file
system change (mkdir, open for writing, rename, renameat2, rmtree...), for every N until it finishes
(tests/fixtures/kill_points.py).
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import signal
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from indexer.publish import Target, publish
from indexer.rootlock import root_lock
from indexer.verify import verify_one
from indexer.versions.update import UpdateRequest, update
from models.bundle.staging import staged
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import list_versions, read_current, set_current
from models.errors import InputError
from tests.fixtures.kill_points import Pristine, kill_everywhere, run_cli
from tests.fixtures.kill_points import kill_dir as kill_dir

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_bundle(tiny_home: Path, tiny_teacher_bundle: Path) -> Path:
    """The tiny corpus encoded by the tiny teacher, with TANDEM_HOME the tiny home for this test and its children:
    what is published is copied, never encoded, so no answer here depends on the teacher."""
    return tiny_teacher_bundle


@pytest.fixture
def v2_bundle(tiny_home: Path, tiny_teacher_v2: Path) -> Path:
    """A second bundle in the same (tiny) teacher space, 19 documents, once per session (tests/fixtures/tiny_home)."""
    return tiny_teacher_v2



def _copy_into(source: Path, staging: Path) -> None:
    for path in sorted(source.iterdir()):
        if path.is_dir():  # the lexical index
            shutil.copytree(path, staging / path.name)
        else:
            shutil.copyfile(path, staging / path.name)


def _republish(out: Path, source: Path) -> None:
    """A kill loop's job (module level, so it pickles: tests/fixtures/kill_points.py): `source` forced over `out`."""
    with staged(out, force=True) as staging:
        _copy_into(source, staging)


def _publish_pruning(root: Path, source: Path) -> None:
    """A kill loop's job: `source` published as v3 into `root`, every other version pruned."""
    with publish(Target(root=root, version="v3", keep=0)) as (staging, _):
        _copy_into(source, staging)


def test_sigkill_anywhere_in_a_force_republish_leaves_a_valid_bundle(tiny_bundle: Path, v2_bundle: Path,
                                                                     kill_dir: Path) -> None:
    served = kill_dir / "served"
    out = served / "bundle"
    shutil.copytree(tiny_bundle, kill_dir / "pristine" / "bundle")
    pristine = Pristine(kill_dir / "pristine")

    def check() -> None:
        assert out.is_dir(), "nothing under the final name"
        pristine.verify(out)  # the old bundle untouched, or the new one verified whole
        assert read_bundle_manifest(out).count in {20, 19}

    points = kill_everywhere(partial(_republish, out, v2_bundle), check, lambda: pristine.restore(served))
    assert points > 3
    assert read_bundle_manifest(out).count == 19  # the finished run replaced it
    assert [p.name for p in out.parent.iterdir()] == ["bundle"]  # the old version was removed
    pristine.assert_intact()


def test_sigkill_anywhere_in_a_publish_with_prune_leaves_a_valid_current(tiny_bundle: Path, v2_bundle: Path,
                                                                         kill_dir: Path) -> None:
    root = kill_dir / "bundles"
    shutil.copytree(tiny_bundle, kill_dir / "pristine" / "v1")
    shutil.copytree(v2_bundle, kill_dir / "pristine" / "v2")
    set_current(kill_dir / "pristine", "v1")
    pristine = Pristine(kill_dir / "pristine")

    def check() -> None:
        current = read_current(root)
        pristine.verify(current)
        assert current.name in {"v1", "v3"}

    kill_everywhere(partial(_publish_pruning, root, v2_bundle), check, lambda: pristine.restore(root))
    assert list_versions(root) == ["v3"]
    assert read_current(root).name == "v3"
    pristine.assert_intact()


def test_two_builds_of_one_version_never_overwrite_each_other(tiny_bundle: Path, v2_bundle: Path,
                                                               tmp_path: Path) -> None:
    root = tmp_path / "bundles"
    # the first to finish moved CURRENT: the other is refused, by the base check under the lock, else by the rename
    with pytest.raises(InputError, match=r"published by another writer meanwhile|CURRENT moved from"), \
            publish(Target(root=root, version="v9")) as (staging, _):
        _copy_into(v2_bundle, staging)
        with publish(Target(root=root, version="v9")) as (other, _):  # started after, finishes first
            _copy_into(tiny_bundle, other)
    assert read_bundle_manifest(root / "v9").count == 20  # the first to finish stays
    verify_one(root / "v9")
    assert read_current(root).name == "v9"
    assert sorted(p.name for p in root.iterdir()) == [".lock", "CURRENT", "v9"]


@contextlib.contextmanager
def _held_by_another_thread(root: Path) -> Iterator[None]:
    """`root_lock(root)` held by a thread of its own, as a writer would hold it: the lock's re-entrance is counted per
    thread, so the forked command (a copy of this thread) holds nothing and waits on the file's flock as another
    process does, where a fork of the holding thread would take the lock as its own again."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with root_lock(root):
            taken.set()
            release.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(60)
    try:
        yield
    finally:
        release.set()
        holder.join()


def test_current_set_waits_for_the_root_lock(tiny_bundle: Path, v2_bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "bundles"
    shutil.copytree(tiny_bundle, root / "v1")
    shutil.copytree(v2_bundle, root / "v2")
    set_current(root, "v1")
    with _held_by_another_thread(root):  # a build publishing and pruning holds it
        refused = run_cli(tmp_path, ["index", "current", str(root), "--set", "v2"], {"TANDEM_LOCK_TIMEOUT_S": "0.2"})
        assert refused.returncode == 2, refused.stderr
        assert "locked by another writer" in refused.stderr
        assert read_current(root).name == "v1"
    done = run_cli(tmp_path, ["index", "current", str(root), "--set", "v2"])
    assert done.returncode == 0, done.stderr
    assert read_current(root).name == "v2"


FILE_SIZE_LIMIT = 32 * 1024


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


@pytest.mark.parametrize("command", ["build", "update"])
def test_a_full_disk_during_a_build_or_update_publishes_nothing(tiny_bundle: Path, v2_bundle: Path, tmp_path: Path,
                                                                command: str, no_agreement_sample: None) -> None:
    """No agreement sample: the limited writer fails at its docstore, before one would be written."""
    root = tmp_path / "bundles"
    shutil.copytree(tiny_bundle, root / "v1")
    set_current(root, "v1")
    work = v2_bundle.parent  # the corpus and vectors v2 was imported from
    before = sorted(p.name for p in root.iterdir())
    if command == "build":  # v2's documents, each text long enough that their docstore passes the limit
        corpus = tmp_path / "long.jsonl"
        corpus.write_text("".join(json.dumps({**doc, "text": doc["text"] * 40}) + "\n" for doc in
                                  map(json.loads, (work / "corpus.jsonl").read_text().splitlines())))
        args = ["build", "--corpus", str(corpus), "--root", str(root), "--embeddings",
                str(work / "vectors.npy"), "--ids", str(work / "ids.json")]
    else:  # a document larger than the limit: its segment's docstore cannot be written
        big = tmp_path / "big.jsonl"
        big.write_text(json.dumps({"_id": "big", "text": "tides of the moon " * 3000}) + "\n")
        # its vector is in the embedding store already (the update finds it as a follower's retry would), so the
        # limited process fails at the write without importing torch to encode it (most of its seconds)
        update(UpdateRequest(changes=big, base=root / "v1", out=tmp_path / "unlimited"))
        args = ["update", "--root", str(root), "--changes", str(big)]
    done = run_cli(tmp_path, ["index", *args], before=_limit_file_size)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: "), done.stderr
    assert "File too large" in lines[-1] or "disk I/O error" in lines[-1], done.stderr
    assert "Traceback" not in done.stderr
    after = sorted(p.name for p in root.iterdir() if p.name != ".lock")  # the writer lock's file, taken first
    assert after == before  # no staging directory, no new version
    assert read_current(root).name == "v1"
    verify_one(root / "v1")
    assert json.loads((root / "v1" / "manifest.json").read_text())["count"] == 20
