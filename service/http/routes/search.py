"""POST /search: encode the queries with the student, search the bundle, return documents.

The first file of a query's path: `search` checks the request, leases the searcher in service
(service/core/loader.py) and awaits `Searcher.search` (service/core/searcher.py), whose micro-batcher
(service/core/batcher.py) encodes with `StudentEncoder.encode_counted` (models/encoders/student.py) and searches with
`search` (models/search/query.py), which calls FAISS; docs/architecture.md#the-query-path maps the modules it
runs through, in order.

One door: every POST /search is routed by FastAPI to this route. Its handler (`SearchRoute`) takes a JSON
body that parses and validates straight to `search`, past FastAPI's dependency resolution, which cost more
server CPU per search than the rest of the route (docs/results/search-door-ab.md); anything else (another
content type, a body that does not parse or validate) goes through FastAPI's own handler, so every error
keeps FastAPI's wording. Exceptions take the app's handlers either way, as for any route.

Every request is bounded before any work starts: how deep the body's JSON nests and how many values it holds, on its
bytes (service.http.body), before a parser spends time on them, and on a worker thread with the parsing and
validation when the body is large; then the batch, query lengths, hits (offset included), a lexical query's distinct
stems, the filter's size and values (models.search.filters.FilterLimits) and the rows a binary index's rescoring
would decode (models.search.rescore_rows), all from the settings.
Input never costs a 5xx: non-finite numbers and strings that are not valid Unicode are 422s naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from models.bundle.manifest import FusionMethod
from models.search import FilterError, Hit, Mode, SearchOptions, parse_filter, rescore_rows
from service.core.loader import SearcherLoader
from service.core.searcher import Searcher
from service.http.body import INLINE_BODY_BYTES, check_shape, parsed_by_fastapi, validated
from service.http.keyring import KeyScope, key_of
from service.http.schemas.common import ErrorBody
from service.http.schemas.search import BatchSearchResponse, SearchRequest, SearchResponse
from service.http.scoping import collection_for, with_key_filter
from service.metrics import Metrics
from service.settings import ServiceSettings

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class SearchRoute(APIRoute):
    """/search's route: FastAPI matches it like any other, then a JSON body that parses and validates goes
    straight to `search` with the app's settings, loader and metrics; the rest to FastAPI's handler.

    It parses and validates as FastAPI does (json.loads, then SearchRequest in Python mode). The body is read
    once: Starlette's Request keeps it for FastAPI's handler. A JSON body over INLINE_BODY_BYTES is checked, parsed
    and validated on a worker thread and refused there in FastAPI's words (service.http.body), so that FastAPI's
    handler never parses a large body on the event loop."""

    def get_route_handler(self) -> Handler:
        standard = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                raw = await request.body()
            except ClientDisconnect:  # FastAPI's handler meets it too, and answers as it always has
                return await standard(request)
            limits = request.app.state.settings.body_limits
            if len(raw) > INLINE_BODY_BYTES:  # its preparation costs time in proportion: not the event loop's
                if not parsed_by_fastapi(request.headers.get("content-type")):
                    await run_in_threadpool(check_shape, raw, limits)
                    return await standard(request)  # which refuses the bytes unparsed
                return await answer(await run_in_threadpool(validated, raw, SearchRequest, limits), request)
            check_shape(raw, limits)  # whichever handler parses it next
            body = _json_body(request, raw)
            if body is None:
                return await standard(request)
            return await answer(body, request)

        return handle


def _json_body(request: Request, raw: bytes) -> SearchRequest | None:
    """The request as `search` takes it, or None for FastAPI's handler to answer (or refuse) it."""
    content_type = request.headers.get("content-type")
    if content_type is None or content_type.split(";", 1)[0].strip().lower() != "application/json":
        return None
    try:
        return SearchRequest.model_validate(json.loads(raw))  # json as FastAPI's: orjson makes 2**70 a float
    except (ValueError, ValidationError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


router = APIRouter(tags=["search"], route_class=SearchRoute)


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
    offset = request.offset or 0  # the hits skipped are ranked all the same: they count toward the bound
    if top_k > settings.max_top_k:
        problems.append(_problem("top_k", "less_than_equal", f"top_k must be at most {settings.max_top_k}"))
    elif len(queries) * (offset + top_k) > settings.max_total_hits:
        ranked = f"(offset {offset} + top_k {top_k})" if offset else f"top_k {top_k}"
        problems.append(_problem("offset" if offset else "top_k", "less_than_equal", f"{len(queries)} queries × "
                                 f"{ranked} hits, at most {settings.max_total_hits} are allowed in one answer "
                                 "(TANDEM_MAX_TOTAL_HITS)"))
    if problems:
        raise RequestValidationError(problems)
    return queries, top_k


DEFAULT_FIELDS = ("id", "score", "title", "text")


def _options(request: SearchRequest, queries: list[str], top_k: int, searcher: Searcher,
             settings: ServiceSettings, key: KeyScope, collection: str) -> SearchOptions:
    """The request's search options, checked against the bundle that will answer: 422s name the field. The key's
    filter is ANDed in here, the one place every mode's options come from (service.http.scoping)."""
    bundle = searcher.bundle
    mode = Mode(request.mode)
    if mode is not Mode.DENSE and bundle.lexical is None:
        raise RequestValidationError([_problem("mode", "value_error", f"mode {mode.value!r} needs a lexical index; "
                                               f"bundle {searcher.version} has none (built before lexical search "
                                               "existed): rebuild it, or use mode 'dense'")])
    if mode is not Mode.DENSE:
        _check_terms(request, queries, bundle.require_lexical().analyzer.terms, settings.max_query_terms)
    parsed = None
    if request.filter is not None:
        try:
            parsed = parse_filter(request.filter, bundle.filter_fields, settings.filter_limits)
        except FilterError as exc:
            loc = ("body", "filter", *exc.path)
            raise RequestValidationError([{"loc": loc, "type": "value_error", "msg": exc.message}]) from None
    parsed = with_key_filter(parsed, key, collection, bundle.filter_fields)
    fusion = None if request.fusion is None else FusionMethod(request.fusion)
    options = SearchOptions(top_k=top_k, mode=mode, offset=request.offset or 0, min_score=request.min_score,
                            fusion=fusion, alpha=request.alpha, filter=parsed)
    _check_rescore(options, len(queries), searcher, settings.max_rescore_rows)
    return options


def _check_rescore(options: SearchOptions, queries: int, searcher: Searcher, limit: int) -> None:
    """A 422 for a request whose binary rescoring would decode more than `limit` stored vectors (the pool grows
    with offset + top_k times the oversample, per query and segment), before any work."""
    if (rows := rescore_rows(searcher.bundle, options, queries, searcher.oversample)) > limit:
        where = "offset" if options.offset else "top_k"
        raise RequestValidationError([_problem(where, "less_than_equal", f"this request would rescore {rows} "
                                               f"binary candidates ((offset {options.offset} + top_k "
                                               f"{options.top_k}) × the oversample, for each of {queries} "
                                               "query(ies) in each segment), at most "
                                               f"{limit} are allowed (TANDEM_MAX_RESCORE_ROWS)")])


def _check_terms(request: SearchRequest, queries: list[str], terms: Callable[[str], Mapping[str, int]],
                 limit: int) -> None:
    """A 422 for a lexical query of more than `limit` distinct stems: BM25 reads each one's postings in every
    segment (a repeated word is one stem, scored once)."""
    for i, query in enumerate(queries):
        if (count := len(terms(query))) > limit:
            where = "query" if request.query is not None else f"queries.{i}"
            raise RequestValidationError([_problem(where, "too_long", f"query has {count} distinct terms, at most "
                                                   f"{limit} are allowed in lexical and hybrid modes "
                                                   "(TANDEM_MAX_QUERY_TERMS)")])


INLINE_RENDER_HITS = 100  # answers with more hits are serialized on a worker thread, off the event loop


def _hit(h: Hit, fields: Sequence[str]) -> dict[str, Any]:
    doc = h.doc
    values: dict[str, Any] = {"id": doc.id, "score": h.score, "title": doc.title, "text": doc.text}
    if fields is DEFAULT_FIELDS:  # most requests: the hit as it is, no fields to pick
        return values
    if "metadata" in fields:
        values["metadata"] = doc.meta()
    return {f: values[f] for f in fields}


def _render(single: bool, hits: list[list[Hit]], fields: Sequence[str], summary: Mapping[str, object],
            timing: dict[str, float]) -> Response:
    """The JSON answer of SearchResponse's (or BatchSearchResponse's) shape, serialized once by orjson from plain
    dicts, without building the pydantic models and validating them again
    (docs/decisions.md#answers-rendered-once-by-orjson); tests/service/api/test_service_api.py checks the answers
    against the models.
    A hit carries only the requested `fields`."""
    results: list[Any] = ([_hit(h, fields) for h in hits[0]] if single
                          else [[_hit(h, fields) for h in query_hits] for query_hits in hits])
    body = {"results": results, "index": summary, "timing_ms": timing}
    try:
        content = orjson.dumps(body)
    except orjson.JSONEncodeError:  # metadata holding an integer past 64 bits, which the json module writes
        content = json.dumps(body, ensure_ascii=False).encode()
    return Response(content, media_type="application/json")


_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody},
    429: {"model": ErrorBody, "description": "Overloaded: retry after the Retry-After header."},
    503: {"model": ErrorBody, "description": "Not loaded yet, or the request's deadline passed."},
}


