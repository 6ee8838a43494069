"""The student: an HF encoder → its pooling → projection to the teacher's width → L2 normalize.

Two families (DISTILLATION.md):
- `backbone` (LEAF): a small pretrained encoder (MiniLM-L6, or any BERT-family model provisioned as the
  backbone) pooled as its card says, plus Linear(backbone_dim → teacher_dim), initialized by
  closed-form ridge regression (see ridge.py) before any gradient step;
- `teacher-layers` (Wang & Lyu): the teacher's own embeddings and its first and last k layers, pooled
  as the teacher pools and carried through the teacher's own head (its Dense layers, its truncation),
  already in the teacher's space, so nothing to fit: the head trains on as it is.

Either way the pooling is traced into the ONNX graph (models/encoders/pooling.py), so serving needs no more
than the token ids. The student reads raw text: whatever prompts the teacher or backbone use,
queries reach the service as the user typed them (docs/decisions.md#the-student-reads-raw-text).

The model is loaded with eager attention, which keeps the graph exportable by the classic ONNX
exporter; `fast_attention()` swaps in torch's fused SDPA kernel for training and for the ridge
fit's forward passes, where the backbone supports it (same function, other kernel). Dropout is switched
off: the targets are deterministic vectors and training is short, and on SciFact pseudo-queries
it aligned slightly faster without it (cosine 0.7225 vs 0.7195 after one epoch from the same
ridge init).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeAlias

import torch
from torch import nn
from transformers import AutoModel

from models.distill.static import StaticModel
from models.encoders.encoder_setup import PoolingMode
from models.encoders.pooling import pool


def depth(hf_dir: Path) -> int:
    """The transformer layers of the HF model at `hf_dir`, as its config says (a student may keep fewer)."""
    return int(json.loads((Path(hf_dir) / "config.json").read_text())["num_hidden_layers"])


class StudentModel(nn.Module):
    def __init__(
        self, backbone_dir: Path, teacher_dim: int, keep_layers: Sequence[int] | None = None, name: str = "",
        pooling: PoolingMode = "mean", head: nn.Module | None = None, backbone_layers: Sequence[int] | None = None,
    ) -> None:
        """`head`, with `keep_layers`: the teacher's own layers after pooling (models.encoders.pooling.Head).

        `backbone_layers`: a backbone student cut down to those of its layers (a shallower student), still with
        its Linear projection; `keep_layers` is the teacher-layer student, whose head replaces the projection.
        """
        super().__init__()
        self.name = name or Path(backbone_dir).name
        self.pooling: PoolingMode = pooling
        self.backbone = AutoModel.from_pretrained(str(backbone_dir), attn_implementation="eager")
        self.projection: nn.Module = nn.Linear(int(self.backbone.config.hidden_size), teacher_dim)
        if backbone_layers is not None:
            self._keep_layers(backbone_layers)
        if keep_layers is not None:
            self._keep_layers(keep_layers)
            self.projection = head if head is not None else nn.Identity()
        for module in self.backbone.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        self._token_types = "token_type_ids" in inspect.signature(self.backbone.forward).parameters

    def _keep_layers(self, keep: Sequence[int]) -> None:
        """Cut the encoder down to the layers `keep` (teacher-layer extraction, or a shallower backbone); the width
        stays the model's."""
        encoder = getattr(self.backbone, "encoder", None)
        layers = getattr(encoder, "layer", None)
        if encoder is None or not isinstance(layers, nn.ModuleList):
            raise ValueError(f"{type(self.backbone).__name__} keeps no encoder.layer list: teacher-layer extraction "
                             "needs a BERT-family encoder (BERT, MPNet, RoBERTa, …)")
        if not keep or any(not 0 <= i < len(layers) for i in keep):
            raise ValueError(f"layers {list(keep)} are not within the model's {len(layers)} layers")
        encoder.layer = nn.ModuleList(layers[i] for i in keep)
        self.backbone.config.num_hidden_layers = len(keep)

    @contextmanager
    def fast_attention(self) -> Iterator[str]:
        """Within the block the backbone attends through SDPA if it can; yields the implementation in use.

        On the 2-core CPU a training step over 32 passages of 256 tokens (MiniLM-L6) took 3.7 s with SDPA
        against 5.5 s eager; short queries cost the same either way. Vectors and gradients agree to 1e-6.
        Eager is restored on exit, whatever happens, since export needs it.
        """
        loaded = self.backbone.config._attn_implementation
        fused = "sdpa" if self.backbone._supports_sdpa and self.backbone._can_set_attn_implementation() else loaded
        self.backbone.set_attn_implementation(fused)
        try:
            yield fused
        finally:
            self.backbone.set_attn_implementation(loaded)

    @property
    def has_projection(self) -> bool:
        return isinstance(self.projection, nn.Linear)

    @property
    def backbone_dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The backbone's token states pooled as its card says (the ridge regression's features)."""
        extra = {"token_type_ids": torch.zeros_like(input_ids)} if self._token_types else {}
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]
        return pool(hidden, attention_mask, self.pooling)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Unit vectors in the teacher's space, [batch, teacher_dim]."""
        return nn.functional.normalize(self.projection(self.pooled(input_ids, attention_mask)), dim=-1)

    @torch.no_grad()
    def set_projection(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        assert isinstance(self.projection, nn.Linear), "a teacher-layer student has no projection"
        self.projection.weight.copy_(weight)
        self.projection.bias.copy_(bias)


Student: TypeAlias = StudentModel | StaticModel  # what training, validation and embedding take
