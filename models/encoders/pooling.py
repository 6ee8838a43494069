"""Pooling and the layers after it, in torch: the teacher runs them, and the student's ONNX graph holds them.

Each pooling mode follows sentence-transformers' Pooling module (its padded path), so a teacher
computes what `SentenceTransformer.encode` computes, left or right padding alike. The functions
trace into ONNX (argmax over int32, no data-dependent branches), which keeps a backbone's
pooling inside the exported student.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import nn

from models.encoders.encoder_setup import DenseLayer, EncoderSetup, PoolingMode
from models.errors import ModelNotFound

_EPS = 1e-9


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average the token states over non-pad positions."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=_EPS)


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: PoolingMode, full_mask: torch.Tensor | None = None
         ) -> torch.Tensor:
    """[batch, hidden] from token states [batch, seq, hidden] over the tokens `mask` keeps.

    `full_mask` is the attention mask before the prompt was taken out of `mask` (include_prompt=False):
    weightedmean counts its positions from the first real token, as sentence-transformers does.
    """
    if mode == "mean":
        return mean_pool(hidden, mask)
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean_sqrt_len_tokens":
        return (hidden * m).sum(dim=1) / torch.sqrt(m.sum(dim=1).clamp(min=_EPS))
    if mode == "max":
        return hidden.masked_fill(m == 0, float("-inf")).max(dim=1).values
    positions = torch.arange(hidden.shape[1], device=hidden.device)
    if mode == "cls":  # the first token the mask keeps (after left padding, after an excluded prompt)
        return _token(hidden, mask.to(torch.int32).argmax(dim=1))
    if mode == "lasttoken":  # the last token the mask keeps; a row with none gives zeros
        return _token(hidden * m, (mask.to(torch.int32) * positions.to(torch.int32)).argmax(dim=1))
    if mode == "weightedmean":  # position weights 1, 2, … from the first real token
        start = (mask if full_mask is None else full_mask).to(torch.int32).argmax(dim=1)
        weights = (positions.unsqueeze(0) + 1 - start.unsqueeze(1)).unsqueeze(-1).to(hidden.dtype) * m
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=_EPS)
    raise ValueError(f"unknown pooling mode {mode!r}")


def _token(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Row i's state at position index[i]."""
    return torch.gather(hidden, 1, index.long().view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1)


def exclude_prompt(mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """The mask without the first `prompt_length` real tokens of each row (left padding counted)."""
    start = mask.to(torch.int32).argmax(dim=1, keepdim=True)
    positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    return mask * (positions >= start + prompt_length).to(mask.dtype)


def _activation(name: str) -> nn.Module:
    """A torch.nn module class by its dotted name (what a Dense config records), instantiated."""
    module_name, _, class_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ModelNotFound(f"activation {name!r} is not a torch class ({exc})") from exc
    if not (module_name.startswith("torch.nn") and isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelNotFound(f"activation {name!r} is not a torch.nn module")
    return cls()


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


class Dense(nn.Module):
    """sentence-transformers' Dense: activation(linear(x)), plus the input (or its projection) when residual."""

    def __init__(self, layer: DenseLayer, model_dir: Path) -> None:
        super().__init__()
        self.linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        self.activation = _activation(layer.activation)
        self.residual = layer.residual
        self.projection: nn.Module | None = None
        if layer.residual and layer.in_features != layer.out_features:
            self.projection = nn.Linear(layer.in_features, layer.out_features, bias=False)
        state = _load_weights(model_dir / layer.weights)
        mine = {"linear.weight": "linear.weight", "linear.bias": "linear.bias", "residual.weight": "projection.weight"}
        try:
            self.load_state_dict({mine.get(k, k): v for k, v in state.items()}, strict=True)
        except RuntimeError as exc:
            raise ModelNotFound(f"{model_dir / layer.weights}: does not fit the Dense layer its config describes "
                                f"({exc})") from exc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.residual:
            out = out + (x if self.projection is None else self.projection(x))
        return out


class Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x, dim=-1)


class Head(nn.Module):
    """What follows pooling: the Dense and Normalize layers in order, then truncation to `truncate_dim`.

    The final L2 normalization is the caller's (the teacher and the student both end with it).
    """

    def __init__(self, setup: EncoderSetup, model_dir: Path) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Dense(layer, model_dir) if isinstance(layer, DenseLayer) else Normalize()
            for layer in setup.effective_head()
        )
        self.truncate_dim = setup.truncate_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x if self.truncate_dim is None else x[..., : self.truncate_dim]
