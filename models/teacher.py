"""The teacher encoder: an HF model in torch, mean-pooled and L2-normalized.

Used offline (index builds, distillation targets, evaluation). Batches are sorted by length
so padding is small; CUDA with fp16 is used when present, else CPU in fp32.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from models.registry import ModelCard, load_card

log = logging.getLogger(__name__)


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average the token states over non-pad positions."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


class TeacherEncoder:
    """Encodes texts into the teacher's normalized embedding space."""

    def __init__(self, model_dir: Path, device: str | None = None, max_seq_length: int | None = None) -> None:
        self.card: ModelCard = load_card(model_dir)
        self.device = pick_device(device)
        self.max_seq_length = max_seq_length or self.card.max_seq_length
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModel.from_pretrained(str(model_dir), dtype=dtype).to(self.device).eval()
        log.info("teacher %s on %s (%s), max_seq_length=%d", self.card.name, self.device, dtype, self.max_seq_length)

    @property
    def dim(self) -> int:
        return self.card.dim

    @torch.inference_mode()
    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        progress: bool = False,
        on_progress: Callable[[int], object] | None = None,
    ) -> np.ndarray:
        """Return float32 [len(texts), dim] unit vectors, in input order.

        `progress` shows a bar; `on_progress(n)` lets a caller with its own bar follow along.
        """
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        lengths = [len(ids) for ids in self.tokenizer(list(texts), truncation=True,
                                                         max_length=self.max_seq_length)["input_ids"]]
        order = np.argsort(lengths, kind="stable")[::-1]
        bar = tqdm(total=len(texts), desc="teacher", unit="doc", disable=not progress, smoothing=0.1)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_seq_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
            pooled = mean_pool(hidden.float(), batch["attention_mask"])
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
            bar.update(len(idx))
            if on_progress is not None:
                on_progress(len(idx))
        bar.close()
        return out
