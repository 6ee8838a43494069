"""One JSON error shape for every failure; clients never see a traceback.

Validation problems become 422 with one line per field, an overloaded service 429, a
service that is not ready or a request past its deadline 503, and anything unexpected a
generic 500 (the server logs the traceback).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.engine import DeadlineExceeded, Overloaded
from service.loader import LoadState, NotReady
from service.schemas.common import ErrorBody, FieldError

log = logging.getLogger(__name__)

_LOCATIONS = {"body", "query", "path", "header", "cookie"}
MAX_REPORTED_ERRORS = 10  # a 422 lists this many problems, then how many more: its size stays bounded


def error_response(status: int, code: str, message: str, details: list[FieldError] | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, message=message, details=details)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


def field_errors(errors: Sequence[Any]) -> list[FieldError]:
    """Pydantic/FastAPI error dicts → `field: message`, without echoing the (possibly huge) input."""
    out = []
    for err in errors[:MAX_REPORTED_ERRORS]:
        loc = [str(part) for part in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            loc = loc[:1]  # the rest is a character offset, not a field
        elif len(loc) > 1 and loc[0] in _LOCATIONS:
            loc = loc[1:]
        out.append(FieldError(field=".".join(loc) or "body", message=str(err.get("msg", "invalid value"))[:200]))
    if len(errors) > MAX_REPORTED_ERRORS:
        out.append(FieldError(field="body", message=f"and {len(errors) - MAX_REPORTED_ERRORS} more problems"))
    return out


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
    async def _deadline(request: Request, exc: DeadlineExceeded) -> JSONResponse:
        return error_response(503, "deadline_exceeded", f"the request timed out: {exc}",
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
