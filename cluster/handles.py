"""The coordinator's side of a shard deployment: its Ray Serve handle as a models.search.shards.ShardClient.

Every call waits at most `timeout_s`: a shard whose replicas are all gone (or that does not hold the version asked)
raises ShardUnavailable, which the coordinator turns into a 503, never a partial answer.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from ray import exceptions as ray_exceptions
from ray.serve import exceptions as serve_exceptions
from ray.serve.handle import DeploymentHandle, DeploymentResponse

from models.bundle.lexical.postings import LexicalStats
from models.corpus import Document
from models.search.shards import ShardLists, ShardQuery, ShardUnavailable, VersionNotLoaded

T = TypeVar("T")
FAILURES = (ray_exceptions.RayError, serve_exceptions.RayServeException, TimeoutError, VersionNotLoaded)


class Answer(Generic[T]):
    """A shard's answer on its way; `result()` waits for it, at most the client's timeout."""

    def __init__(self, response: object, shard: str, timeout_s: float) -> None:
        assert isinstance(response, DeploymentResponse)  # a unary method: never a streaming generator
        self.response, self.shard, self.timeout_s = response, shard, timeout_s

    def result(self) -> T:
        try:
            return self.response.result(timeout_s=self.timeout_s)
        except FAILURES as exc:
            raise ShardUnavailable(f"shard {self.shard} did not answer: {type(exc).__name__}") from exc


class ServeShard:
    """One shard deployment reached through its handle (Ray Serve picks the replica)."""

    def __init__(self, handle: DeploymentHandle, name: str, timeout_s: float = 10.0) -> None:
        self.handle, self.name, self.timeout_s = handle, name, timeout_s

    def statistics(self, version: str, stems: list[list[str]]) -> Answer[list[LexicalStats]]:
        return Answer(self.handle.statistics.remote(version, stems), self.name, self.timeout_s)

    def search(self, query: ShardQuery) -> Answer[ShardLists]:
        return Answer(self.handle.search.remote(query), self.name, self.timeout_s)

    def documents(self, version: str, rows: list[int]) -> Answer[list[Document]]:
        return Answer(self.handle.documents.remote(version, rows), self.name, self.timeout_s)
