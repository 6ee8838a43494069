"""Shards on a real local Ray cluster (issue 57): a version of four segments in two shard deployments, one with two
replicas, answers as the single box does (same ids, order, float32 scores and version); a new version is served only
once every shard has loaded it, a request names the version it was answered from, and one pinned to the version
before still answers from it after the move; a shard with no replica left
fails the request whole; under open-loop load a replica's kill and an `index update` give only the box's answers
for the version each names, or 503s. The process's one local Ray (tests/fixtures/ray_cluster.py: starting Ray costs
seconds), with Serve started on it for the module; a test that needs v4 in service on the module's plan takes the
deployment a test before it left running (`_in_service`, and `ClusterSearch.deploy` keeps the applications that run
it: replicas start in seconds each) or deploys it. Every test names v4, the module root's version before the update
test publishes v5 in it (on the module's deployments: no second set of v4's replicas). Marked slow by its
fixtures."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.serve")

from cluster.coordinator import ClusterSearch, connect
from models.bundle.version import Bundle
from models.bundle.versions import read_current
from models.search import Mode, SearchOptions, search
from models.search.shards import Coordinator, ShardUnavailable
from tests.fixtures.server import serve_app
from tests.models.search.test_shards import OVERSAMPLE, QUERIES, _answer, _options, _segmented, _vectors

PLAN = [[0], [1, 2, 3]]  # uneven: 60 rows, and 48 (plan_shards' own for v4: the plan the service deploys)
V4 = "v4"  # the version the tests search; the update test publishes v5 after it
REPLICAS = [2, 1]  # v4's: the first shard's two, one killed under load; v5 gets one a shard (`_one_replica`)


@pytest.fixture(scope="module")
def root(mini_teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its four versions are written without an agreement sample, as the update test's v5 is: no test here scores
    one (the services run with agreement_budget_s=0), and each write would encode the sample's queries and search the
    staged version for them (1.3 CPU-s of the fixture's 1.4 with warm imports)."""
    from indexer.sample import SAMPLE_SETTING

    work = tmp_path_factory.mktemp("ray-shards")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SAMPLE_SETTING, "0")
        _segmented(work / "root", work, mini_teacher)
    return work / "root"


@pytest.fixture(scope="module")
def student(mini_student: Path) -> Path:
    """The run's tiny student (tests/fixtures/tiny_service.py), for `tandem serve`: distilled from the root's teacher
    (the same tiny BERT) on another corpus, which these tests never ask about (each compares two services with the
    same student); shared by every module of the run, where a student of this root cost a distillation here."""
    return mini_student


TIMEOUT_S = 20.0
# Every service here runs with agreement_budget_s=0: these tests assert answers, never the student's agreement
# (tests/service/search/test_service_agreement.py does), and each load or reload would score it on a thread of this
# process (seconds of CPU, beside the open loop and the replicas).


@pytest.fixture(scope="module")
def cluster(root: Path, ray_cluster: str) -> Iterator[ClusterSearch]:
    from ray import serve

    connect(ray_cluster)  # joins the running Ray: starts Serve on it
    # three versions' replicas (v3, v4 and the update test's v5) fit in the cluster's slots beside a build's actors
    sharded = ClusterSearch(shards=2, replicas=list(REPLICAS), timeout_s=TIMEOUT_S, cpus_per_replica=0.25)
    try:
        yield sharded
    finally:
        serve.shutdown()  # every application at once (not one blocking delete after another); Ray stays up


def _in_service(cluster: ClusterSearch, version: Path, plan: list[list[int]]) -> Coordinator:
    """The coordinator of `version` on `plan`: the one in service if it is that (a test before left it running, and
    every replica it started is up or being replaced by Serve), else a fresh deploy."""
    version = version.resolve()
    coordinator = cluster.coordinator
    if (coordinator is not None and version in cluster.served.get(version.parent, [])
            and coordinator.version.version == version.name
            and coordinator.version.plan == tuple(tuple(p) for p in plan)):
        return coordinator
    return cluster.deploy(version, plan)


@contextmanager
def _one_replica(cluster: ClusterSearch) -> Iterator[None]:
    """Versions deployed meanwhile get one replica a shard: v5 is asserted for what it answers, which a
    second replica (a process that imports Ray Serve and maps its segments: seconds on a busy machine) would only
    repeat. v4 keeps `REPLICAS`, so a test after finds its applications as deployed (`_in_service`)."""
    cluster.replicas = [1] * cluster.shards
    try:
        yield
    finally:
        cluster.replicas = list(REPLICAS)


def _replicas(cluster: ClusterSearch, version: Path, shards: tuple[int, ...] | list[int] = (0, 1)) -> list[str]:
    """The live replica actors of `version`'s applications for `shards` (Serve names them after the application)."""
    import ray

    apps = [cluster.app(version, i) for i in shards]
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith("SERVE_REPLICA") and any(f"{app}#" in a["name"] for app in apps))


