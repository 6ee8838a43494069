"""The coordinator: shard deployments on Ray Serve for a version, and a search pinned to one version at a time.

Exactness rules (docs/operations.md#sharded-serving-on-ray-serve):
- a request is pinned to one version: it takes the coordinator in service once, and every call it makes (statistics,
  search, documents) names that version, which a shard holds or refuses;
- the coordinator moves to a new version only once every shard has loaded it: `deploy` starts the new version's
  shard applications beside the old ones, all at once (`serve.run_many` returns once every replica of each has
  loaded its segments), and only then is the new version put in service (a shard application that already runs the
  version's segments as this process deployed them is kept: its replicas are not started again); the version before
  keeps its deployments for the requests still pinned to it, and the one before that is deleted (its deletion not
  waited for: the move does not wait for its replicas to drain);
- a shard with no live replica (or no answer within the timeout) fails the whole request with ShardUnavailable
  (a 503), never a partial answer.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import serve

from cluster.handles import ServeShard
from cluster.replica import ShardReplica
from models.bundle.version import read_bundle_manifest
from models.search import Retrieved, SearchOptions
from models.search.shards import Coordinator, ShardedVersion, plan_shards

log = logging.getLogger(__name__)
APP_PREFIX = "tandem-shard"
KEEP = 2  # versions with deployments: the one in service and the one before, for the requests still pinned to it
Spec = tuple[tuple[int, ...], int, float]  # a shard application as deployed: its segments, replicas and CPUs each


def connect(address: str, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at `address` ("auto": the one this node belongs to), or start one in this process for
    `local`; Serve's HTTP proxy stays off (the coordinator is the only door)."""
    if not ray.is_initialized():
        if address == "local":
            # "local": a new cluster of this process's own, never a `ray start` one that runs on the machine
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, configure_logging=False)
        else:
            ray.init(address=address, configure_logging=False)
    serve.start(proxy_location="Disabled")


class ClusterSearch:
    """Shard deployments of the version in service, and the search of it (models.search.shards.Coordinator)."""

    def __init__(self, shards: int, replicas: Sequence[int] | int = 1, timeout_s: float = 10.0,
                 cpus_per_replica: float = 1.0, prefix: str = APP_PREFIX) -> None:
        self.shards = shards
        self.replicas = [replicas] * shards if isinstance(replicas, int) else list(replicas)
        if len(self.replicas) != shards or min(self.replicas) < 1:
            raise ValueError(f"replicas {self.replicas}: one count, at least 1, per shard of {shards}")
        self.timeout_s, self.cpus, self.prefix = timeout_s, cpus_per_replica, prefix
        self.coordinator: Coordinator | None = None
        self.served: dict[Path, list[Path]] = {}  # per root, its versions with deployments, oldest first
        self._lock = threading.Lock()  # one deploy at a time
        self._deployed: dict[str, Spec] = {}  # by application, what this object deployed there

    def app(self, version: Path, shard: int) -> str:
        """A shard's application: named by its version's name and path (two collections' roots may both hold a
        `v1`)."""
        where = hashlib.sha256(str(version).encode()).hexdigest()[:8]
        return f"{self.prefix}-{version.name}-{where}-{shard}"

    def deploy(self, version: Path, plan: Sequence[Sequence[int]] | None = None) -> Coordinator:
        """Start every shard of `version` (each application runs once all its replicas have loaded their segments),
        then put it in service; the version before keeps its deployments for the requests pinned to it, and the one
        before that is deleted (the exactness rules above). Returns the version's coordinator, which searches it
        alone."""
        version = Path(version).resolve()
        manifest = read_bundle_manifest(version)
        plan = [list(p) for p in plan] if plan is not None else plan_shards([p.count for p in manifest.parts],
                                                                           self.shards)
        if len(plan) != self.shards:
            raise ValueError(f"a plan of {len(plan)} shards for {self.shards} shard deployments")
        pinned = ShardedVersion(version.name, manifest, tuple(tuple(p) for p in plan))
        with self._lock:
            specs = {self.app(version, i): (tuple(segments), self.replicas[i], self.cpus)
                     for i, segments in enumerate(plan)}
            running = self._running(specs)
            targets = [serve.RunTarget(self._deployment(i).bind(str(version), list(spec[0])), name=name,
                                       route_prefix=None)
                       for i, (name, spec) in enumerate(specs.items()) if name not in running]
            # every shard's at once; returns once each application runs (each replica has loaded its segments)
            started = dict(zip([t.name for t in targets], serve.run_many(targets), strict=True)) if targets else {}
            self._deployed.update({name: spec for name, spec in specs.items() if name in started})
            clients = [ServeShard(started[name] if name in started else serve.get_app_handle(name), name,
                                  self.timeout_s) for name in specs]
            coordinator = self.coordinator = Coordinator(pinned, clients)
            served = self.served.setdefault(version.parent, [])
            if version not in served:
                served.append(version)
            while len(served) > KEEP:  # the version before the one before: no request is pinned to it now
                # not waited for: its replicas drain (Serve's graceful shutdown, seconds) while the new version serves
                self._delete(served.pop(0), wait=False)
        log.info("version %s in service on %d shards (%s replicas), segments %s", version.name, self.shards,
                 self.replicas, plan)
        return coordinator

    def _deployment(self, shard: int) -> Any:
        return serve.deployment(ShardReplica, name="shard", num_replicas=self.replicas[shard],
                                ray_actor_options={"num_cpus": self.cpus}, health_check_period_s=2,
                                health_check_timeout_s=10)

    def _running(self, specs: dict[str, Spec]) -> set[str]:
        """The applications of `specs` that run already as this object deployed them (the same segments, replicas
        and slots): deploying a version again keeps them. Ray Serve would otherwise replace every replica of an
        application run again (a Python application has no code version: each run is a new one), seconds each and
        that deployment's capacity down meanwhile."""
        same = [name for name, spec in specs.items() if self._deployed.get(name) == spec]
        if not same:
            return set()
        applications = serve.status().applications
        return {name for name in same if name in applications and applications[name].status == "RUNNING"}

    def _delete(self, version: Path, wait: bool = True) -> None:
        for i in range(self.shards):
            name = self.app(version, i)
            self._deployed.pop(name, None)
            serve.delete(name, _blocking=wait)  # Serve's own switch (ray is pinned: pyproject's `ray` extra)

    @property
    def version(self) -> str:
        if self.coordinator is None:
            raise RuntimeError("no version deployed")
        return self.coordinator.version.version

    def search(self, vectors: np.ndarray | None, queries: list[str], opts: SearchOptions,
               oversample: int) -> tuple[str, Retrieved]:
        """The answer and the version it is of: the coordinator is taken once, so the request is pinned to it."""
        coordinator = self.coordinator
        if coordinator is None:
            raise RuntimeError("no version deployed")
        return coordinator.version.version, coordinator.search(vectors, queries, opts, oversample)

    def close(self) -> None:
        for versions in self.served.values():
            for version in versions:
                self._delete(version)
        self.served, self.coordinator = {}, None
