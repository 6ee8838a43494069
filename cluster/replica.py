"""One shard's Ray Serve deployment: R replicas, each holding the same segments of one version.

A deployment serves one version (its application is named after it, cluster.coordinator): a new version gets new
deployments beside the old ones, so a replica never changes what it answers for, and a request pinned to a version
finds it or a refusal (models.search.shards.VersionNotLoaded), never another version's rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from models.bundle.lexical.postings import LexicalStats
from models.corpus import Document
from models.search.shards import Shard, ShardLists, ShardQuery

log = logging.getLogger(__name__)


class ShardReplica:
    """The shard API of models.search.shards.Shard behind a Ray Serve deployment (serve.deployment wraps it). The
    segments are memory-mapped from the volume every node reads, as the single box maps them."""

    def __init__(self, version: str, segments: Sequence[int]) -> None:
        self.shard = Shard(Path(version), segments, mapped=True)
        log.info("shard of %s loaded: segments %s", self.shard.version, list(segments))

    def statistics(self, version: str, stems: list[list[str]]) -> list[LexicalStats]:
        return self.shard.statistics(version, stems)

    def search(self, query: ShardQuery) -> ShardLists:
        return self.shard.search(query)

    def documents(self, version: str, rows: list[int]) -> list[Document]:
        return self.shard.documents(version, rows)

    def __del__(self) -> None:
        self.shard.close()
