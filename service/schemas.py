"""Request and response shapes of the HTTP API (the OpenAPI document is generated from these)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

from service.settings import MAX_BATCH_QUERIES


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank_query", "query must not be empty or whitespace-only")
    return value


QueryText = Annotated[StrictStr, AfterValidator(_not_blank)]


def _whole_number(value: object) -> object:
    # JSON does not tell 10 from 10.0 (JSON Schema calls both integers); 2.5, "10" and true stay 422s.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Count = Annotated[StrictInt, BeforeValidator(_whole_number)]


class SearchRequest(BaseModel):
    """One `query`, or a batch of `queries`. Types are strict, so `"top_k": "10"` is a 422 rather than a
    silent coercion. Upper bounds come from the settings (TANDEM_MAX_QUERY_CHARS, TANDEM_MAX_TOP_K,
    TANDEM_MAX_BATCH_QUERIES) and are checked by the route."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"query": "how do tides work", "top_k": 5},
                                        {"queries": ["how do tides work", "parse a JSON string"], "top_k": 3}]},
    )

    query: QueryText | None = Field(None, description="Free text; not blank, at most TANDEM_MAX_QUERY_CHARS.")
    queries: list[QueryText] | None = Field(
        None, min_length=1, max_length=MAX_BATCH_QUERIES,  # bounded before any item is validated
        description="A batch instead of `query`: one result list per query, in order."
    )
    top_k: Count | None = Field(
        None, ge=1, description="Number of hits, 1..TANDEM_MAX_TOP_K; TANDEM_DEFAULT_TOP_K when omitted."
    )


class SearchHit(BaseModel):
    id: str
    score: float = Field(description="Inner product of unit vectors (cosine) in the index's space.")
    title: str
    text: str


class IndexSummary(BaseModel):
    """The bundle that answered (BundleManifest.summary())."""

    model_config = ConfigDict(extra="allow")

    teacher: str
    teacher_fingerprint: str
    dim: int
    quantization: str
    count: int
    build_time: str
    version: str = Field(description="The bundle directory's name; with build_time it identifies the version that "
                         "answered, which changes at a hot reload.")


class Timing(BaseModel):
    queue: float = Field(description="Waiting for a worker and for a micro-batch to form, milliseconds.")
    encode: float = Field(description="Student encoding of the micro-batch, milliseconds.")
    search: float = Field(description="Index search and document lookup, milliseconds.")


class SearchResponse(BaseModel):
    results: list[SearchHit]
    index: IndexSummary
    timing_ms: Timing


class BatchSearchResponse(BaseModel):
    results: list[list[SearchHit]] = Field(description="One list per query of the request, in order.")
    index: IndexSummary
    timing_ms: Timing


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["loading", "ready", "failed"]
    error: str | None = None


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    """Every non-2xx answer has this shape; `details` lists per-field problems of a 422."""

    error: str = Field(description="Machine-readable code, e.g. invalid_request, not_ready, internal.")
    message: str
    details: list[FieldError] | None = None
