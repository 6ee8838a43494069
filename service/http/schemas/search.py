"""POST /search: the request, its hits, and the answer with the index that answered and the stage timings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.http.schemas.common import Count, QueryText
from service.settings import MAX_BATCH_QUERIES

MAX_OFFSET = 10_000


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
    mode: Literal["dense", "lexical", "hybrid"] = Field(
        "dense", description="dense (student vectors), lexical (BM25) or hybrid (both, fused). lexical and hybrid "
        "need a bundle with a lexical index.")
    fusion: Literal["rrf", "convex"] | None = Field(
        None, description="hybrid: reciprocal rank fusion or a convex combination of min-max-normalized scores; "
        "the bundle's default when omitted.")
    alpha: Annotated[float, Field(ge=0.0, le=1.0, strict=True, allow_inf_nan=False)] | None = Field(
        None, description="hybrid, convex: weight of the dense score (1 − alpha goes to BM25); the bundle's default "
        "when omitted.")
    filter: dict[str, Any] | None = Field(
        None, description='Metadata filter, applied before ranking: {"field": F, "eq": V}, "in": [...], '
        '"gt"/"gte"/"lt"/"lte" (numbers or ISO dates), "exists": bool, combined with {"and": [...]}, '
        '{"or": [...]}, {"not": {...}}. A keyword-list field matches when any element does; a datetime field '
        'compares instants. An unknown field is a 422.',
        examples=[{"and": [{"field": "year", "gte": 2018}, {"field": "lang", "in": ["en", "de"]}]}])
    offset: Count | None = Field(None, ge=0, le=MAX_OFFSET, description="Hits to skip (pagination).")
    min_score: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = Field(
        None, description="Drop hits scoring below this (in the mode's score: cosine, BM25 or fused).")
    fields: list[Literal["id", "score", "title", "text", "metadata"]] | None = Field(
        None, min_length=1, description="Fields of each hit to return (default id, score, title, text); e.g. "
        '["id", "score"] keeps large answers small.')


class SearchHit(BaseModel):
    """A hit; only the request's `fields` are present."""

    id: str | None = None
    score: float | None = Field(None, description="dense: cosine in the index's space; lexical: BM25; hybrid: the "
                                "fused score.")
    title: str | None = None
    text: str | None = None
    metadata: dict[str, Any] | None = None


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


class FieldDescription(BaseModel):
    name: str
    type: Literal["keyword", "keyword-list", "integer", "float", "boolean", "datetime"] | None = Field(
        description="The payload index's type; null for a key it does not hold (older bundles, or values of "
        "several types), which filters through the docstore.")
    declared: bool = Field(description="Declared at build (`--field`); else inferred from the values.")


class IndexDescription(IndexSummary):
    """GET /index: the bundle in service, and what a search of it may ask."""

    modes: list[Literal["dense", "lexical", "hybrid"]]
    fields: list[FieldDescription] = Field(description="The fields a filter may name.")


class Timing(BaseModel):
    queue: float = Field(description="Waiting for a worker and for a micro-batch to form, milliseconds.")
    encode: float = Field(description="Student encoding of the micro-batch, milliseconds.")
    search: float = Field(description="Index search, fusion and document lookup, milliseconds.")
    lexical: float = Field(0.0, description="BM25 scoring (lexical and hybrid modes), milliseconds.")
    filter: float = Field(0.0, description="Turning the request's filter into the rows it allows (the bundle's "
                          "payload index), milliseconds; 0 without a filter.")


class SearchResponse(BaseModel):
    results: list[SearchHit]
    index: IndexSummary
    timing_ms: Timing


class BatchSearchResponse(BaseModel):
    results: list[list[SearchHit]] = Field(description="One list per query of the request, in order.")
    index: IndexSummary
    timing_ms: Timing
