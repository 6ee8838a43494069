"""POST /search: encode the queries with the student, search the bundle, return documents.

The first of a query's four files, route → engine → student → the bundle's search: `search` checks the
request and awaits `Searcher.search` (service/engine.py), whose worker encodes with
`StudentEncoder.encode_counted` (models/student.py) and searches with `retrieve` (models/retrieve.py),
which calls FAISS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from models.filters import FilterError, parse_filter
from models.manifest import FusionMethod
from models.retrieve import Hit, Mode, SearchOptions
from service.deps import LoaderDep, MetricsDep, SettingsDep
from service.engine import Searcher
from service.schemas.common import ErrorBody
from service.schemas.search import (
    BatchSearchResponse,
    IndexSummary,
    SearchHit,
    SearchRequest,
    SearchResponse,
    Timing,
)
from service.settings import ServiceSettings

router = APIRouter(tags=["search"])


def _problem(field: str, kind: str, message: str) -> dict[str, Any]:
    return {"loc": ("body", field), "type": kind, "msg": message}


def _check(request: SearchRequest, settings: ServiceSettings) -> tuple[list[str], int]:
    """The limits that depend on settings; returns the queries and the effective top_k."""
    problems = []
    if request.query is None and request.queries is None:
        problems.append(_problem("query", "missing", "Field required (or `queries` for a batch)"))
    if request.query is not None and request.queries is not None:
        problems.append(_problem("queries", "extra_forbidden", "give either `query` or `queries`, not both"))
    queries = [request.query] if request.query is not None else request.queries or []
    if len(queries) > settings.max_batch_queries:
        problems.append(_problem("queries", "too_long", f"{len(queries)} queries, at most "
                                 f"{settings.max_batch_queries} are allowed in one request"))
    field = "query" if request.query is not None else "queries"
    for i, query in enumerate(queries):
        if len(query) > settings.max_query_chars:
            where = field if request.query is not None else f"queries.{i}"
            problems.append(_problem(where, "string_too_long", f"query has {len(query)} characters, at most "
                                     f"{settings.max_query_chars} are allowed"))
    top_k = settings.default_top_k if request.top_k is None else request.top_k
    if top_k > settings.max_top_k:
        problems.append(_problem("top_k", "less_than_equal", f"top_k must be at most {settings.max_top_k}"))
    elif len(queries) * top_k > settings.max_total_hits:
        problems.append(_problem("top_k", "less_than_equal", f"{len(queries)} queries × top_k {top_k} hits, at most "
                                 f"{settings.max_total_hits} are allowed in one answer (TANDEM_MAX_TOTAL_HITS)"))
    if problems:
        raise RequestValidationError(problems)
    return queries, top_k


DEFAULT_FIELDS = ("id", "score", "title", "text")


def _options(request: SearchRequest, top_k: int, searcher: Searcher) -> SearchOptions:
    """The request's search options, checked against the bundle that will answer: 422s name the field."""
    bundle = searcher.bundle
    mode = Mode(request.mode)
    if mode is not Mode.DENSE and bundle.lexical is None:
        raise RequestValidationError([_problem("mode", "value_error", f"mode {mode.value!r} needs a lexical index; "
                                               f"bundle {searcher.version} has none (built before lexical search "
                                               "existed): rebuild it, or use mode 'dense'")])
    parsed = None
    if request.filter is not None:
        try:
            parsed = parse_filter(request.filter, frozenset(bundle.manifest.metadata_fields))
        except FilterError as exc:
            loc = ("body", "filter", *exc.path)
            raise RequestValidationError([{"loc": loc, "type": "value_error", "msg": exc.message}]) from None
    fusion = None if request.fusion is None else FusionMethod(request.fusion)
    return SearchOptions(top_k=top_k, mode=mode, offset=request.offset or 0, min_score=request.min_score,
                         fusion=fusion, alpha=request.alpha, filter=parsed)


def _hits(hits: list[Hit], fields: Sequence[str]) -> list[SearchHit]:
    out = []
    for h in hits:
        values: dict[str, Any] = {"id": h.doc.id, "score": h.score, "title": h.doc.title, "text": h.doc.text}
        if "metadata" in fields:
            values["metadata"] = h.doc.meta()
        out.append(SearchHit(**{f: values[f] for f in fields}))
    return out


def _render(single: bool, hits: list[list[Hit]], fields: Sequence[str], summary: dict[str, object],
            timing: dict[str, float]) -> Response:
    """The JSON answer, built and serialized on a worker thread: up to TANDEM_MAX_TOTAL_HITS hits with their
    texts are megabytes of work that must not stall the event loop (returning a Response skips FastAPI's
    re-validation of the model, which would run on the loop). A hit carries only the requested `fields`."""
    index, timing_ms = IndexSummary.model_validate(summary), Timing(**timing)
    body: SearchResponse | BatchSearchResponse
    if single:
        body = SearchResponse(results=_hits(hits[0], fields), index=index, timing_ms=timing_ms)
    else:
        body = BatchSearchResponse(results=[_hits(h, fields) for h in hits], index=index, timing_ms=timing_ms)
    return Response(body.model_dump_json(exclude_unset=True), media_type="application/json")


@router.post(
    "/search",
    response_model=SearchResponse | BatchSearchResponse,
    responses={
        422: {"model": ErrorBody},
        429: {"model": ErrorBody, "description": "Overloaded: retry after the Retry-After header."},
        503: {"model": ErrorBody, "description": "Not loaded yet, or the request's deadline passed."},
    },
    response_model_exclude_unset=True,  # a hit carries only the requested `fields`
)
async def search(request: SearchRequest, loader: LoaderDep, settings: SettingsDep, metrics: MetricsDep) -> Response:
    queries, top_k = _check(request, settings)  # a bad request is a 422 even while loading
    with loader.lease() as searcher:  # a hot reload closes the old searcher only after its leases end
        # Encoding and FAISS run on the engine's worker threads; the event loop only awaits.
        options = _options(request, top_k, searcher)
        outcome = await searcher.search(queries, options, settings.request_timeout_ms / 1e3)
        summary = searcher.index_summary()  # names the version that answered
    metrics.observe_timing_ms(outcome.timing_ms)
    metrics.batch_queries.observe(outcome.batch_size)
    return await run_in_threadpool(_render, request.query is not None, outcome.hits,
                                   request.fields or DEFAULT_FIELDS, summary, outcome.timing_ms)
