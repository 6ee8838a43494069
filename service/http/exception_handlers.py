"""Which exception becomes which error: the app's exception handlers, all answering with service.http.errors.

Validation problems become 422 with one line per field, an overloaded service 429, a
service that is not ready or a request past its deadline 503, and anything unexpected a
generic 500 (the server logs the traceback).
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from models.errors import DeadlineExceeded as SearchDeadlineExceeded
from models.search.shards import ShardUnavailable
from service.core.batcher import DeadlineExceeded, Overloaded
from service.core.loader import LoadState, NotReady
from service.http.errors import error_response, field_errors

log = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = field_errors(exc.errors())
        message = "; ".join(f"{d.field}: {d.message}" for d in details)
        return error_response(422, "invalid_request", message, details)

    @app.exception_handler(NotReady)
    async def _not_ready(request: Request, exc: NotReady) -> JSONResponse:
        if exc.state is LoadState.FAILED:
            return error_response(503, "not_ready", f"the index or the student failed to load: {exc.error}")
        return error_response(503, "not_ready", "the index and the student are still loading",
                               headers={"Retry-After": "1"})

    @app.exception_handler(Overloaded)
    async def _overloaded(request: Request, exc: Overloaded) -> JSONResponse:
        return error_response(429, "overloaded", f"too many queries in flight ({exc}); retry shortly",
                              headers={"Retry-After": "1"})

    @app.exception_handler(DeadlineExceeded)
    @app.exception_handler(SearchDeadlineExceeded)  # a search that stopped between segments or stages
    async def _deadline(request: Request, exc: Exception) -> JSONResponse:
        return error_response(503, "deadline_exceeded", f"the request timed out: {exc}",
                              headers={"Retry-After": "1"})

    @app.exception_handler(ShardUnavailable)  # `serve --cluster`: a shard gave no answer; never a partial one
    async def _shard_unavailable(request: Request, exc: ShardUnavailable) -> JSONResponse:
        return error_response(503, "shard_unavailable", f"a shard of the index did not answer: {exc}",
                              headers={"Retry-After": "1"})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        except ValueError:
            code = "http_error"
        return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after this response, so the server logs the traceback once.
        log.error("unexpected %s on %s %s", type(exc).__name__, request.method, request.url.path)
        return error_response(500, "internal", "internal server error")
