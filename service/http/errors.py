"""One JSON error shape for every failure (ErrorBody); clients never see a traceback.

`error_response` is how every part of the HTTP layer answers an error, middleware and auth included;
which exception becomes which status is service.http.exception_handlers'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from service.http.schemas.common import ErrorBody, FieldError

_LOCATIONS = {"body", "query", "path", "header", "cookie"}
MAX_REPORTED_ERRORS = 10  # a 422 lists this many problems, then how many more: its size stays bounded


def printable(text: str) -> str:
    """`text` as UTF-8 can carry it: a lone surrogate from a request's JSON (a key named in a 422) is written as its
    escape, instead of failing the answer's encoding."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(status: int, code: str, message: str, details: list[FieldError] | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, message=printable(message), details=details)
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
        out.append(FieldError(field=printable(".".join(loc) or "body"),
                              message=printable(str(err.get("msg", "invalid value"))[:200])))
    if len(errors) > MAX_REPORTED_ERRORS:
        out.append(FieldError(field="body", message=f"and {len(errors) - MAX_REPORTED_ERRORS} more problems"))
    return out


class CollectionNotFound(HTTPException):
    def __init__(self, name: str) -> None:
        super().__init__(404, f"no collection named {name!r}")


class NoDefaultCollection(HTTPException):
    def __init__(self) -> None:
        super().__init__(404, "this service serves several collections and none is named 'default': name one, "
                              "e.g. POST /collections/{name}/search (GET /collections lists them)")
