"""`--engine ray` on a real local Ray (127.0.0.1, no dashboard): the local engine's bundle, resumable.

The builds assert the engine's mechanics (the local engine's vectors, each shard encoded once across a killed driver
or a lost actor, a bad line named), which any teacher shows, so the tiny teacher encodes (tests/fixtures/tiny_home.py):
every actor loads it in milliseconds where the real teacher took seconds per actor and per driver. The cluster is
the process's one (tests/fixtures/ray_cluster.py). The parity build runs two actors (shards come back from two
processes, in any order) and writes its agreement sample; the killed and the lost-worker builds run one actor (its
loss stops the build until Ray replaces it) and no sample (tests/indexer/test_agreement_check.py tests samples; here
it would only import torch into each driver)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from indexer.build import BuildRequest, build
from indexer.sample import SAMPLE_SETTING
from models.bundle.version import Bundle
from models.bundle.versions import list_versions, read_current
from models.embeddings.shard_log import SHARD_LOG, ShardLog
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


def test_ray_engine_builds_the_local_bundle(ray_address: str, tiny_corpus: Path, tmp_path: Path,
                                            tiny_teacher: Path) -> None:
    local = build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "local", store=tmp_path / "s1", shard_size=3,
                               teacher=tiny_teacher))
    remote = build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "ray", store=tmp_path / "s2", shard_size=3,
                                teacher=tiny_teacher, engine="ray", ray_address=ray_address, ray_actors=2))
    assert (remote.embeddings.engine, remote.embeddings.precision, remote.embeddings.device) == ("ray", "fp32", "cpu")
    assert local.embeddings.engine == "local"
    a, b = Bundle(tmp_path / "local"), Bundle(tmp_path / "ray")
    assert a.ids() == b.ids() == [d[0] for d in DOCS]
    n = len(DOCS)
    first, second = a.segments[0].vectors.index, b.segments[0].vectors.index
    cosine = (first.reconstruct_n(0, n) * second.reconstruct_n(0, n)).sum(axis=1)
    assert cosine.min() >= 0.9999
    records = ShardLog(tmp_path / "s2" / (remote.embeddings.store_key or "")).read()
    assert sorted(r.shard for r in records) == list(range(7))  # ceil(20 / 3) shards, each encoded once


def test_killed_ray_build_resumes_each_shard_once(
    ray_address: str, tmp_path: Path, tiny_teacher: Path
) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", copies=3)
    n = 3 * len(DOCS)
    home, root = _home(tmp_path / "home", tiny_teacher), tmp_path / "root"
    args = ["index", "build", "--corpus", str(corpus), "--root", str(root), "--version", "v1", "--shard-size", "2",
            "--batch-size", "1", "--engine", "ray", "--ray-address", ray_address, "--ray-actors", "1"]
    proc = _tandem(args, home)
    deadline = time.monotonic() + 300
    logged = 0
    while logged < 3:
        assert proc.poll() is None, f"build ended before the kill: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "build too slow"
        logs = list((home / "embeddings").glob(f"*/{SHARD_LOG}"))
        logged = len(logs[0].read_text().splitlines()) if logs else 0
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not root.exists() or not list_versions(root)  # a killed build publishes nothing
    [entry] = list((home / "embeddings").iterdir())
    before = len(ShardLog(entry).read())
    assert 3 <= before < n // 2, before

    resumed = _tandem(args, home)
    assert resumed.wait(timeout=300) == 0, resumed.communicate()[1][-2000:]
    records = ShardLog(entry).read()
    assert sorted(r.shard for r in records) == list(range(n // 2))  # each shard encoded exactly once
    assert {r.event for r in records} <= {"encoded", "adopted"}
    assert len({r.pid for r in records}) == 2  # the killed driver and the resumed one
    bundle = Bundle(read_current(root))
    assert bundle.segments[0].docs.count() == n and bundle.manifest.embeddings.engine == "ray"


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


def test_a_lost_worker_is_replaced_and_no_shard_is_encoded_twice(
    ray_address: str, tmp_path: Path, tiny_teacher: Path
) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", copies=3)
    n = 3 * len(DOCS)
    home = _home(tmp_path / "home", tiny_teacher)
    proc = _tandem(["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "out"), "--shard-size", "2",
                    "--batch-size", "1", "--engine", "ray", "--ray-address", ray_address, "--ray-actors", "1"], home)
    deadline = time.monotonic() + 300
    while not list((home / "embeddings").glob(f"*/{SHARD_LOG}")) or not _actor_pids():
        assert proc.poll() is None, f"build ended before the kill: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "build too slow"
        time.sleep(0.01)
    [actor] = _actor_pids()
    os.kill(actor, signal.SIGKILL)
    [entry] = list((home / "embeddings").iterdir())
    at_kill = len(ShardLog(entry).read())
    assert at_kill < n // 2, at_kill  # the actor died mid-build: shards were left for its replacement
    assert proc.wait(timeout=300) == 0, proc.communicate()[1][-2000:]
    records = ShardLog(entry).read()
    assert sorted(r.shard for r in records) == list(range(n // 2))
    assert actor not in _actor_pids()
    assert Bundle(tmp_path / "out").count == n


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
