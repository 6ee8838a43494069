"""How many optimizer steps a run takes, and the learning rate at each (LEAF's linear decay with restarts)."""

from __future__ import annotations

import math

import torch

from models.distill.presets import Preset
from models.distill.texts.dataset import Examples


def planned_steps(queries: Examples, passages: Examples, preset: Preset) -> int:
    steps = preset.epochs * math.ceil((len(queries) + preset.epoch_passages(len(passages))) / preset.batch_size)
    return min(steps, preset.max_steps) if preset.max_steps else steps


def lr_factor(step: int, total: int, cycles: int, end_ratio: float) -> float:
    """Linear decay from 1 to end_ratio, restarted `cycles` times over `total` steps (LEAF's schedule)."""
    length = max(math.ceil(total / cycles), 1)
    return 1.0 - (1.0 - end_ratio) * (min(step, total - 1) % length) / length


def lr_schedule(optimizer: torch.optim.Optimizer, total: int, preset: Preset) -> torch.optim.lr_scheduler.LambdaLR:
    """The optimizer's learning rate from preset.lr down to preset.lr_end, restarted preset.lr_cycles times."""
    end_ratio = preset.lr_end / preset.lr
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, preset.lr_cycles, end_ratio)
    )
