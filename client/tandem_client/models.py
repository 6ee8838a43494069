"""Typed answers of a tandem server. Unknown fields are kept, not refused: a newer server may add some."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Mode = Literal["dense", "lexical", "hybrid"]
Fusion = Literal["convex", "rrf"]
HitField = Literal["id", "score", "title", "text", "metadata"]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Hit(_Answer):
    """A document found. The server sends `id`, `score`, `title` and `text` unless the request's `fields`
    asked for others, so each may be absent (None); `metadata` only when asked for."""

    id: str | None = None
    score: float | None = None  # dense: cosine in the index's space; lexical: BM25; hybrid: the fused score
    title: str | None = None
    text: str | None = None
    metadata: dict[str, Any] | None = None


class IndexInfo(_Answer):
    """The bundle that answered; `version` changes when the server hot-reloads a new one."""

    version: str
    teacher: str
    teacher_fingerprint: str
    dim: int
    quantization: str
    count: int
    build_time: str


class Timing(_Answer):
    """Server-side milliseconds: waiting in the queue, student encoding, index search, BM25 scoring (lexical and
    hybrid modes) and the filter turned into rows (0 from a server that predates them)."""

    queue: float
    encode: float
    search: float
    lexical: float = 0.0
    filter: float = 0.0


class SearchResult(_Answer):
    results: list[Hit]
    index: IndexInfo
    timing_ms: Timing


class BatchSearchResult(_Answer):
    results: list[list[Hit]]  # one list per query, in order
    index: IndexInfo
    timing_ms: Timing


class CollectionInfo(_Answer):
    """A collection the client's key may see (GET /collections); `version` and `count` are None until loaded."""

    name: str
    state: Literal["loading", "ready", "failed"]
    default: bool  # whether search() without a collection answers from it
    student: str  # embed()'s model for this collection
    error: str | None = None
    version: str | None = None
    count: int | None = None


class CollectionList(_Answer):
    collections: list[CollectionInfo]


class Embeddings(_Answer):
    """Query vectors in the teacher's space (unit length), one per text, and the tokens encoded."""

    vectors: list[list[float]]
    model: str
    prompt_tokens: int


class Health(_Answer):
    status: Literal["ok"]


class Readiness(_Answer):
    status: Literal["loading", "ready", "failed"]
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready"
