"""`tandem serve --cluster`: today's service with only its retrieve step on the shards.

The service loads each version as it always does (the student, batching, keys, collections, filters' fields, the
rescoring cap and hot reloads stay where they are) and, through service.core.searcher.retrieve_remotely, hands each
loaded version to `ClusterRetrieval.attach` before it goes into service: that deploys the version's shards and
returns once every one runs, so a hot reload moves to a version only when every shard has loaded it, and a request,
which leases one searcher, is answered from that version's shards alone.
"""

from __future__ import annotations

from cluster.coordinator import ClusterSearch
from models.bundle.version import Bundle
from service.core.searcher import Retrieve


class ClusterRetrieval:
    """The service's RemoteRetrieval: each loaded version's shards on Ray Serve."""

    def __init__(self, cluster: ClusterSearch) -> None:
        self.cluster = cluster

    def attach(self, bundle: Bundle) -> Retrieve:
        return self.cluster.deploy(bundle.directory).search
