"""A run's checkpoints: the last finished epoch (to resume after a kill) and the best one (to keep).

Both are written through models.atomic, so a kill never leaves a torn checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.atomic import atomic_write

LAST, BEST = "last.pt", "best.pt"


def save(obj: object, path: Path) -> None:
    """torch.save to `path` atomically."""
    atomic_write(path, lambda fh: torch.save(obj, fh))


def load_last(directory: Path, device: torch.device) -> dict[str, Any] | None:
    """The last epoch's state (model, optimizer, scheduler, result), or None if the run has not finished one."""
    if not (directory / LAST).is_file():
        return None
    state: dict[str, Any] = torch.load(directory / LAST, map_location=device, weights_only=False)
    return state


def load_best(directory: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """The best epoch's weights."""
    weights: dict[str, torch.Tensor] = torch.load(directory / BEST, map_location=device, weights_only=True)
    return weights
