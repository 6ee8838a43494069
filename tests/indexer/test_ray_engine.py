"""`--engine ray` on a real local Ray (127.0.0.1, no dashboard): the local engine's bundle, resumable.

The builds assert the engine's mechanics (the local engine's vectors, each shard encoded once across a killed driver
and a lost actor, a bad line named), which any teacher shows, so the tiny teacher encodes (tests/fixtures/tiny_home.py):
every actor loads it in milliseconds where the real teacher took seconds per actor and per driver. The cluster is
the process's one (tests/fixtures/ray_cluster.py). Each `tandem index build` driver costs seconds before its first
shard (Ray Data's import, its actors' torch), and so does every actor Ray starts, so one build goes through both
failures on one actor a driver (the second one's loss stops the build until Ray replaces it) and its published
version is the one compared with the local engine's, with a small agreement sample (a Ray build's sample is encoded
here, in fp32; tests/indexer/test_agreement_check.py tests what samples hold). Shards that come back from several
actors, in any order and any batching, are regrouped by `_assemble`, tested here without a cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.encoding.encode import TeacherRun, local_teacher
from indexer.encoding.ray_engine import TeacherActor, _assemble, _items
from indexer.intake.ingest import ingest_corpus
from indexer.sample import SAMPLE_SETTING
from models.bundle.sample import has_sample
from models.bundle.storage.docstore import DocstoreWriter
from models.bundle.version import Bundle
from models.bundle.versions import list_versions, read_current
from models.embeddings.shard_log import SHARD_LOG, ShardLog
from models.embeddings.store import Shard
from models.encoders.registry import load_card
from tests.fixtures.corpus import DOCS

LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray's switch for a loopback-only local cluster,
os.environ.update(LOOPBACK)  # read when ray is imported
ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ray_address(ray_cluster: str) -> str:
    return ray_cluster


def _home(path: Path, teacher_dir: Path) -> Path:
    """A fresh TANDEM_HOME (an empty embedding store) whose teacher is `teacher_dir`."""
    (path / "models").mkdir(parents=True)
    (path / "models/roles.json").write_text(json.dumps({"teacher": str(teacher_dir)}))
    return path


def _corpus(path: Path, copies: int) -> Path:
    with path.open("w") as fh:
        for c in range(copies):
            for doc_id, title, text in DOCS:
                fh.write(json.dumps({"_id": f"{doc_id}-{c}", "title": title, "text": f"{text} ({c})"}) + "\n")
    return path


def _tandem(args: list[str], home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, **LOOPBACK, "TANDEM_HOME": str(home), "OMP_NUM_THREADS": "1",
           "TANDEM_LOG_LEVEL": "WARNING", SAMPLE_SETTING: "0"}
    return subprocess.Popen([sys.executable, "-m", "tandem", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _actor_pids() -> list[int]:
    """Processes of this cluster's teacher actors (Ray names them after the class): children of a raylet this test
    process started, never another cluster's on the same machine."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and b"MapBatches(TeacherActor)" in (proc / "cmdline").read_bytes()
                    and _parent(_parent(int(proc.name))) == os.getpid()):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _parent(pid: int) -> int:
    """The parent process id of `pid` (its stat's fourth field, after the parenthesised name)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _until(done: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    """Wait for `done` while the build `proc` runs (it must not end first)."""
    deadline = time.monotonic() + 300
    while not done():
        assert proc.poll() is None, f"build ended before {what}: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"build too slow: no {what}"
        time.sleep(0.005)


def test_killed_driver_and_lost_worker_resume_each_shard_once_into_the_local_bundle(
    ray_address: str, tmp_path: Path, tiny_teacher: Path
) -> None:
    """One build through both failures: its first driver, a `tandem index build`, is killed after 3 shards; the second,
    `build` in this process, resumes, and its one actor is killed mid-build, so it ends only once Ray has replaced it.
    The version published is the local engine's (same ids, cosine >= 0.9999) with its agreement sample, and each
    shard was encoded exactly once across both."""
    copies = 2  # 20 shards of 2: room for the kill after 3 and for the resumed actor's kill mid-build
    corpus = _corpus(tmp_path / "corpus.jsonl", copies=copies)
    n = copies * len(DOCS)
    home, root = _home(tmp_path / "home", tiny_teacher), tmp_path / "root"
    args = ["index", "build", "--corpus", str(corpus), "--root", str(root), "--version", "v1", "--shard-size", "2",
            "--batch-size", "1", "--engine", "ray", "--ray-address", ray_address, "--ray-actors", "1"]

    def logged() -> int:
        logs = list((home / "embeddings").glob(f"*/{SHARD_LOG}"))
        return len(logs[0].read_text().splitlines()) if logs else 0

    killed = _tandem(args, home)
    _until(lambda: logged() >= 3, killed, "3 shards")
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    assert not root.exists() or not list_versions(root)  # a killed build publishes nothing
    [entry] = list((home / "embeddings").iterdir())
    before = len(ShardLog(entry).read())
    assert 3 <= before < n // 2, before
    gone = set(_actor_pids())  # the killed driver's actors (Ray ends them with its job): never the one killed below

    # the resumed build runs here, as the parity build of the local engine did (Ray Data and torch are imported once
    # per process: here already), while a thread kills its one actor once it has encoded a shard of its own
    killed_actors: list[int] = []
    at_kill: list[int] = []
    ended = threading.Event()

    def kill_its_actor() -> None:
        deadline = time.monotonic() + 300
        while not ended.is_set() and time.monotonic() < deadline:
            mine = set(_actor_pids()) - gone if logged() > before else set()
            if mine:
                for actor in mine:
                    os.kill(actor, signal.SIGKILL)
                killed_actors.extend(mine)
                at_kill.append(len(ShardLog(entry).read()))
                return
            time.sleep(0.01)  # /proc read gently: the build runs in this process

    killer = threading.Thread(target=kill_its_actor, daemon=True)
    killer.start()
    try:
        resumed = build(BuildRequest(corpus=corpus, root=root, version="v1", store=home / "embeddings", shard_size=2,
                                     batch_size=1, teacher=tiny_teacher, engine="ray", ray_address=ray_address,
                                     ray_actors=1))
    finally:
        ended.set()
        killer.join(timeout=60)
    assert len(killed_actors) == 1, f"the resumed build's one actor, killed mid-build: {killed_actors}"
    [actor] = killed_actors
    assert at_kill[0] < n // 2, at_kill  # the actor died mid-build: shards were left for its replacement
    assert actor not in _actor_pids()
    embeddings = resumed.embeddings
    assert (embeddings.engine, embeddings.precision, embeddings.device) == ("ray", "fp32", "cpu")

    records = ShardLog(entry).read()
    assert sorted(r.shard for r in records) == list(range(n // 2))  # each shard encoded exactly once
    assert {r.event for r in records} <= {"encoded", "adopted"}
    assert len({r.pid for r in records}) == 2  # the killed driver and the resumed one
    ray_built = Bundle(read_current(root))
    try:
        assert has_sample(ray_built.manifest, ray_built.manifest.parts[0])  # a Ray build's sample, in fp32
        assert ray_built.segments[0].docs.count() == n and ray_built.ids() == [
            f"{d[0]}-{c}" for c in range(copies) for d in DOCS]
        # the local engine's vectors of the same passages (its runner, in this process): the bundles of both engines
        # are written from their vectors by the same writer, so the vectors are what a local build would differ in
        passages = [f"{title} {text} ({c})" for c in range(copies) for _, title, text in DOCS]
        local = local_teacher(passages, load_card(tiny_teacher), TeacherRun(), "fp32")
        [(_, first)] = list(local([Shard(0, 0, n)], lambda _: None))
        cosine = (first * ray_built.segments[0].vectors.index.reconstruct_n(0, n)).sum(axis=1)
        assert cosine.min() >= 0.9999
    finally:
        ray_built.close()


def test_ray_build_of_a_bad_corpus_names_the_line(ray_address: str, tmp_path: Path, tiny_teacher: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"_id": "a", "text": "one"}\n{"_id": "b", "text": "two"}\n{"_id": "c", "text": 3}\n')
    home, out = _home(tmp_path / "home", tiny_teacher), tmp_path / "out"
    proc = _tandem(["index", "build", "--corpus", str(corpus), "--out", str(out), "--engine", "ray",
                    "--ray-address", ray_address, "--ray-actors", "1"], home)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert f"{corpus}:3: 'text' must be a string" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_shards_come_back_whole_from_rows_in_any_order_and_any_batching() -> None:
    """Actors return blocks in the order they finish, and Ray Data may split or merge them: each shard is yielded
    once, as soon as its last row is in, with every row in its place; every row counts as progress; a shard left
    short is an error, never a hole in the store."""
    shards = [Shard(0, 0, 2), Shard(1, 2, 5), Shard(2, 5, 6)]
    rows = [[5, 3], [0], [4, 1], [2]]  # shard 2 first, shard 1 across three batches, shard 0 across two
    batches = [{"row": np.array(r), "vector": np.array([[float(x), -float(x)] for x in r])} for r in rows]
    progress: list[int] = []
    done = list(_assemble(shards, iter(batches), progress.append))
    assert [shard.index for shard, _ in done] == [2, 0, 1]
    for shard, vectors in done:
        assert vectors.dtype == np.float16
        assert vectors.tolist() == [[float(x), -float(x)] for x in range(shard.start, shard.end)]
    assert progress == [2, 1, 2, 1]
    with pytest.raises(RuntimeError, match="incomplete shards"):
        list(_assemble(shards, iter(batches[:3]), progress.append))


def test_an_actor_reads_the_shards_of_its_block_from_the_corpus_file(tmp_path: Path, tiny_teacher: Path) -> None:
    """A build starts no read task (a worker process each): the driver's rows name each shard's byte offset, and
    the actor parses the slice itself, every row in its place, whatever shards a block holds."""
    copies = 8  # 160 documents: shards that start past the first offsets noted (OFFSET_STRIDE apart)
    writer = DocstoreWriter(tmp_path / "docs.sqlite")
    corpus = ingest_corpus(_corpus(tmp_path / "corpus.jsonl", copies=copies), writer)
    writer.close()
    n = copies * len(DOCS)
    shards = [Shard(0, 0, 3), Shard(1, 3, 70), Shard(2, 70, n - 3), Shard(3, n - 3, n)]
    items = _items(corpus.offsets, shards)
    actor = TeacherActor(str(corpus.path), str(tiny_teacher), "cpu", "fp32", 8, None, 1)
    batch = {key: np.array([item[key] for item in items[1:]]) for key in items[0]}  # three shards in one block
    out = actor(batch)
    assert out["row"].tolist() == list(range(3, n))
    passages = [f"{title} {text} ({c})" for c in range(copies) for _, title, text in DOCS][3:]
    want = actor.encoder.encode_documents(passages, batch_size=8).astype(np.float16)
    assert out["vector"].dtype == np.float16 and np.array_equal(out["vector"], want)
