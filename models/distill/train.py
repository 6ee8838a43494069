"""Training loop: L2 distance between student and teacher vectors (LEAF), plus optional score distillation.

Texts are tokenized once; batches group texts of similar length (queries with queries,
passages with passages), which matters on CPU where a 256-token passage costs ten short
queries. Each epoch sees every query and a fresh sample of passages.

After every epoch the state (weights, optimizer, schedule, history) is checkpointed, so an
interrupted run resumes from its last finished epoch; with `patience`, training stops once
the validation ranking agreement stops improving and the best epoch's weights are kept.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from models.distill.int8_emulation import int8_emulation
from models.distill.model import StudentModel
from models.distill.presets import Preset
from models.distill.scores import ScoreDistiller, overlap_at_k
from models.student import load_tokenizer

log = logging.getLogger(__name__)

EVAL_BATCH = 64
BUCKET_BATCHES = 50  # batches per length-sorted bucket: little padding, still shuffled


class Tokens:
    """The backbone's tokenizer.json, as the ONNX student will use it at serving time."""

    def __init__(self, tokenizer_path: Path, max_length: int) -> None:
        self.tokenizer = load_tokenizer(tokenizer_path, max_length)
        self.pad_id = self.tokenizer.padding["pad_id"] if self.tokenizer.padding else 0
        self.tokenizer.no_padding()

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def pad(self, ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(row) for row in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        return input_ids, mask

    def map_sorted(
        self, ids: Sequence[Sequence[int]], fn: Callable[[torch.Tensor, torch.Tensor], np.ndarray]
    ) -> np.ndarray:
        """`fn(input_ids, mask)` over length-sorted batches of EVAL_BATCH texts (little padding), rows in order."""
        order = np.argsort([len(row) for row in ids], kind="stable")
        out: np.ndarray | None = None
        for start in range(0, len(order), EVAL_BATCH):
            idx = order[start : start + EVAL_BATCH]
            result = fn(*self.pad([ids[i] for i in idx]))
            if out is None:
                out = np.empty((len(ids), result.shape[1]), dtype=np.float32)
            out[idx] = result
        assert out is not None, "map_sorted() needs at least one text"
        return out


@dataclass(frozen=True)
class Examples:
    """Token ids with their teacher targets (float32 [n, teacher_dim])."""

    ids: list[list[int]]
    targets: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: Sequence[int] | np.ndarray) -> Examples:
        return Examples([self.ids[i] for i in rows], self.targets[np.asarray(rows, dtype=np.int64)])

    def repeat_last(self, n: int, times: int) -> Examples:
        """These examples with their last `n` rows `times` times over (real queries among pseudo-queries)."""
        if n == 0 or times == 1:
            return self
        tail = self.take(np.arange(len(self) - n, len(self)))
        return Examples.concat(self, *[tail] * (times - 1))

    @staticmethod
    def concat(*parts: Examples) -> Examples:
        return Examples([row for p in parts for row in p.ids], np.concatenate([p.targets for p in parts]))


def length_batches(lengths: Sequence[int], batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of indices; each batch drawn from a length-sorted bucket."""
    order = rng.permutation(len(lengths))
    bucket = batch_size * BUCKET_BATCHES
    batches: list[np.ndarray] = []
    for start in range(0, len(order), bucket):
        chunk = order[start : start + bucket]
        chunk = chunk[np.argsort([lengths[i] for i in chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


@torch.inference_mode()
def embed(
    model: StudentModel,
    tokens: Tokens,
    ids: Sequence[Sequence[int]],
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
) -> np.ndarray:
    """Run `fn` (model.pooled or model.forward) over all texts in eval mode; rows in input order."""
    model.eval()
    return tokens.map_sorted(ids, lambda ids_, mask: fn(ids_.to(device), mask.to(device)).float().cpu().numpy())


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


LAST, BEST = "last.pt", "best.pt"


def _save(obj: object, path: Path) -> None:
    """torch.save through a temporary file and a rename, so a kill never leaves a torn checkpoint."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def alignment_loss(pred: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean ‖pred − target‖₂ (LEAF) or mean 1 − cos; both vectors are unit length."""
    if kind == "cosine":
        return (1.0 - (pred * target).sum(dim=-1)).mean()
    return (pred - target).norm(dim=-1).mean()


def validate(
    model: StudentModel, tokens: Tokens, val_set: tuple[Examples, Examples], bank: torch.Tensor, steps: int,
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


def _epoch_examples(queries: Examples, passages: Examples, preset: Preset, rng: np.random.Generator) -> Examples:
    picked = rng.choice(len(passages), size=preset.epoch_passages(len(passages)), replace=False)
    return Examples.concat(queries, passages.take(np.sort(picked)))


def _planned_steps(queries: Examples, passages: Examples, preset: Preset) -> int:
    steps = preset.epochs * math.ceil((len(queries) + preset.epoch_passages(len(passages))) / preset.batch_size)
    return min(steps, preset.max_steps) if preset.max_steps else steps


def lr_factor(step: int, total: int, cycles: int, end_ratio: float) -> float:
    """Linear decay from 1 to end_ratio, restarted `cycles` times over `total` steps (LEAF's schedule)."""
    length = max(math.ceil(total / cycles), 1)
    return 1.0 - (1.0 - end_ratio) * (min(step, total - 1) % length) / length


def train(
    model: StudentModel,
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
    total = _planned_steps(queries, passages, preset)
    # fused: one kernel over all parameters; on the 2-core CPU the default AdamW step took 0.11 s of a
    # 0.56 s query step (MiniLM-L6, batch 32), fused 0.01 s, with the same update rule.
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, weight_decay=preset.weight_decay, fused=True)
    end_ratio = preset.lr_end / preset.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, preset.lr_cycles, end_ratio)
    )
    scores = ScoreDistiller(documents, preset.score_temperature, preset.score_candidates, device)
    result = TrainResult()
    if checkpoints is not None and (checkpoints / LAST).is_file():
        state = torch.load(checkpoints / LAST, map_location=device, weights_only=False)
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
            _save(model.state_dict(), checkpoints / BEST)
    log.info("training: %d queries, %d passages (%d per epoch), %d epochs, %d steps, %s loss, score weight %g",
             len(queries), len(passages), preset.epoch_passages(len(passages)), preset.epochs, total, preset.loss,
             preset.score_weight)
    best_state = None if checkpoints is not None else {k: v.clone() for k, v in model.state_dict().items()}
    for epoch in range(result.epochs, preset.epochs):
        if result.steps >= total or _patience_spent(result, preset):
            break
        rng = np.random.default_rng([seed, epoch])
        examples = _epoch_examples(queries, passages, preset, rng)
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
                _save(model.state_dict(), checkpoints / BEST)
            else:
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
        if checkpoints is not None:
            _save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                   "scheduler": scheduler.state_dict(), "result": result}, checkpoints / LAST)
    if result.best_epoch != result.epochs:
        log.info("keeping the weights of epoch %d (best validation overlap@10)", result.best_epoch)
        if checkpoints is not None:
            best_state = torch.load(checkpoints / BEST, map_location=device, weights_only=True)
        assert best_state is not None
        model.load_state_dict(best_state)
    result.seconds = time.perf_counter() - started
    return result


def _patience_spent(result: TrainResult, preset: Preset) -> bool:
    return preset.patience is not None and result.epochs - result.best_epoch >= preset.patience
