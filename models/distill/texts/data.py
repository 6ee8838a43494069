"""Training text from an unlabeled corpus: passages plus pseudo-queries cut from them.

Pseudo-queries (titles, single sentences, spans of 5–20 words) stand in for query logs,
which the student sees at serving time. Cropped and masked variants of them (EmbedDistill's
task-specific data generation, without a generator model) fill the space around each query,
so the student stays aligned for the paraphrases and fragments real users type. Masking
deletes words rather than inserting a mask token, because teacher and student tokenizers
spell the mask differently. Validation holds out whole documents, so no sentence or span of a
validation document is ever trained on. Everything is a pure function of (corpus, preset, seed).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from models.corpus import Document
from models.distill.presets import Preset
from models.errors import InputError
from models.pseudo_queries import clean, pseudo_queries

CROP_FRACTION = (0.5, 0.8)  # a cropped variant keeps this share of the words, contiguous
MASK_RATE = 0.15  # a masked variant drops each word with this probability
MIN_VARIANT_WORDS = 3
VAL_FRACTION = 0.1


def variants(query: str, rng: random.Random) -> list[str]:
    """A cropped and a masked variant of a query, where it has enough words to stay a query."""
    words = query.split()
    if len(words) < 2 * MIN_VARIANT_WORDS:
        return []
    keep = max(MIN_VARIANT_WORDS, round(len(words) * rng.uniform(*CROP_FRACTION)))
    start = rng.randint(0, len(words) - keep)
    cropped = " ".join(words[start : start + keep])
    kept = [w for w in words if rng.random() >= MASK_RATE]
    masked = " ".join(kept) if len(kept) >= MIN_VARIANT_WORDS else ""
    return [v for v in (cropped, masked) if v and v != query]


@dataclass(frozen=True)
class Split:
    """Corpus rows whose passages are training text, and query texts (pseudo or real)."""

    passages: list[int]
    queries: list[str]
    real: int = 0  # the last `real` queries are real (train-split) queries, not pseudo-queries

    def __len__(self) -> int:
        return len(self.passages) + len(self.queries)


@dataclass(frozen=True)
class TrainingData:
    train: Split
    val: Split


class _Dedupe:
    """Keeps the first occurrence of each text (whitespace- and case-insensitive: both models are uncased)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def admit(self, text: str) -> bool:
        key = clean(text).casefold()
        if not key or key in self.seen:
            return False
        self.seen.add(key)
        return True


def build_training_data(
    docs: Sequence[Document], preset: Preset, seed: int, extra_queries: Iterable[str] = (), member: int = 0
) -> TrainingData:
    """Split documents into train/validation and derive each side's texts; no text is on both sides.

    Member m > 0 of a soup (Preset.members) keeps member 0's validation side, passages and
    real queries, and cuts its own training pseudo-queries from the same training documents,
    so the members differ in what they learn from while one validation set judges them all.
    """
    if len(docs) < 2:
        raise InputError("the corpus needs at least 2 documents to hold one out for validation")
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    n_val = max(1, min(preset.val_docs, round(len(docs) * VAL_FRACTION)))
    val_rows, train_rows = order[:n_val], sorted(order[n_val:])
    dedupe = _Dedupe()
    splits: dict[str, Split] = {}
    for name, rows in (("val", val_rows), ("train", train_rows)):
        split = Split(passages=[], queries=[])
        for row in rows:
            doc = docs[row]
            if dedupe.admit(doc.passage()):
                split.passages.append(row)
            split.queries.extend(q for q in _doc_queries(doc, preset, f"{seed}", name == "train") if dedupe.admit(q))
        splits[name] = split
    splits["train"] = _capped(splits["train"], preset, rng)
    extra = [clean(q) for q in extra_queries]
    rng.shuffle(extra)
    n_extra_val = round(len(extra) * VAL_FRACTION)
    for name, part in (("val", extra[:n_extra_val]), ("train", extra[n_extra_val:])):
        real = [q for q in part if dedupe.admit(q)]
        splits[name] = Split(splits[name].passages, splits[name].queries + real, real=len(real))
    if member:
        splits["train"] = _member_queries(docs, train_rows, splits, preset, f"{seed}:{member}")
    return TrainingData(train=splits["train"], val=splits["val"])


def _doc_queries(doc: Document, preset: Preset, seed: str, train: bool) -> list[str]:
    doc_rng = random.Random(f"{seed}:{doc.id}")
    queries = pseudo_queries(doc, preset.queries_per_doc, doc_rng)
    if train and preset.augment:
        queries += [v for q in queries if doc_rng.random() < preset.augment for v in variants(q, doc_rng)]
    return queries


def _capped(split: Split, preset: Preset, rng: random.Random) -> Split:
    if preset.max_queries is None or len(split.queries) <= preset.max_queries:
        return split
    keep = sorted(rng.sample(range(len(split.queries)), preset.max_queries))
    return Split(split.passages, [split.queries[i] for i in keep])


def _member_queries(
    docs: Sequence[Document], train_rows: Sequence[int], splits: dict[str, Split], preset: Preset, seed: str
) -> Split:
    """Member 0's training side with the pseudo-queries redrawn under `seed`; validation texts stay excluded."""
    base, val = splits["train"], splits["val"]
    dedupe = _Dedupe()
    for text in [docs[r].passage() for r in val.passages] + val.queries:
        dedupe.admit(text)
    real = base.queries[len(base.queries) - base.real :] if base.real else []
    for text in real:
        dedupe.admit(text)
    pseudo = Split(base.passages, [q for row in train_rows for q in _doc_queries(docs[row], preset, seed, True)
                                   if dedupe.admit(q)])
    pseudo = _capped(pseudo, preset, random.Random(seed))
    return Split(base.passages, pseudo.queries + real, real=len(real))