@router.post(
    "/search",
    response_model=SearchResponse | BatchSearchResponse,
    responses={**_RESPONSES, 404: {"model": ErrorBody, "description": "Several collections and none named "
                                   "'default', or the key may not see the default collection."}},
    response_model_exclude_unset=True,  # a hit carries only the requested `fields`
)
async def search(request: SearchRequest, http: Request) -> Response:
    """Search the default collection (the only one, or the one named 'default')."""
    return await answer(request, http)


@router.post(
    "/collections/{name}/search",
    response_model=SearchResponse | BatchSearchResponse,
    responses={**_RESPONSES, 404: {"model": ErrorBody, "description": "No such collection, or one the key may not "
                                   "see (the same answer)."}},
    response_model_exclude_unset=True,
)
async def collection_search(name: str, request: SearchRequest, http: Request) -> Response:
    """Search collection `name`, with its student; a scoped key's filter is ANDed into the request's."""
    return await answer(request, http)


async def answer(request: SearchRequest, http: Request) -> Response:
    """The search of the collection the path names (/collections/{name}/search), or of the default one (/search),
    as the request's key may see it."""
    state = http.app.state
    key = key_of(http)
    collection = collection_for(state.collections, http.path_params.get("name"), key)  # 404: not served, or not its
    state.metrics.collection_searches.labels(collection.name).inc()
    return await search_in(request, collection.loader, state.settings, state.metrics, key, collection.name)


async def search_in(request: SearchRequest, loader: SearcherLoader, settings: ServiceSettings, metrics: Metrics,
                    key: KeyScope, collection: str) -> Response:
    queries, top_k = _check(request, settings)  # a bad request is a 422 even while loading
    with loader.lease() as searcher:  # a hot reload closes the old searcher only after its leases end
        # Encoding and FAISS run on the searcher's batch workers (or between the loop's I/O rounds with workers 0).
        options = _options(request, queries, top_k, searcher, settings, key, collection)
        outcome = await searcher.search(queries, options, settings.request_timeout_ms / 1e3, key.partition)
        summary = searcher.index_summary()  # names the version that answered
    metrics.observe_timing_ms(outcome.timing_ms)
    metrics.batch_queries.observe(outcome.batch_size)
    args = (request.query is not None, outcome.hits, request.fields or DEFAULT_FIELDS, summary, outcome.timing_ms)
    if sum(len(h) for h in outcome.hits) <= INLINE_RENDER_HITS:
        return _render(*args)  # tens of microseconds: cheaper than a hand-off to a thread and back
    # up to TANDEM_MAX_TOTAL_HITS hits with their texts are megabytes of work that must not stall the event loop
    return await run_in_threadpool(_render, *args)
