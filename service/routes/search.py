"""POST /search: encode the query with the student, search the bundle, return documents."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from service.deps import LoaderDep, SettingsDep
from service.schemas import ErrorBody, IndexSummary, SearchHit, SearchRequest, SearchResponse, Timing
from service.settings import ServiceSettings

router = APIRouter(tags=["search"])


def _check_bounds(request: SearchRequest, settings: ServiceSettings) -> int:
    """The limits that depend on settings; returns the effective top_k."""
    problems = []
    if len(request.query) > settings.max_query_chars:
        problems.append({"loc": ("body", "query"), "type": "string_too_long",
                         "msg": f"query has {len(request.query)} characters, at most {settings.max_query_chars} "
                                "are allowed"})
    top_k = settings.default_top_k if request.top_k is None else request.top_k
    if top_k > settings.max_top_k:
        problems.append({"loc": ("body", "top_k"), "type": "less_than_equal",
                         "msg": f"top_k must be at most {settings.max_top_k}"})
    if problems:
        raise RequestValidationError(problems)
    return top_k


@router.post("/search", response_model=SearchResponse,
             responses={422: {"model": ErrorBody}, 503: {"model": ErrorBody, "description": "Not loaded yet."}})
async def search(request: SearchRequest, loader: LoaderDep, settings: SettingsDep) -> SearchResponse:
    top_k = _check_bounds(request, settings)  # a bad request is a 422 even while loading
    searcher = loader.searcher()
    # Encoding and FAISS are CPU-bound and release the GIL: run them off the event loop.
    outcome = await run_in_threadpool(searcher.search, request.query, top_k)
    return SearchResponse(
        results=[SearchHit(id=h.doc.id, score=h.score, title=h.doc.title, text=h.doc.text) for h in outcome.hits],
        index=IndexSummary.model_validate(searcher.bundle.manifest.summary()),
        timing_ms=Timing(**outcome.timing_ms),
    )
