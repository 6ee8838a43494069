"""Training loop: L2 distance between student and teacher vectors, nothing else (LEAF).

Texts are tokenized once; batches group texts of similar length (queries with queries,
passages with passages), which matters on CPU where a 256-token passage costs ten short
queries. Each epoch sees every query and a fresh sample of passages.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from models.distill.model import StudentModel
from models.distill.presets import Preset
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


@dataclass(frozen=True)
class Examples:
    """Token ids with their teacher targets (float32 [n, teacher_dim])."""

    ids: list[list[int]]
    targets: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: Sequence[int] | np.ndarray) -> Examples:
        return Examples([self.ids[i] for i in rows], self.targets[np.asarray(rows, dtype=np.int64)])

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
    order = np.argsort([len(row) for row in ids], kind="stable")
    out: np.ndarray | None = None
    for start in range(0, len(order), EVAL_BATCH):
        idx = order[start : start + EVAL_BATCH]
        input_ids, mask = tokens.pad([ids[i] for i in idx])
        result = fn(input_ids.to(device), mask.to(device)).float().cpu().numpy()
        if out is None:
            out = np.empty((len(ids), result.shape[1]), dtype=np.float32)
        out[idx] = result
    assert out is not None, "embed() needs at least one text"
    return out


def l2_distances(model: StudentModel, tokens: Tokens, examples: Examples, device: torch.device) -> np.ndarray:
    pred = embed(model, tokens, examples.ids, model.forward, device)
    return np.linalg.norm(pred - examples.targets, axis=1)


@dataclass
class TrainResult:
    epochs: int = 0
    steps: int = 0
    val_loss: list[float] = field(default_factory=list)
    val_query_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _epoch_examples(queries: Examples, passages: Examples, preset: Preset, rng: np.random.Generator) -> Examples:
    picked = rng.choice(len(passages), size=preset.epoch_passages(len(passages)), replace=False)
    return Examples.concat(queries, passages.take(np.sort(picked)))


def _planned_steps(queries: Examples, passages: Examples, preset: Preset) -> int:
    steps = preset.epochs * math.ceil((len(queries) + preset.epoch_passages(len(passages))) / preset.batch_size)
    return min(steps, preset.max_steps) if preset.max_steps else steps


def train(
    model: StudentModel,
    tokens: Tokens,
    train_set: tuple[Examples, Examples],
    val_set: tuple[Examples, Examples],
    preset: Preset,
    seed: int,
    device: torch.device,
) -> TrainResult:
    """AdamW with linear decay from lr to lr_end; validation loss logged after every epoch.

    `train_set` and `val_set` are (queries, passages).
    """
    started = time.perf_counter()
    torch.manual_seed(seed)
    queries, passages = train_set
    val_all = Examples.concat(*val_set)
    total = _planned_steps(queries, passages, preset)
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, weight_decay=preset.weight_decay)
    end_ratio = preset.lr_end / preset.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1.0 - (1.0 - end_ratio) * min(step, total) / max(total, 1)
    )
    result = TrainResult()
    log.info("training: %d queries, %d passages (%s per epoch), %d epochs, %d steps", len(queries), len(passages),
             preset.passages_per_epoch or "all", preset.epochs, total)
    for epoch in range(preset.epochs):
        if result.steps >= total:
            break
        rng = np.random.default_rng([seed, epoch])
        examples = _epoch_examples(queries, passages, preset, rng)
        batches = length_batches([len(row) for row in examples.ids], preset.batch_size, rng)
        batches = batches[: total - result.steps]
        model.train()
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{preset.epochs}", unit="step")
        for batch in bar:
            input_ids, mask = tokens.pad([examples.ids[i] for i in batch])
            target = torch.from_numpy(examples.targets[batch]).to(device)
            loss = (model(input_ids.to(device), mask.to(device)) - target).norm(dim=-1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            result.steps += 1
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        bar.close()
        result.epochs = epoch + 1
        distances = l2_distances(model, tokens, val_all, device)
        result.val_loss.append(float(distances.mean()))
        if len(val_set[0]):
            result.val_query_loss.append(float(distances[: len(val_set[0])].mean()))
        log.info("epoch %d: validation loss %.4f, %d steps, %.0fs", epoch + 1, result.val_loss[-1], result.steps,
                 time.perf_counter() - started)
    result.seconds = time.perf_counter() - started
    return result
