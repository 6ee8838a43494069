"""The evaluation matrix: every setup at every MRL dimension and quantization, from one encoding pass.

Each setup is a pair of full-dimension vector sets (queries, documents); every cell truncates
both, indexes the documents exactly as a bundle of that dim and quantization would
(`VectorIndex.build`) and searches with the queries. Encoding dominates the cost and is done
once; the cells only rebuild small FAISS indexes.

Quantizations: `float`, `int8`, `binary` (Hamming ranking alone) and `binary+rescore`
(Hamming candidates rescored against int8 vectors, what a binary bundle serves).
Below each setup's native width the cells are also scored with a PCA rotation fitted on that
setup's documents (rotation.py), to see how much of plain truncation's loss it wins back.
Retention of a cell is its nDCG@10 over the teacher's at the same dim, quantization and
rotation; a setup of another width (the backbone alone, 384-d) is compared at its native
width with the teacher's full width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.rotation import Rotation, fit_pca_rotation
from models.datasets.beir import Qrels
from models.evaluation.metrics import NDCG, RECALL, TOP_K, run_from_rows, score_run
from models.search import DEFAULT_OVERSAMPLE, VectorIndex, rotate

MATRIX_DIMS = (768, 512, 256, 128)
QUANTIZATIONS = ("float", "int8", "binary", "binary+rescore")


@dataclass(frozen=True)
class Setup:
    """Full-dimension unit vectors of one setup: queries in qrels order, documents in corpus order."""

    name: str
    queries: np.ndarray
    docs: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.docs.shape[1])

    def dims(self, rotation: Rotation) -> list[int]:
        """Its native width, then every matrix dim below it (where a rotation changes anything)."""
        below = [d for d in MATRIX_DIMS if d < self.dim]
        return below if rotation is Rotation.PCA else [self.dim, *below]

    def rotated(self, rotation: Rotation) -> Setup:
        if rotation is Rotation.NONE:
            return self
        matrix = fit_pca_rotation(self.docs)
        return Setup(self.name, rotate(self.queries, matrix), rotate(self.docs, matrix))


@dataclass(frozen=True)
class Cell:
    setup: str
    dim: int
    quantization: str
    ndcg_at_10: float
    recall_at_100: float
    retention: float | None = None
    rotation: str = Rotation.NONE.value

    @property
    def label(self) -> str:
        return self.setup if self.rotation == Rotation.NONE.value else f"{self.setup} ({self.rotation})"

    def as_dict(self) -> dict[str, object]:
        return {"setup": self.setup, "rotation": self.rotation, "dim": self.dim, "quantization": self.quantization,
                NDCG: self.ndcg_at_10, RECALL: self.recall_at_100, "retention": self.retention}


def search_cell(docs: np.ndarray, queries: np.ndarray, dim: int, quantization: str) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows) of the top TOP_K documents, as a bundle of this dim and quantization ranks them."""
    if quantization == "binary":
        index = VectorIndex.build(docs, dim, Quantization.BINARY, center=True, spin=True)
        distances, rows = index.hamming(queries, TOP_K)
        return -distances.astype(np.float32), rows
    kind = Quantization.BINARY if quantization == "binary+rescore" else Quantization(quantization)
    return VectorIndex.build(docs, dim, kind, center=True, spin=True).search(queries, TOP_K, DEFAULT_OVERSAMPLE)


def evaluate_matrix(setups: Sequence[Setup], qids: Sequence[str], doc_ids: Sequence[str], qrels: Qrels) -> list[Cell]:
    """Score every (setup, rotation, dim, quantization); retention relative to the setup named `teacher`."""
    scored: dict[tuple[str, str, int, str], tuple[float, float]] = {}
    for plain in setups:
        for rotation in Rotation:
            setup = plain.rotated(rotation)
            for dim in plain.dims(rotation):
                for quantization in QUANTIZATIONS:
                    scores, rows = search_cell(setup.docs, setup.queries, dim, quantization)
                    metrics = score_run(qrels, run_from_rows(qids, scores, rows, doc_ids))
                    scored[plain.name, rotation.value, dim, quantization] = (metrics[NDCG], metrics[RECALL])
    teacher = next((s for s in setups if s.name == "teacher"), None)
    cells = []
    for (name, rotated, dim, quantization), (ndcg, recall) in scored.items():
        retention = None
        if teacher is not None:
            base_key = (teacher.name, rotated, dim, quantization)
            if base_key not in scored:  # another width: compare with the teacher's full width
                base_key = (teacher.name, Rotation.NONE.value, teacher.dim, quantization)
            base = scored.get(base_key, (0.0, 0.0))[0]
            retention = ndcg / base if base > 0 else None
        cells.append(Cell(name, dim, quantization, ndcg, recall, retention, rotated))
    return cells


def format_matrix(cells: Sequence[Cell]) -> str:
    """Markdown: one row per (setup, rotation, dim), one column per quantization, `nDCG@10 (retention)` in each."""
    lines = [
        "| setup | dim | " + " | ".join(QUANTIZATIONS) + " |",
        "|---|---:|" + "---:|" * len(QUANTIZATIONS),
    ]
    by_key = {(c.label, c.dim, c.quantization): c for c in cells}
    rows = dict.fromkeys((c.label, c.dim) for c in cells)
    for label, dim in rows:
        parts = []
        for quantization in QUANTIZATIONS:
            cell = by_key.get((label, dim, quantization))
            if cell is None:
                parts.append("")
            elif cell.retention is None:
                parts.append(f"{cell.ndcg_at_10:.4f}")
            else:
                parts.append(f"{cell.ndcg_at_10:.4f} ({cell.retention:.1%})")
        lines.append(f"| {label} | {dim} | " + " | ".join(parts) + " |")
    return "\n".join(lines)