def _same_as_box(cluster: ClusterSearch, version: Path) -> None:
    box = Bundle(version)
    try:
        vectors = _vectors(box.manifest.dim)
        for opts in _options(box):
            name, got = cluster.search(vectors, QUERIES, opts, OVERSAMPLE)
            assert name == version.name
            assert _answer(got.hits) == _answer(search(box, vectors, QUERIES, opts, OVERSAMPLE).hits), opts
    finally:
        box.close()


def test_two_shards_on_ray_serve_answer_as_one_box_and_move_versions_whole(cluster: ClusterSearch,
                                                                            root: Path) -> None:
    """v4 on two shards answers as its box; `deploy` returns its coordinator only once every shard runs it. The move
    to the next version, with a request pinned before it still answered from the version before, is asserted where
    a next version is deployed anyway: the update test's v5 (a v3 deployed here for it cost two more replicas)."""
    current = root / V4
    assert cluster.deploy(current, PLAN).version.version == "v4"
    _same_as_box(cluster, current)


def test_tandem_serve_cluster_answers_as_tandem_serve(cluster: ClusterSearch, root: Path, student: Path) -> None:
    """The served path: the same /search bodies to a service whose retrieve runs on the shards and to one that
    searches in process give the same results and the same version."""
    from cluster.service import ClusterRetrieval
    from service.core.searcher import retrieve_remotely
    from service.http.app import create_app
    from service.settings import ServiceSettings

    v4 = (root / V4).resolve()
    _in_service(cluster, v4, PLAN)
    replicas = _replicas(cluster, v4)
    # deadlines opened wide: a request through Serve on a loaded 2-core machine can pass the default 1 s, which is
    # not what this compares (tests/models/search/test_deadline.py and test_shards.py test deadlines)
    settings = ServiceSettings(index=v4, student=student, port=0, agreement_budget_s=0, max_queue_ms=60_000,
                               request_timeout_ms=60_000)
    bodies = [{"query": q, "top_k": 10, "mode": mode, "offset": offset, **extra}
              for q in ("river stone", "zebra harbor") for mode in ("dense", "lexical", "hybrid")
              for offset in (0, 20) for extra in ({}, {"filter": {"field": "group", "eq": "a"}})]
    retrieve_remotely(ClusterRetrieval(cluster))
    try:
        with serve_app(create_app(settings)) as sharded:
            assert _replicas(cluster, v4) == replicas  # the service's deploy of the version in service kept them
            retrieve_remotely(None)
            with serve_app(create_app(settings)) as box:
                for body in bodies:
                    got, want = sharded.client.post("/search", json=body), box.client.post("/search", json=body)
                    assert got.status_code == want.status_code == 200, (got.text, want.text)
                    assert got.json()["results"] == want.json()["results"], body
                    assert got.json()["index"] == want.json()["index"]
                assert any(box.client.post("/search", json=b).json()["results"] for b in bodies)
    finally:
        retrieve_remotely(None)


