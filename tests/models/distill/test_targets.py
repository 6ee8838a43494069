"""Teacher targets of pseudo-queries: cached once, and reused across runs whose text lists overlap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.datasets.teacher_targets import TeacherTargets, texts_key
from models.encoders.registry import load_card
from models.encoders.teacher import TeacherEncoder


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
