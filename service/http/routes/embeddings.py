"""POST /v1/embeddings: the student as a query encoder for applications with their own vector database.

They store the teacher's document vectors (an index export) and need query vectors in the same
space. The texts go through the same limits, admission control and micro-batches as /search and
skip only the index: the vectors are the student's, in the teacher's space, never rotated (a
bundle's PCA rotation is internal to its FAISS index).

The route needs only a QueryEncoder (service.core.searcher), the student behind admission and batching
(service.core.batcher), never a bundle; the loader lends it the encoder of the searcher in service, so embed
jobs keep sharing /search's micro-batches and admission.

A body's JSON is bounded in depth and values on its bytes before it is parsed, and one over INLINE_BODY_BYTES is
checked, parsed, validated and its texts checked on a worker thread (`EmbeddingsRoute`, service.http.body): a
mebibyte of `[],` cost a second of json.loads and pydantic refusing every item, every other request's time on the
event loop. A smaller one goes through FastAPI as any route, after the same shape check.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from models.contract import truncate
from service.core.loader import SearcherLoader
from service.http.body import INLINE_BODY_BYTES, check_shape, parsed_by_fastapi, validated
from service.http.keyring import key_of
from service.http.schemas.common import ErrorBody
from service.http.schemas.embeddings import Embedding, EmbeddingsRequest, EmbeddingsResponse, Usage
from service.http.scoping import collection_for
from service.metrics import Metrics
from service.settings import ServiceSettings

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class EmbeddingsRoute(APIRoute):
    """/v1/embeddings' route: a body nested too deep or holding too many values is a 422 before any parser sees
    it; a large JSON body is prepared on a worker thread and answered here, anything else by FastAPI's handler."""

    def get_route_handler(self) -> Handler:
        standard = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                raw = await request.body()
            except ClientDisconnect:
                return await standard(request)
            settings: ServiceSettings = request.app.state.settings
            if len(raw) <= INLINE_BODY_BYTES:
                check_shape(raw, settings.body_limits)
                return await standard(request)
            if not parsed_by_fastapi(request.headers.get("content-type")):
                await run_in_threadpool(check_shape, raw, settings.body_limits)
                return await standard(request)  # which refuses the bytes unparsed
            body, texts = await run_in_threadpool(_prepared, raw, settings)
            response = await answer(body, texts, request)
            return JSONResponse(response.model_dump(mode="json", by_alias=True), status_code=self.status_code or 200)

        return handle


def _prepared(raw: bytes, settings: ServiceSettings) -> tuple[EmbeddingsRequest, list[str]]:
    request = validated(raw, EmbeddingsRequest, settings.body_limits)
    return request, _texts(request, settings)


router = APIRouter(tags=["embeddings"], route_class=EmbeddingsRoute)


def problem(field: str, kind: str, message: str) -> dict[str, Any]:
    return {"loc": ("body", field), "type": kind, "msg": message}


def _texts(request: EmbeddingsRequest, settings: ServiceSettings) -> list[str]:
    """The limits /search applies, named by the OpenAI field."""
    texts = [request.input] if isinstance(request.input, str) else request.input
    problems = []
    if len(texts) > settings.max_batch_queries:
        problems.append(problem("input", "too_long", f"{len(texts)} texts, at most {settings.max_batch_queries} "
                                "are allowed in one request"))
    for i, text in enumerate(texts):
        if len(text) > settings.max_query_chars:
            where = "input" if isinstance(request.input, str) else f"input.{i}"
            problems.append(problem(where, "string_too_long", f"text has {len(text)} characters, at most "
                                    f"{settings.max_query_chars} are allowed"))
    if problems:
        raise RequestValidationError(problems)
    return texts


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def _loader(model: str | None, http: Request) -> SearcherLoader:
    """The loader whose student `model` names among the collections the key may see: with one collection, that
    one whatever `model` says (as before collections); a key without `embeddings` is a 403."""
    key = key_of(http)
    if not key.embeddings:
        raise HTTPException(403, f"key {key.id!r} may not call /v1/embeddings")
    collections = http.app.state.collections
    if len(collections) == 1 or model is None:
        return collection_for(collections, None, key).loader
    for collection in collections:
        if key.sees(collection.name) and model in (collection.name, collection.settings.student.name):
            return collection.loader
    raise HTTPException(404, f"no model named {model!r}: name a collection's student (GET /collections)")


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingsResponse,
    responses={
        403: {"model": ErrorBody, "description": "The key may not call /v1/embeddings."},
        404: {"model": ErrorBody, "description": "No collection's student of that name the key may see."},
        422: {"model": ErrorBody},
        429: {"model": ErrorBody, "description": "Overloaded: retry after the Retry-After header."},
        503: {"model": ErrorBody, "description": "Not loaded yet, or the request's deadline passed."},
    },
)
async def embeddings(request: EmbeddingsRequest, http: Request) -> EmbeddingsResponse:
    """OpenAI-compatible embeddings of queries, in the teacher's space (cosine with its document vectors); with
    several collections, `model` names a collection's student (or the collection)."""
    return await answer(request, _texts(request, http.app.state.settings), http)  # a 422 even while loading


async def answer(request: EmbeddingsRequest, texts: list[str], http: Request) -> EmbeddingsResponse:
    """The embeddings of `texts`, the request's checked texts."""
    settings: ServiceSettings = http.app.state.settings
    metrics: Metrics = http.app.state.metrics
    loader = _loader(request.model, http)
    with loader.lease_encoder() as encoder:  # the student alone: no bundle is touched
        if request.dimensions is not None and request.dimensions > encoder.dim:
            raise RequestValidationError([problem("dimensions", "less_than_equal",
                                                  f"dimensions must be at most {encoder.dim}, the teacher's dim")])
        outcome = await encoder.embed(texts, settings.request_timeout_ms / 1e3, key_of(http).partition)
        name = encoder.name
    metrics.observe_timing_ms({k: outcome.timing_ms[k] for k in ("queue", "encode")})
    metrics.batch_queries.observe(outcome.batch_size)
    assert outcome.vectors is not None and outcome.tokens is not None  # an encode-only job carries both
    vectors = outcome.vectors if request.dimensions is None else truncate(outcome.vectors, request.dimensions)
    data = [Embedding(index=i, embedding=_encode(v, request.encoding_format)) for i, v in enumerate(vectors)]
    tokens = sum(outcome.tokens)
    return EmbeddingsResponse(data=data, model=request.model or name,
                              usage=Usage(prompt_tokens=tokens, total_tokens=tokens))
