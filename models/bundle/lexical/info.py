"""What a version's manifest says of its BM25 index, and where a segment keeps it.

The lexical engine owns its part of the manifest (models.bundle.manifest composes it), so the engine reads and
writes its files without importing the version's manifest above it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

LEXICAL_SUBDIRECTORY = "lexical"  # the BM25 index (models.bundle.lexical.postings writes it)


class LexicalInfo(BaseModel):
    """The BM25 index over the passages the teacher saw (files under lexical/, listed in `files`)."""

    engine: Literal["bm25s", "postings"] = Field(
        default="bm25s", description="postings: per-segment postings scored at query time with the version's "
        "statistics; bm25s: bundles built before segments (scores precomputed, one segment only)")
    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75
    stemmer: str = Field(default="english", description="PyStemmer algorithm; queries are stemmed alike")
    stopwords: str = "en"
    vocab: int = 0
    documents: int | None = Field(default=None, description="postings: the rows the segment indexed")
    total_length: int | None = Field(default=None, description="postings: the stems of all its rows (average length)")
