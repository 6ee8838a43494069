"""The static student: a table of token vectors, per-token weights and mean pooling; no attention at all.

A text's vector is normalize(W · mean_i(w[t_i] · E[t_i]) + b) over its tokens t_i (special tokens included, as the
served tokenizer emits them). Mean pooling is linear, so the projection folds into the table at export:
T[t] = W · (w[t] · E[t]) + b, and serving is normalize(mean_i T[t_i]): one gather and one mean
(models/encoders/static.py). The table lives in the teacher's full space, so MRL truncation and int8/binary
quantization of its vectors work as for any student.

It reads the teacher's own tokenizer and starts from the teacher (issue 56):
- `vocabulary` (Model2Vec's `distill`, without its PCA): each vocabulary token run through the teacher alone between
  its special tokens, pooled and carried through the teacher's head. Cached per teacher fingerprint, since it costs a
  teacher forward pass per token;
- `embeddings`: the teacher's input token embeddings, free to read but not in the output space;
then the projection is fitted by the ridge regression every backbone student starts from (training/ridge.py), and
the table, weights and projection train with the transformer student's losses and data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from transformers import AutoModel

from models.atomic import atomic_write
from models.encoders.pooling import Head, mean_pool, pool
from models.encoders.registry import ModelCard
from models.encoders.student import load_tokenizer
from models.paths import cache_dir

log = logging.getLogger(__name__)

StaticInit = Literal["vocabulary", "embeddings"]
VOCAB_BATCH = 256
SIF_A = 1e-3  # smooth inverse frequency's a (Arora et al.; Model2Vec's default)


class StaticModel(nn.Module):
    """Token table [vocab, width] + per-token weights + Linear(width → teacher_dim), mean-pooled; torch side only."""

    def __init__(self, table: torch.Tensor, teacher_dim: int, name: str) -> None:
        super().__init__()
        self.name = name
        self.pooling = "mean"
        self.embeddings = nn.Embedding.from_pretrained(table.float().clone(), freeze=False)
        self.token_weights = nn.Parameter(torch.ones(table.shape[0]))
        self.projection = nn.Linear(table.shape[1], teacher_dim)

    @property
    def vocab_size(self) -> int:
        return int(self.embeddings.num_embeddings)

    @property
    def has_projection(self) -> bool:
        return True

    @property
    def backbone_dim(self) -> int:
        return int(self.embeddings.embedding_dim)

    @contextmanager
    def fast_attention(self) -> Iterator[str]:
        """No attention to speed up: the trainer's context, kept for the same call sites."""
        yield "none (static)"

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Weighted token vectors averaged over the text's tokens (the ridge regression's features)."""
        vectors = self.embeddings(input_ids) * self.token_weights[input_ids].unsqueeze(-1)
        return mean_pool(vectors, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Unit vectors in the teacher's space, [batch, teacher_dim]."""
        return nn.functional.normalize(self.projection(self.pooled(input_ids, attention_mask)), dim=-1)

    @torch.no_grad()
    def set_projection(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        self.projection.weight.copy_(weight)
        self.projection.bias.copy_(bias)

    @torch.no_grad()
    def set_sif_weights(self, ids: Sequence[Sequence[int]]) -> None:
        """w[t] = a / (a + p(t)), p the token's frequency in `ids` (training text); tokens never seen keep 1.

        Frequent tokens (the, of, punctuation, the special tokens) say little about a text's meaning and would
        otherwise pull every mean towards the same point."""
        counts = np.bincount(np.concatenate([np.asarray(row, dtype=np.int64) for row in ids]),
                             minlength=self.vocab_size)[: self.vocab_size].astype(np.float64)
        p = counts / max(counts.sum(), 1.0)
        self.token_weights.copy_(torch.from_numpy(SIF_A / (SIF_A + p)).float())

    @torch.no_grad()
    def folded_table(self) -> np.ndarray:
        """float32 [vocab, teacher_dim]: T[t] = W · (w[t] · E[t]) + b, so that mean_i T[t_i] is the projection of
        the pooled vector (the bias survives the mean since each text's weights over its tokens sum to one)."""
        weighted = self.embeddings.weight * self.token_weights.unsqueeze(-1)
        return self.projection(weighted).float().cpu().numpy()


def initial_table(card: ModelCard, init: StaticInit, device: torch.device) -> torch.Tensor:
    """The table a static student of the teacher `card` starts from (module docstring)."""
    if init == "embeddings":
        teacher = AutoModel.from_pretrained(str(card.hf_dir))
        return teacher.get_input_embeddings().weight.detach().float().clone()
    path = cache_dir() / "static" / f"{card.fingerprint[:32]}.vocabulary.npy"
    if path.is_file():
        log.info("static student: the teacher's vocabulary pass from %s", path)
        return torch.from_numpy(np.load(path))
    table = vocabulary_pass(card, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: np.save(fh, table))
    return torch.from_numpy(table)


@torch.inference_mode()
def vocabulary_pass(card: ModelCard, device: torch.device) -> np.ndarray:
    """float32 [vocab, dim]: every token id t as the text [CLS] t [SEP] through the teacher, pooled as it pools and
    carried through its head, not normalized (Model2Vec's `distill` output before its PCA)."""
    teacher = AutoModel.from_pretrained(str(card.hf_dir)).to(device).eval()
    head = Head(card, Path(card.path)).to(device).eval()
    bos, eos = _specials(card.hf_dir / "tokenizer.json")
    vocab = int(teacher.get_input_embeddings().num_embeddings)
    out = np.empty((vocab, card.dim), dtype=np.float32)
    log.info("static student: the teacher's vocabulary pass over %d tokens", vocab)
    for start in range(0, vocab, VOCAB_BATCH):
        ids = torch.arange(start, min(start + VOCAB_BATCH, vocab))
        batch = torch.stack([torch.full_like(ids, bos), ids, torch.full_like(ids, eos)], dim=1).to(device)
        mask = torch.ones_like(batch)
        hidden = teacher(input_ids=batch, attention_mask=mask)[0]
        out[start : start + len(ids)] = head(pool(hidden, mask, card.pooling)).float().cpu().numpy()
    return out


def _specials(tokenizer_file: Path) -> tuple[int, int]:
    """The ids the tokenizer puts around one token (its first and last), read from an encoding of one word."""
    ids = load_tokenizer(tokenizer_file, 8).encode("a").ids
    return int(ids[0]), int(ids[-1])
