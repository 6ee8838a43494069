"""A JSON request body as a route takes it: its shape checked, parsed and validated, off the event loop when large.

Every step is linear in the body's bytes, none is free, and on the event loop their time is every other request's,
/healthz included: json.loads of a mebibyte of `[],` takes 0.2 to 1.2 s on a loaded core, pydantic refusing its
350,000 items as texts seconds more. Two bounds keep that from any request:
- The shape, on the bytes (`check_shape`, one linear scan, service.http.json_depth): how deep the JSON nests and
  how many values it holds, against limits from the settings (`ServiceSettings.body_limits`). A thread alone would
  not do: json.loads and pydantic hold the GIL from the first value to the last, so the event loop waits for them
  whichever thread they run on. Past the value cap, a body is refused before either starts; under it, each costs
  at most a few milliseconds.
- Where it runs: a body over INLINE_BODY_BYTES is checked, parsed and validated on a worker thread (Starlette's
  thread pool), so that the scan's numpy passes, which release the GIL between chunks, and the parse leave the
  event loop free between them. One at most INLINE_BODY_BYTES runs inline: bounded by its size to a few
  milliseconds whatever it holds, and spared the hand-off to a thread, which would cost a typical search body of a
  few hundred bytes more latency than its parse (docs/operations.md#bodies).

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
from service.settings import BodyLimits

INLINE_BODY_BYTES = 8 << 10
Model = TypeVar("Model", bound=BaseModel)


def check_shape(raw: bytes, limits: BodyLimits) -> None:
    """A 422 for a body nested deeper than `limits.depth`, before json.loads or pydantic recurse into it; for one
    holding more than `limits.values` JSON values, before json.loads and pydantic spend time on each (they hold the
    GIL all along, whichever thread runs them); for one whose string never closes, once its brackets are counted.
    Linear in `raw` whatever it holds (service.http.json_depth); a body with at most `limits.depth` brackets and
    `limits.values` commas costs three `bytes.count` calls."""
    opening = raw.count(b"[") + raw.count(b"{")
    if opening <= limits.depth and opening + raw.count(b",") < limits.values:
        return
    found = scan(raw)
    if found.depth > limits.depth:
        raise RequestValidationError([{"loc": ("body",), "type": "too_deep", "msg": f"the body's JSON nests "
                                       f"{found.depth} levels deep, at most {limits.depth} are allowed "
                                       "(TANDEM_MAX_FILTER_DEPTH)"}])
    if found.values > limits.values:
        raise RequestValidationError([{"loc": ("body",), "type": "too_long", "msg": f"the body's JSON holds "
                                       f"{found.values} values, at most {limits.values} are allowed (twice a full "
                                       "batch and a filter at its caps: TANDEM_MAX_BATCH_QUERIES, "
                                       "TANDEM_MAX_FILTER_VALUES, TANDEM_MAX_FILTER_CONDITIONS)"}])
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


def validated(raw: bytes, model: type[Model], limits: BodyLimits) -> Model:
    """`raw` as a `model`, or the 4xx FastAPI's handler would answer for it (its JSON's shape first)."""
    check_shape(raw, limits)
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
