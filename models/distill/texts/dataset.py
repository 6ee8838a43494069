"""Training examples (token ids with their teacher targets) and the order they are drawn in.

Batches group texts of similar length (queries with queries, passages with passages), which
matters on CPU where a 256-token passage costs ten short queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.distill.presets import Preset

BUCKET_BATCHES = 50  # batches per length-sorted bucket: little padding, still shuffled


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


def epoch_examples(queries: Examples, passages: Examples, preset: Preset, rng: np.random.Generator) -> Examples:
    picked = rng.choice(len(passages), size=preset.epoch_passages(len(passages)), replace=False)
    return Examples.concat(queries, passages.take(np.sort(picked)))
