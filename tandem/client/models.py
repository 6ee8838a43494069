"""Typed answers of a tandem server. Unknown fields are kept, not refused: a newer server may add some."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Hit(_Answer):
    id: str
    score: float  # cosine of the query and the document, in the index's space
    title: str
    text: str


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
    """Server-side milliseconds: waiting in the queue, student encoding, index search."""

    queue: float
    encode: float
    search: float


class SearchResult(_Answer):
    results: list[Hit]
    index: IndexInfo
    timing_ms: Timing


class BatchSearchResult(_Answer):
    results: list[list[Hit]]  # one list per query, in order
    index: IndexInfo
    timing_ms: Timing


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
