"""POST /v1/embeddings: request and response shapes as the OpenAI embeddings API defines them.

Clients written for OpenAI (its SDK, or anything built on it) send these fields, so the names and
the response layout follow that API; the limits are tandem's own, the same as /search's.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from service.http.schemas.common import Count, QueryText
from service.settings import MAX_BATCH_QUERIES

# Bounded before any item is validated, as /search's `queries`: a mebibyte of 350,000 wrong items would otherwise
# make pydantic build 350,000 errors, seconds holding the GIL whichever thread asks.
Texts = Annotated[list[QueryText], Field(min_length=1, max_length=MAX_BATCH_QUERIES)]


class EmbeddingsRequest(BaseModel):
    """`input` is one text or a list of texts (token-id arrays are not accepted: tandem tokenizes itself)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"input": "how do tides work", "model": "tandem"},
                                        {"input": ["how do tides work", "parse JSON"], "model": "tandem",
                                         "dimensions": 256, "encoding_format": "base64"}]},
    )

    input: QueryText | Texts = Field(
        description="A text, or a list of 1..TANDEM_MAX_BATCH_QUERIES texts; each not blank and at most "
        "TANDEM_MAX_QUERY_CHARS.",
    )
    model: StrictStr | None = Field(
        None, description="Accepted for compatibility: tandem serves one student and answers with it, whatever "
        "the name.",
    )
    dimensions: Count | None = Field(
        None, ge=1, description="Keep the first `dimensions` of the teacher's dims and renormalize (Matryoshka "
        "truncation, as index bundles do); at most the teacher's dim. Omitted: the full vector.",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: little-endian float32 bytes, base64-encoded.",
    )
    user: StrictStr | None = Field(None, description="Accepted for compatibility and ignored.")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int = Field(description="Position of the text in `input`.")
    embedding: list[float] | str = Field(description="A unit vector in the teacher's (unrotated) space; a base64 "
                                         "string with encoding_format=base64.")


class Usage(BaseModel):
    prompt_tokens: int = Field(description="Tokens the student encoded, after truncation, special tokens included.")
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str = Field(description="The served student: the request's `model` when given, else the student's "
                       "directory name.")
    usage: Usage