def _wait_for(done: Callable[[], bool], limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, "the load thread stopped making progress"
        time.sleep(0.05)


def test_an_update_and_a_replica_kill_under_open_loop_load_answer_as_each_versions_box(
        cluster: ClusterSearch, root: Path, student: Path, mini_teacher: Path,
        tmp_path: Path, no_agreement_sample: None) -> None:
    """The served path (create_app + ClusterRetrieval on uvicorn) under an open loop (tandem.openloop: requests on a
    fixed schedule, whatever became of the ones before): one of the first shard's two replicas is killed, then
    `index update` (documents added, replaced, deleted) publishes a version the pointer watch puts in service. Every
    answer is the single box's answer for the version it names, both versions answer, v4 after the kill too (from
    the replica left), and a request not answered is refused whole with a retryable error: 503 `shard_unavailable`
    (a shard), or, where the busy machine's queue runs past even the opened limits below, 429 `overloaded`
    (admission, before any search) or 503 `deadline_exceeded`. (This is also the test of a replica killed under
    load: every answer exact or a 503, and answers from the replica left.)
    A coordinator taken before the update (a request pinned to v4) still answers as v4's box once v5 is in service:
    the move keeps the version before for it. It serves the module's root on the module's deployments: v4's, if a
    test before left them running, are kept (the service's deploy of a running version starts no replica), and v5 is
    published in that root, without an agreement sample (no service here scores one)."""
    import ray
    from ray import serve

    from cluster.service import ClusterRetrieval
    from indexer.versions.request import UpdateRequest
    from indexer.versions.update import update
    from service.core.searcher import retrieve_remotely
    from service.http.app import create_app
    from service.settings import ServiceSettings
    from tandem.loadclient import Request
    from tandem.openloop import OpenLoop, Record, Target
    from tests.models.search.test_shards import _doc, _lines

    before = read_current(root).resolve()
    assert before.name == V4, f"the module's root is updated once, here: {before}"
    bodies = [{"query": q, "top_k": 10, "mode": mode, **extra} for q in QUERIES for mode in ("dense", "hybrid")
              for extra in ({}, {"filter": {"field": "group", "eq": "a"}})]
    targets = [Target(str(i), Request("POST", "/search", json.dumps(b).encode())) for i, b in enumerate(bodies)]

    def version(record: Record) -> str | None:
        return record.answer.json()["index"]["version"] if record.answer and record.status == 200 else None

    def settled() -> bool:  # v4's applications that run have every replica up (a test before may have killed one)
        applications = serve.status().applications
        return all(applications[app].status == "RUNNING" for app in (cluster.app(before, i) for i in range(2))
                   if app in applications)

    rng = np.random.default_rng(11)
    changes = _lines(tmp_path / "changes.jsonl", [_doc(rng, f"live{i}") for i in range(8)] + [_doc(rng, "d5")]
                     + [{"_id": "d6", "delete": True}, {"_id": "u3", "delete": True}])
    _wait_for(settled)
    retrieve_remotely(ClusterRetrieval(cluster))
    try:
        # admission opened wide (a 429 is the busy machine's, not the shards'): nearly every request is searched
        settings = ServiceSettings(index=root, student=student, port=0, watch_interval_s=0.1, max_queue_ms=60_000,
                                   request_timeout_ms=60_000, max_pending=10_000, agreement_budget_s=0)
        with serve_app(create_app(settings)) as app:
            pinned = cluster.coordinator  # the service's v4 (a request that takes it now is pinned to it)
            with OpenLoop(app.url, targets, rps=10.0, timeout_s=90.0) as load:
                load.wait_answered(len(bodies))
                replicas = _replicas(cluster, before, shards=[0])
                assert len(replicas) == 2, replicas
                killed_at = time.monotonic()
                ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
                # on until the replica left has answered a search sent after the kill (Serve's router may take a
                # while to drop the killed one on a busy machine: what it sends there meanwhile is a 503)
                load.wait_answered(len(bodies))
                _wait_for(lambda: any(r.sent > killed_at and version(r) == V4 for r in list(load.records)))
                with _one_replica(cluster):  # v5's, deployed by the service's pointer watch
                    update(UpdateRequest(changes=changes, root=root, version="v5", teacher=mini_teacher))
                    _wait_for(lambda: any(version(r) == "v5" for r in list(load.records)))
                load.wait_answered(len(bodies))
            records = list(load.records)
    finally:
        retrieve_remotely(None)
    refused = [r for r in records if r.status != 200]
    retryable = {(503, "shard_unavailable"), (503, "deadline_exceeded"), (429, "overloaded")}
    assert all(r.answer and (r.status, r.answer.json()["error"]) in retryable for r in refused), [
        (r.status, r.error, r.answer and r.answer.body[:200]) for r in refused]
    named = {name for r in records if (name := version(r)) is not None}
    assert named == {before.name, "v5"}
    assert any(r.sent > killed_at and version(r) == V4 for r in records)  # v4 answered after its replica's kill
    wrong = []
    for name in sorted(named):
        with serve_app(create_app(ServiceSettings(index=root / name, student=student, port=0,
                                                  agreement_budget_s=0))) as box:
            want = {i: box.client.post("/search", json=body).json() for i, body in enumerate(bodies)}
        for r in records:
            if version(r) == name:
                got, expected = r.answer.json(), want[int(r.target)]  # type: ignore[union-attr]
                if got["results"] != expected["results"] or got["index"] != expected["index"]:
                    wrong.append((name, bodies[int(r.target)]))
    assert not wrong, wrong
    # the move was whole: v5 in service, and a request pinned to v4 before it still answers from v4's shards
    assert pinned is not None and pinned.version.version == V4 and cluster.version == "v5"
    v4_box = Bundle(before)
    try:
        opts, vectors = SearchOptions(top_k=5, mode=Mode.HYBRID), _vectors(v4_box.manifest.dim)
        v4_hits = search(v4_box, vectors, QUERIES, opts, OVERSAMPLE).hits
        assert _answer(pinned.search(vectors, QUERIES, opts, OVERSAMPLE).hits) == _answer(v4_hits)
    finally:
        v4_box.close()


def test_a_shard_without_a_live_replica_fails_the_request_whole(cluster: ClusterSearch, root: Path) -> None:
    from ray import serve

    current = (root / V4).resolve()
    coordinator = _in_service(cluster, current, PLAN)
    try:
        for client in coordinator.shards:
            client.timeout_s = 3.0  # type: ignore[attr-defined]
        serve.delete(cluster.app(current, 1))  # every replica of the second shard gone
        with pytest.raises(ShardUnavailable):
            cluster.search(np.asarray(_vectors(64)), QUERIES, SearchOptions(top_k=5), OVERSAMPLE)
    finally:  # the version has a shard less: a test after deploys it again (serve.shutdown deletes what is left)
        cluster.coordinator = None
