"""The backbone's tokenizer as training sees it, and the student run over many texts in eval mode.

Training, validation and the export's parity check all tokenize through `Tokens`, which loads
the same tokenizer.json the ONNX student serves with, so a text gets the same ids in training as
in service.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from models.distill.model import Student
from models.encoders.student import load_tokenizer

EVAL_BATCH = 64


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


@torch.inference_mode()
def embed(
    model: Student,
    tokens: Tokens,
    ids: Sequence[Sequence[int]],
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
) -> np.ndarray:
    """Run `fn` (model.pooled or model.forward) over all texts in eval mode; rows in input order."""
    model.eval()
    return tokens.map_sorted(ids, lambda ids_, mask: fn(ids_.to(device), mask.to(device)).float().cpu().numpy())
