"""A JSON request body as a route takes it: nesting checked, parsed and validated, off the event loop when large.

Every step is linear in the body's bytes, none is free, and on the event loop their time is every other request's,
/healthz included: json.loads of a mebibyte of `[],` takes about 200 ms, pydantic refusing its 350,000 items as
texts about 300 ms more. So a body over INLINE_BODY_BYTES is prepared on a worker thread (Starlette's thread
pool), and one at most INLINE_BODY_BYTES inline: at the worst cost per byte measured for any of these steps (about
0.5 µs on a loaded core) that is at most a few milliseconds, less than the thread hand-off costs a typical search
body of a few hundred bytes in latency, and bounded whatever the bytes hold (docs/operations.md#bodies).

A body prepared here is refused in FastAPI's own words (`json_invalid` at a character offset, pydantic's errors
under `body`), so a request answers the same whichever size it is.
"""

from __future__ import annotations

import email.message
import json
from typing import TypeVar

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from service.http.json_depth import scan

INLINE_BODY_BYTES = 8 << 10
Model = TypeVar("Model", bound=BaseModel)


def check_nesting(raw: bytes, limit: int) -> None:
    """A 422 for a body nested deeper than `limit`, before json.loads or pydantic recurse into it, or whose
    brackets are counted to find that a string never closes. Linear in `raw` whatever it holds
    (service.http.json_depth); a body with at most `limit` brackets costs two `bytes.count` calls."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    found = scan(raw)
    if found.depth > limit:
        raise RequestValidationError([{"loc": ("body",), "type": "too_deep", "msg": f"the body's JSON nests "
                                       f"{found.depth} levels deep, at most {limit} are allowed "
                                       "(TANDEM_MAX_FILTER_DEPTH)"}])
    if found.open_string_at is not None:
        raise RequestValidationError([{"loc": ("body",), "type": "json_invalid", "msg": "the body's JSON has a "
                                       f"string that never closes: it opens at byte {found.open_string_at}"}])


def parsed_by_fastapi(content_type: str | None) -> bool:
    """Whether FastAPI's handler would json.loads a body of this type (application/json or any +json; none when
    the type is missing, its strict default), on the event loop."""
    if content_type is None:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def validated(raw: bytes, model: type[Model], limit: int) -> Model:
    """`raw` as a `model`, or the 4xx FastAPI's handler would answer for it (its JSON nesting first)."""
    check_nesting(raw, limit)
    try:
        value = json.loads(raw)  # json as FastAPI's: orjson makes 2**70 a float
    except json.JSONDecodeError as exc:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": exc.msg}}]) from exc
    except (ValueError, RecursionError) as exc:  # not UTF-8; FastAPI answers any other failure so
        raise HTTPException(400, "There was an error parsing the body") from exc
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])}
                                      for error in exc.errors(include_url=False)]) from exc
