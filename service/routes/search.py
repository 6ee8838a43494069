"""POST /search: encode the queries with the student, search the bundle, return documents.

The first of a query's four files, route → engine → student → the bundle's search: `search` checks the
request and awaits `Searcher.search` (service/engine.py), whose worker encodes with
`StudentEncoder.encode_counted` (models/student.py) and searches with `retrieve` (models/retrieve.py),
which calls FAISS.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from models.manifest import FusionMethod
from models.search import FilterError, Hit, Mode, SearchOptions, parse_filter
from service.deps import LoaderDep, MetricsDep, SettingsDep
from service.engine import Searcher
from service.middleware import header
from service.schemas.common import ErrorBody
from service.schemas.search import BatchSearchResponse, SearchRequest, SearchResponse
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


INLINE_RENDER_HITS = 100  # answers with more hits are serialized on a worker thread, off the event loop


def _hit(h: Hit, fields: Sequence[str]) -> dict[str, Any]:
    values: dict[str, Any] = {"id": h.doc.id, "score": h.score, "title": h.doc.title, "text": h.doc.text}
    if "metadata" in fields:
        values["metadata"] = h.doc.meta()
    return {f: values[f] for f in fields}


def _render(single: bool, hits: list[list[Hit]], fields: Sequence[str], summary: Mapping[str, object],
            timing: dict[str, float]) -> Response:
    """The JSON answer of SearchResponse's (or BatchSearchResponse's) shape, serialized once by orjson from plain
    dicts, without building the pydantic models and validating them again (docs/BENCHMARKS.md, "The request
    path"); tests/service/test_service_api.py checks the answers against the models.
    A hit carries only the requested `fields`."""
    results: list[Any] = ([_hit(h, fields) for h in hits[0]] if single
                          else [[_hit(h, fields) for h in query_hits] for query_hits in hits])
    body = {"results": results, "index": summary, "timing_ms": timing}
    try:
        content = orjson.dumps(body)
    except orjson.JSONEncodeError:  # metadata holding an integer past 64 bits, which the json module writes
        content = json.dumps(body, ensure_ascii=False).encode()
    return Response(content, media_type="application/json")


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
    args = (request.query is not None, outcome.hits, request.fields or DEFAULT_FIELDS, summary, outcome.timing_ms)
    if sum(len(h) for h in outcome.hits) <= INLINE_RENDER_HITS:
        return _render(*args)  # tens of microseconds: cheaper than a hand-off to a thread and back
    # up to TANDEM_MAX_TOTAL_HITS hits with their texts are megabytes of work that must not stall the event loop
    return await run_in_threadpool(_render, *args)


class SearchShortcut:
    """POST /search with a JSON body, straight to `search` above, past FastAPI's routing, dependency resolution
    and exception middleware; the innermost middleware, so request ids, access log, metrics, CORS, the body
    limit and API keys apply as to every route.

    Why: on the 2-core machine a minimal FastAPI app cost 0.17 ms of CPU per request more than a bare ASGI app,
    and this shortcut saved 0.13 ms of the server's CPU per search, 4% (docs/BENCHMARKS.md, "The request
    path"). It parses and validates as FastAPI does (json.loads, then SearchRequest in Python mode) and answers
    errors with the app's own exception handlers. Whatever it does not take as it is (another content type, a
    body that does not parse or validate) it hands to FastAPI's route, body included, so every error keeps
    FastAPI's wording.
    """

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app, self.fastapi_app = app, fastapi_app
        # what the router would set: the request middleware labels metrics with the route's template
        self.route = next(r for r in router.routes if getattr(r, "path", None) == "/search")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/search" or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        request = _parse(messages)
        if request is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"] = self.route
        state = self.fastapi_app.state
        try:
            response = await search(request, loader=state.loader, settings=state.settings, metrics=state.metrics)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # the request middleware answers the generic 500 and logs the traceback
            response = handler(Request(scope, receive), exc)
            if inspect.isawaitable(response):  # Starlette allows plain functions as handlers too
                response = await response
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Any:
        """The app's handler for this exception's class or its nearest base (Exception's is the server's)."""
        for kind in type(exc).__mro__:
            if kind is Exception:
                return None
            if (handler := self.fastapi_app.exception_handlers.get(kind)) is not None:
                return handler
        return None


def _is_json(scope: Scope) -> bool:
    content_type = header(scope, b"content-type")
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/json"


def _parse(messages: list[Message]) -> SearchRequest | None:
    if messages[-1]["type"] != "http.request":
        return None  # the client left: FastAPI's route sees it
    try:
        body = json.loads(b"".join(m.get("body", b"") for m in messages))  # as FastAPI's: orjson makes 2**70 a float
        return SearchRequest.model_validate(body)
    except (ValueError, ValidationError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
