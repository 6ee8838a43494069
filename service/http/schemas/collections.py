"""GET /collections: the collections a key may see, each with its state and the version it serves."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class CollectionSummary(BaseModel):
    name: str = Field(description="Searched at POST /collections/{name}/search.")
    state: Literal["loading", "ready", "failed"]
    error: str | None = Field(None, description="Why it failed to load (the others serve meanwhile).")
    default: bool = Field(description="Whether POST /search and GET /index answer for it.")
    student: str = Field(description="Its student's name: /v1/embeddings' `model` for this collection.")
    version: str | None = Field(None, description="The bundle version in service (null until loaded).")
    count: int | None = Field(None, description="Its live documents (null until loaded).")


class CollectionList(BaseModel):
    collections: list[CollectionSummary]
