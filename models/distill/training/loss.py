"""The alignment loss: the student's vector against the teacher's, both unit length (LEAF).

Score distillation, the other term, lives in scores.py.
"""

from __future__ import annotations

import torch


def alignment_loss(pred: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean ‖pred − target‖₂ (LEAF) or mean 1 − cos; both vectors are unit length."""
    if kind == "cosine":
        return (1.0 - (pred * target).sum(dim=-1)).mean()
    return (pred - target).norm(dim=-1).mean()
