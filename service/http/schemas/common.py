"""Types every route shares: query text and counts as requests carry them, the error body, the probes' answers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

from models.search.filters import valid_text


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank_query", "query must not be empty or whitespace-only")
    if not valid_text(value):  # JSON's \ud800 escape: valid JSON, but no UTF-8 (the tokenizer, the logs) holds it
        raise PydanticCustomError("invalid_unicode", "query must be valid Unicode: it holds a lone surrogate")
    return value


QueryText = Annotated[StrictStr, AfterValidator(_not_blank)]


def _whole_number(value: object) -> object:
    # JSON does not tell 10 from 10.0 (JSON Schema calls both integers); 2.5, "10" and true stay 422s.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Count = Annotated[StrictInt, BeforeValidator(_whole_number)]


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["loading", "ready", "failed"]
    error: str | None = None


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    """Every non-2xx answer has this shape; `details` lists per-field problems of a 422."""

    error: str = Field(description="Machine-readable code, e.g. invalid_request, not_ready, internal.")
    message: str
    details: list[FieldError] | None = None
