"""An optional PCA rotation of the teacher's space, so MRL truncation keeps the directions that vary most.

all-mpnet-base-v2 was not trained for Matryoshka truncation: its first k dims carry no more of
the corpus's variance than any other k. An orthogonal rotation onto the corpus's principal axes
(most variance first) preserves every inner product at full width and moves the variance into
the dims that truncation keeps. The matrix is fitted on the document vectors at build time,
stored in the bundle, and applied by one function, models.bundle.vectors.space.rotate, to the documents
at build time and to the queries at search time, so documents and queries always share it.
Uncentered on purpose: centering would shift every score by a query-dependent constant and break
the full-width equivalence.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

ROTATION_FILE = "rotation.npy"


class Rotation(StrEnum):
    NONE = "none"
    PCA = "pca"


class PcaAccumulator:
    """The corpus covariance gathered chunk by chunk (float64 sums), so a build never holds every vector.

    Σ(x - μ)(x - μ)ᵀ = Σ x xᵀ - n μ μᵀ: one pass over the embedding store's shards, 768×768 floats held.
    """

    def __init__(self) -> None:
        self.count = 0
        self._sum: np.ndarray | None = None
        self._outer: np.ndarray | None = None

    def add(self, chunk: np.ndarray) -> None:
        x = np.asarray(chunk, dtype=np.float64)
        if self._sum is None or self._outer is None:
            self._sum, self._outer = np.zeros(x.shape[1]), np.zeros((x.shape[1], x.shape[1]))
        self._sum += x.sum(axis=0)
        self._outer += x.T @ x
        self.count += len(x)

    def matrix(self) -> np.ndarray:
        """Orthogonal [dim, dim] float32 matrix whose columns are the principal axes, most variance first."""
        if self._sum is None or self._outer is None or not self.count:
            raise ValueError("no vectors to fit a rotation on")
        mean = self._sum / self.count
        eigvals, eigvecs = np.linalg.eigh(self._outer - self.count * np.outer(mean, mean))
        return np.ascontiguousarray(eigvecs[:, np.argsort(-eigvals, kind="stable")], dtype=np.float32)


def fit_pca_rotation(docs: np.ndarray) -> np.ndarray:
    """Orthogonal [dim, dim] float32 matrix whose columns are the principal axes, most variance first."""
    acc = PcaAccumulator()
    acc.add(docs)
    return acc.matrix()

