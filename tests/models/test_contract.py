"""models.contract: MRL truncation renormalizes the kept dims, and a student pairs only with its teacher's space."""

from __future__ import annotations

import numpy as np
import pytest

from models.contract import TeacherRef, check_same_teacher, l2_normalize, prompts_text, truncate
from models.errors import ContractMismatch

TEACHER = TeacherRef(name="t", fingerprint="a" * 64, dim=768)


def test_truncate_keeps_the_first_dims_at_unit_length() -> None:
    x = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    out = truncate(x, 2)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)  # a zero row stays zero, no NaN
    assert np.linalg.norm(l2_normalize(x), axis=1) == pytest.approx([1.0, 1.0])
    for dim in (0, 4):
        with pytest.raises(ContractMismatch, match=f"cannot truncate 3-d vectors to {dim} dims"):
            truncate(x, dim)


def test_another_fingerprint_or_dim_is_refused() -> None:
    check_same_teacher(TEACHER, TeacherRef(name="renamed", fingerprint="a" * 64, dim=768))
    other = TeacherRef(name="t2", fingerprint="b" * 64, dim=768, pooling="cls", query_prompt="query: ")
    with pytest.raises(ContractMismatch, match=r"aligned to teacher 't'.*pooling mean, no prompts.*teacher 't2'.*"
                                               r"pooling cls, query prompt 'query: ', document prompt ''"):
        check_same_teacher(TEACHER, other, what="model")
    with pytest.raises(ContractMismatch, match="student outputs 768-d vectors but the index's teacher space is 512-d"):
        check_same_teacher(TEACHER, TEACHER.model_copy(update={"dim": 512}))
    assert prompts_text(None, "") == "no prompts"
