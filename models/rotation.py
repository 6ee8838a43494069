"""An optional PCA rotation of the teacher's space, so MRL truncation keeps the directions that vary most.

all-mpnet-base-v2 was not trained for Matryoshka truncation: its first k dims carry no more of
the corpus's variance than any other k. An orthogonal rotation onto the corpus's principal axes
(most variance first) preserves every inner product at full width and moves the variance into
the dims that truncation keeps. The matrix is fitted on the document vectors at build time,
stored in the bundle, and applied to queries by whoever searches the bundle, so documents and
queries always share it. Uncentered on purpose: centering would shift every score by a
query-dependent constant and break the full-width equivalence.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

ROTATION_FILE = "rotation.npy"


class Rotation(StrEnum):
    NONE = "none"
    PCA = "pca"


def fit_pca_rotation(docs: np.ndarray) -> np.ndarray:
    """Orthogonal [dim, dim] float32 matrix whose columns are the principal axes, most variance first."""
    x = np.asarray(docs, dtype=np.float64)
    centered = x - x.mean(axis=0)
    eigvals, eigvecs = np.linalg.eigh(centered.T @ centered)
    return np.ascontiguousarray(eigvecs[:, np.argsort(-eigvals, kind="stable")], dtype=np.float32)


def rotate(vectors: np.ndarray, rotation: np.ndarray | None) -> np.ndarray:
    """Full-width vectors in the rotated basis (unchanged without a rotation); norms are preserved."""
    if rotation is None:
        return vectors
    return np.asarray(vectors, dtype=np.float32) @ rotation
