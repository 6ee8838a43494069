"""A model soup (Wortsman et al., 2022): branches trained from one start on different data orders, averaged.

Fine-tuned copies of one pretrained start stay in one basin, so the mean of their weights
is a model of its own, and it averages away part of each copy's run-to-run noise. On
SciFact, averaging two finished `full` students of different seeds beat both of them
(docs/BENCHMARKS.md), while averaging snapshots of one run did not. So a preset with
`branches` > 1 trains that many branches, each `epochs` long, from the same ridge-initialized
start, then keeps the average or the best branch, whichever validates better: the choice is
made on held-out text, never on judgments.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.distill.int8_emulation import int8_emulation
from models.distill.model import StudentModel
from models.distill.presets import Preset
from models.distill.scores import document_bank
from models.distill.train import Examples, Tokens, TrainResult, Validation, save_atomic, train, validate

log = logging.getLogger(__name__)

START = "start.pt"  # the ridge-initialized weights every branch starts from

State = dict[str, torch.Tensor]


@dataclass
class SoupResult:
    branches: list[TrainResult]
    soup: Validation | None  # the averaged weights; None with a single branch
    kept_branch: int | None  # the branch whose weights the student keeps; None: the soup

    @property
    def kept(self) -> str:
        return "soup" if self.kept_branch is None else f"branch {self.kept_branch + 1}"

    @property
    def validation(self) -> Validation:
        """The validation of the weights the student keeps."""
        if self.kept_branch is None:
            assert self.soup is not None
            return self.soup
        kept = self.branches[self.kept_branch]
        return kept.history[kept.best_epoch]


def average(states: Sequence[State]) -> State:
    """Element-wise mean of floating-point tensors (summed in float64); other tensors from the first state."""
    return {
        name: torch.stack([s[name].double() for s in states]).mean(dim=0).to(tensor.dtype)
        if tensor.is_floating_point() else tensor.clone()
        for name, tensor in states[0].items()
    }


def train_soup(
    model: StudentModel,
    tokens: Tokens,
    train_set: tuple[Examples, Examples],
    val_set: tuple[Examples, Examples],
    documents: np.ndarray,
    preset: Preset,
    seed: int,
    device: torch.device,
    checkpoints: Path | None = None,
) -> SoupResult:
    """train() once per branch from the model's current weights; leaves the kept weights in `model`.

    With `checkpoints`, the start is saved first (a resumed run skips the ridge fit and restores
    it) and each branch checkpoints into its own subdirectory, so a killed run resumes inside
    the branch it was training.
    """
    if checkpoints is not None and (checkpoints / START).is_file():
        model.load_state_dict(torch.load(checkpoints / START, map_location=device, weights_only=True))
    elif checkpoints is not None:
        checkpoints.mkdir(parents=True, exist_ok=True)
        save_atomic(model.state_dict(), checkpoints / START)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    results: list[TrainResult] = []
    states: list[State] = []
    for branch in range(preset.branches):
        model.load_state_dict(start)
        where = None if checkpoints is None else checkpoints / f"branch-{branch}"
        results.append(train(model, tokens, train_set, val_set, documents, preset, seed, device, where, branch))
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    if preset.branches == 1:
        return SoupResult(results, None, 0)

    model.load_state_dict(average(states))
    bank = document_bank(documents, device)
    int8 = preset.int8_epochs > 0  # branches end through the int8 rounding, so the soup is judged through it too
    with int8_emulation(model, enabled=int8):
        soup = validate(model, tokens, val_set, bank, sum(r.steps for r in results), device, int8)
    scores = [r.history[r.best_epoch].score() for r in results]
    best = int(np.argmax(scores))
    log.info("soup of %d branches: %s (best branch %d: %.4f)", len(results), soup, best + 1, scores[best])
    if soup.score() >= scores[best]:
        return SoupResult(results, soup, None)
    log.info("keeping branch %d: it validates better than the soup", best + 1)
    model.load_state_dict(states[best])
    return SoupResult(results, soup, best)
