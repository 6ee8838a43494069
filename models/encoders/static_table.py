"""A static student's table at serving time: gather the text's token rows, average, normalize; numpy only.

The table is T[t] = W · (w[t] · E[t]) + b, the trained per-token weights and projection folded in at export
(models/distill/static.py), so a query costs one gather of its tokens' rows and one sum. It is memory-mapped:
processes serving the same student share its pages, and only the rows queries touch are ever read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.errors import ContractMismatch


class StaticTable:
    """float32 [vocab, dim] rows, read-only and memory-mapped."""

    def __init__(self, path: Path, dim: int) -> None:
        try:
            self.rows = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise ContractMismatch(f"{path}: not a readable .npy token table ({exc})") from exc
        if self.rows.ndim != 2 or self.rows.shape[1] != dim or self.rows.dtype != np.float32:
            raise ContractMismatch(f"{path}: a static student's table must be float32 [vocab, {dim}], not "
                                   f"{self.rows.dtype} {list(self.rows.shape)}")

    @property
    def vocab_size(self) -> int:
        return int(self.rows.shape[0])

    def encode(self, ids: Sequence[int]) -> np.ndarray:
        """float32 [dim] unit vector of one text's token ids (the mean's 1/n cancels in the normalization)."""
        total = self.rows[np.asarray(ids, dtype=np.intp)].sum(axis=0, dtype=np.float32)
        norm = float(np.linalg.norm(total))
        return total / norm if norm > 0.0 else total
