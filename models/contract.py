"""The embedding-space contract: what a vector means and how it is shrunk.

Indexer and service both call these functions, so documents and queries are always
truncated and normalized the same way (MRL: keep the first k dims, renormalize).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from models.errors import ContractMismatch

SUPPORTED_DIMS = (768, 512, 384, 256, 128, 64)
_EPS = 1e-12


class TeacherRef(BaseModel):
    """Identifies the teacher whose space a bundle or a student lives in.

    The fingerprint decides; pooling and prompts are recorded beside it for people (absent in manifests
    written before tandem read them, when every teacher was mean-pooled and unprompted).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    fingerprint: str
    dim: int
    pooling: str | None = None
    query_prompt: str | None = None
    document_prompt: str | None = None

    def setup_text(self) -> str:
        """Pooling and prompts in words, e.g. "pooling cls, query prompt 'query: ', document prompt ''"."""
        return f"pooling {self.pooling or 'mean'}, {prompts_text(self.query_prompt, self.document_prompt)}"


def prompts_text(query_prompt: str | None, document_prompt: str | None) -> str:
    if not query_prompt and not document_prompt:
        return "no prompts"
    return f"query prompt {query_prompt or ''!r}, document prompt {document_prompt or ''!r}"


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Row-normalize to unit length in float32 (eps-guarded for zero rows)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, _EPS)


def truncate(x: np.ndarray, dim: int) -> np.ndarray:
    """Matryoshka truncation: keep the first `dim` dims and renormalize."""
    if dim <= 0 or dim > x.shape[-1]:
        raise ContractMismatch(f"cannot truncate {x.shape[-1]}-d vectors to {dim} dims")
    return l2_normalize(x[..., :dim])


def check_same_teacher(student: TeacherRef, bundle: TeacherRef, *, what: str = "student") -> None:
    """Refuse to pair a student with an index built from another teacher."""
    if student.fingerprint != bundle.fingerprint:
        raise ContractMismatch(
            f"{what} was aligned to teacher {student.name!r} (fingerprint {student.fingerprint[:16]}…, "
            f"{student.setup_text()}) but the index was built with teacher {bundle.name!r} (fingerprint "
            f"{bundle.fingerprint[:16]}…, {bundle.setup_text()}); a teacher's weights with another pooling or "
            "prompt make another embedding space"
        )
    if student.dim != bundle.dim:
        raise ContractMismatch(
            f"{what} outputs {student.dim}-d vectors but the index's teacher space is {bundle.dim}-d"
        )
