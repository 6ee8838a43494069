"""The training loop: L2 distance between student and teacher vectors (LEAF), plus optional score distillation.

Each epoch sees every query and a fresh sample of passages (dataset.py), at the learning rate
schedule.py gives. After every epoch the state (weights, optimizer, schedule, history) is
checkpointed (checkpoints.py), so an interrupted run resumes from its last finished epoch; with
`patience`, training stops once the validation ranking agreement stops improving and the best
epoch's weights are kept.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from models.distill.model import Student
from models.distill.presets import Preset
from models.distill.texts.dataset import Examples, epoch_examples, length_batches
from models.distill.texts.tokens import Tokens, embed
from models.distill.training.checkpoints import BEST, LAST, load_best, load_last, save
from models.distill.training.int8_emulation import int8_emulation
from models.distill.training.loss import alignment_loss
from models.distill.training.schedule import lr_schedule, planned_steps
from models.distill.training.scores import ScoreDistiller, overlap_at_k

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Validation:
    """Held-out texts after `steps` optimizer steps (0: the ridge-initialized student)."""

    steps: int
    loss: float  # mean ‖student(x) − teacher(x)‖ over validation queries and passages
    query_loss: float | None  # the same over validation queries alone
    overlap_at_10: float | None  # agreement of the student's and the teacher's top 10 over the corpus
    int8: bool = False  # measured through the int8 graph's rounding (int8_emulation.py)

    def __str__(self) -> str:
        text = f"validation loss {self.loss:.4f}"
        if self.query_loss is not None:
            text += f", queries {self.query_loss:.4f}, overlap@10 with the teacher {self.overlap_at_10:.4f}"
        return f"{text} after {self.steps} steps{' (int8)' if self.int8 else ''}"

    def score(self) -> float:
        """Higher is better: ranking agreement where there are validation queries, else the loss."""
        return self.overlap_at_10 if self.overlap_at_10 is not None else -self.loss


@dataclass
class TrainResult:
    epochs: int = 0
    steps: int = 0
    history: list[Validation] = field(default_factory=list)
    seconds: float = 0.0
    best_epoch: int = 0  # the epoch whose weights the student keeps (0: the ridge init)
    resumed_from: int | None = None  # the checkpointed epoch a resumed run started after


def validate(
    model: Student, tokens: Tokens, val_set: tuple[Examples, Examples], bank: torch.Tensor, steps: int,
    device: torch.device, int8: bool = False,
) -> Validation:
    queries, passages = val_set
    val_all = Examples.concat(queries, passages)
    pred = embed(model, tokens, val_all.ids, model.forward, device)
    distances = np.linalg.norm(pred - val_all.targets, axis=1)
    n = len(queries)
    return Validation(
        steps=steps,
        loss=float(distances.mean()),
        query_loss=float(distances[:n].mean()) if n else None,
        overlap_at_10=overlap_at_k(pred[:n], queries.targets, bank) if n else None,
        int8=int8,
    )


def train(
    model: Student,
    tokens: Tokens,
    train_set: tuple[Examples, Examples],
    val_set: tuple[Examples, Examples],
    documents: np.ndarray,
    preset: Preset,
    seed: int,
    device: torch.device,
    checkpoints: Path | None = None,
) -> TrainResult:
    """AdamW with linear decay (and restarts) from lr to lr_end; validation logged after every epoch.

    `train_set` and `val_set` are (queries, passages); `documents` are the teacher's vectors of
    the corpus, which score distillation and the ranking agreement score against. With
    `checkpoints`, a directory private to this run, each epoch is saved there and a run that
    finds a checkpoint continues after it.
    """
    started = time.perf_counter()
    torch.manual_seed(seed)
    queries, passages = train_set
    total = planned_steps(queries, passages, preset)
    # fused: one kernel over all parameters; on the 2-core CPU the default AdamW step took 0.11 s of a
    # 0.56 s query step (MiniLM-L6, batch 32), fused 0.01 s, with the same update rule.
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, weight_decay=preset.weight_decay, fused=True)
    scheduler = lr_schedule(optimizer, total, preset)
    scores = ScoreDistiller(documents, preset.score_temperature, preset.score_candidates, device)
    result = TrainResult()
    state = load_last(checkpoints, device) if checkpoints is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        result = state["result"]
        result.resumed_from = result.epochs
        log.info("resuming after epoch %d (%d steps) from %s", result.epochs, result.steps, checkpoints)
    else:
        result.history.append(validate(model, tokens, val_set, scores.bank, 0, device))
        log.info("before training: %s", result.history[0])
        if checkpoints is not None:
            checkpoints.mkdir(parents=True, exist_ok=True)
            save(model.state_dict(), checkpoints / BEST)
    log.info("training: %d queries, %d passages (%d per epoch), %d epochs, %d steps, %s loss, score weight %g",
             len(queries), len(passages), preset.epoch_passages(len(passages)), preset.epochs, total, preset.loss,
             preset.score_weight)
    best_state = None if checkpoints is not None else {k: v.clone() for k, v in model.state_dict().items()}
    for epoch in range(result.epochs, preset.epochs):
        if result.steps >= total or _patience_spent(result, preset):
            break
        rng = np.random.default_rng([seed, epoch])
        examples = epoch_examples(queries, passages, preset, rng)
        batches = length_batches([len(row) for row in examples.ids], preset.batch_size, rng)
        batches = batches[: total - result.steps]
        if preset.score_weight:
            scores.prepare(examples.targets)
        emulate = epoch >= preset.epochs - preset.int8_epochs
        model.train()
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{preset.epochs}{' (int8)' if emulate else ''}", unit="step")
        with int8_emulation(model, enabled=emulate):
            for batch in bar:
                input_ids, mask = tokens.pad([examples.ids[i] for i in batch])
                target = torch.from_numpy(examples.targets[batch]).to(device)
                pred = model(input_ids.to(device), mask.to(device))
                loss = alignment_loss(pred, target, preset.loss)
                if preset.score_weight:
                    loss = loss + preset.score_weight * scores.loss(pred, target, scores.candidates(batch, rng))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                result.steps += 1
                bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            bar.close()
            result.epochs = epoch + 1
            result.history.append(validate(model, tokens, val_set, scores.bank, result.steps, device, emulate))
        log.info("epoch %d: %s, %.0fs", epoch + 1, result.history[-1], time.perf_counter() - started)
        if result.history[-1].score() > result.history[result.best_epoch].score():
            result.best_epoch = result.epochs
            if checkpoints is not None:
                save(model.state_dict(), checkpoints / BEST)
            else:
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
        if checkpoints is not None:
            save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                   "scheduler": scheduler.state_dict(), "result": result}, checkpoints / LAST)
    if result.best_epoch != result.epochs:
        log.info("keeping the weights of epoch %d (best validation overlap@10)", result.best_epoch)
        if checkpoints is not None:
            best_state = load_best(checkpoints, device)
        assert best_state is not None
        model.load_state_dict(best_state)
    result.seconds = time.perf_counter() - started
    return result


def _patience_spent(result: TrainResult, preset: Preset) -> bool:
    return preset.patience is not None and result.epochs - result.best_epoch >= preset.patience
