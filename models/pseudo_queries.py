"""Pseudo-queries cut from a document: its title, single sentences, spans of 5–20 words.

They stand in for query logs wherever tandem needs query-like text without one: training the student
(models.distill.texts.data) and the agreement sample the indexer keeps per segment (models.agreement). One generator
for both, so the sample asks the student the kind of query it was trained on. A pure function of the document
and the random generator.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from models.corpus import Document

SPAN_WORDS = (5, 20)
SENTENCE_WORDS = (4, 32)  # shorter is not a query; longer sentences are cropped
_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])(?:\s*\n\s*|\s+(?=[\"'(\[A-Z0-9]))")


def clean(text: str) -> str:
    return " ".join(text.split())


def sentences(text: str) -> list[str]:
    """Sentences of each paragraph (blank-line separated, as in docstrings), cropped to a query's length."""
    out = []
    for raw in (s for paragraph in _PARAGRAPH.split(text) for s in _SENTENCE_END.split(paragraph)):
        words = raw.split()
        if len(words) >= SENTENCE_WORDS[0]:
            out.append(" ".join(words[: SENTENCE_WORDS[1]]))
    return out


def span(words: Sequence[str], rng: random.Random) -> str:
    length = rng.randint(SPAN_WORDS[0], min(SPAN_WORDS[1], len(words)))
    start = rng.randint(0, len(words) - length)
    return " ".join(words[start : start + length])


def pseudo_queries(doc: Document, count: int, rng: random.Random) -> list[str]:
    """Up to `count` query-like texts from one document: its title, then sentences and spans in turn."""
    out = [clean(doc.title)] if doc.title.strip() else []
    pool = sentences(doc.text)
    rng.shuffle(pool)
    words = doc.text.split()
    for attempt in range(4 * count):
        if len(out) >= count:
            break
        if pool and (attempt % 2 == 0 or len(words) < SPAN_WORDS[0]):
            out.append(pool.pop())
        elif len(words) >= SPAN_WORDS[0]:
            out.append(span(words, rng))
        else:
            break
    return out[:count]
