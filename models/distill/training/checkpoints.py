"""A run's checkpoints: the last finished epoch (to resume after a kill) and the best one (to keep).

Both are written through models.atomic, so a kill never leaves a torn checkpoint.
"""

from __future__ import annotations

import pickle
import types
from pathlib import Path
from typing import Any

import torch

from models.atomic import atomic_write

LAST, BEST = "last.pt", "best.pt"
# A last.pt pickles the run's TrainResult by its module; one written before issue 54 moved the trainer names the old
# module, so a run killed before that move still resumes after it.
RENAMED_MODULES = {"models.distill.trainer": "models.distill.training.trainer"}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(RENAMED_MODULES.get(module, module), name)


_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="pickle")


def save(obj: object, path: Path) -> None:
    """torch.save to `path` atomically."""
    atomic_write(path, lambda fh: torch.save(obj, fh))


def load_last(directory: Path, device: torch.device) -> dict[str, Any] | None:
    """The last epoch's state (model, optimizer, scheduler, result), or None if the run has not finished one."""
    if not (directory / LAST).is_file():
        return None
    state: dict[str, Any] = torch.load(directory / LAST, map_location=device, weights_only=False,
                                         pickle_module=_PICKLE)
    return state


def load_best(directory: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """The best epoch's weights."""
    weights: dict[str, torch.Tensor] = torch.load(directory / BEST, map_location=device, weights_only=True)
    return weights
