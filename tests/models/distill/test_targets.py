"""Teacher targets of pseudo-queries: cached once, and reused across runs whose text lists overlap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.datasets.teacher_targets import TeacherTargets, texts_key
from models.encoders.registry import load_card
from models.encoders.teacher import TeacherEncoder
from models.encoders.teacher_cache import teacher_loads


@pytest.mark.slow
def test_overlapping_lists_encode_only_new_texts(teacher_dir: Path) -> None:
    card = load_card(teacher_dir)
    first = ["ocean tides and the moon", "insulin and blood sugar", "how bread rises"]
    second = ["how bread rises", "the TCP handshake", "ocean tides and the moon", "how bread rises"]
    targets = TeacherTargets(card)
    a = targets.queries(first)
    b = targets.queries(second)
    # Only the one new text went through the teacher, as its own cache entry.
    assert targets.cache.load(texts_key(card, ["the TCP handshake"])) is not None
    assert targets.cache.load(texts_key(card, second)) is not None
    assert np.allclose(b[0], a[2]) and np.allclose(b[2], a[0]) and np.allclose(b[3], a[2])
    expected = TeacherEncoder(teacher_dir).encode_queries(second)
    assert np.allclose(b, expected, atol=2e-3)  # float16 cache
    assert np.array_equal(TeacherTargets(card).queries(second), b)  # a whole list is one cache hit


@pytest.mark.usefixtures("no_agreement_sample")  # the build's sample would load the teacher and encode its queries
def test_document_targets_are_the_vectors_the_bundle_was_built_from(teacher_dir: Path, tiny_corpus: Path,
                                                                    tmp_path: Path) -> None:
    """A bundle built with --precision bf16 hands distillation its bf16 vectors: the corpus is not encoded again in
    fp32, and the teacher is not even loaded."""
    from indexer.build import BuildRequest, build
    from models.corpus import read_corpus
    from models.embeddings.store import EmbeddingStore
    from models.encoders.registry import resolve

    manifest = build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "bf16", precision="bf16"))
    key = manifest.embeddings.store_key
    assert key is not None
    targets = TeacherTargets(load_card(resolve("teacher")))
    loads = teacher_loads().misses
    vectors = targets.documents(read_corpus(tiny_corpus), built_from=key)
    stored = EmbeddingStore().load(key)
    assert stored is not None and np.array_equal(vectors, stored)
    assert teacher_loads().misses == loads  # the teacher was not loaded
