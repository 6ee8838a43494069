"""Quantization-aware training: the student's forward pass as the int8 ONNX graph computes it.

`export.quantize_onnx` quantizes the served student dynamically: every weight MatMul (QKV,
attention output, both FFN matrices, the projection) gets per-output-channel symmetric int8
weights in 7 bits, and its input is quantized per call to uint8 over the tensor's range, 0 included
(DynamicQuantizeLinear); the embedding tables and the embedding LayerNorm are stored as
per-tensor uint8. Inside `int8_emulation(model)` the same rounding happens in torch, with
straight-through gradients, so training moves the weights to where the int8 graph is good,
not only the fp32 one. Activations get one range per example: the service encodes a query
alone, so a query's scale never depends on the others in a training batch.

The modules' classes are swapped for the duration only; parameters, state dicts and the ONNX
export stay those of the plain model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

INT8_MAX = 64.0  # ORT's symmetric int8 range with reduce_range, which export.quantize_onnx sets
UINT8_MAX = 255.0


class _StraightThrough(torch.autograd.Function):
    """`rounded` forward, identity backward to `x`."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
        return rounded

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


@torch.no_grad()
def _rounded(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | float, low: float, high: float) -> torch.Tensor:
    """(clamp(round(x / scale) + zero, low, high) − zero) · scale, in place on one copy of x.

    Dividing (not multiplying by 1/scale, as torch's fake_quantize does) rounds ties as ORT does:
    fake_quantize put the emulation twice as far from ORT's int8 vectors. In place, because on
    256-token passages a chain of fresh tensors made the quantization-aware epochs 45% slower.
    """
    q = x.detach().div(scale).round_().add_(zero).clamp_(low, high)
    return q.sub_(zero).mul_(scale)


def _uint8(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Asymmetric uint8 over [min(low, 0), max(high, 0)], as DynamicQuantizeLinear does."""
    low, high = low.clamp(max=0.0), high.clamp(min=0.0)
    scale = ((high - low) / UINT8_MAX).clamp(min=torch.finfo(x.dtype).tiny)
    zero = torch.round(-low / scale).clamp(0.0, UINT8_MAX)
    return _StraightThrough.apply(x, _rounded(x, scale, zero, 0.0, UINT8_MAX))


def activation_uint8(x: torch.Tensor) -> torch.Tensor:
    """Per-example dynamic uint8 of a [batch, ...] activation."""
    with torch.no_grad():
        flat = x.detach().reshape(x.shape[0], -1)
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        low, high = flat.amin(dim=1).reshape(shape), flat.amax(dim=1).reshape(shape)
    return _uint8(x, low, high)


def tensor_uint8(w: torch.Tensor) -> torch.Tensor:
    """Per-tensor uint8 of a stored weight (embedding tables, the embedding LayerNorm)."""
    return _uint8(w, w.detach().amin(), w.detach().amax())


def channel_int8(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric int8 of a Linear weight [out, in]."""
    with torch.no_grad():
        scale = (weight.detach().abs().amax(dim=1, keepdim=True) / INT8_MAX).clamp(min=torch.finfo(weight.dtype).tiny)
    return _StraightThrough.apply(weight, _rounded(weight, scale, 0.0, -INT8_MAX, INT8_MAX))


_CACHE = "_int8_rounded"  # a swapped module's rounded weights, by weight version (dropped when the swap ends)


def _once_per_version(module: nn.Module, name: str, rounding: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`rounding` of the module's parameter `name`, computed again only when it changed since the last forward pass.

    An optimizer step changes a weight in place, which bumps its version counter; until then every pass (a
    validation's batches, a query encoded alone) rounds the same values, and re-rounding all of them cost more than
    the quantized activations. What comes back is the rounded values with a straight-through gradient to the
    parameter, as `rounding` gives them.
    """
    weight: torch.Tensor = getattr(module, name)
    key = (weight._version, weight.data_ptr())
    cached: dict[str, tuple[tuple[int, int], torch.Tensor]] = module.__dict__.setdefault(_CACHE, {})
    hit = cached.get(name)
    if hit is None or hit[0] != key:
        with torch.no_grad():
            hit = cached[name] = key, rounding(weight.detach())
    return _StraightThrough.apply(weight, hit[1])


class Int8Linear(nn.Linear):
    """DynamicQuantizeLinear on the input, int8 per-channel weights, fp32 bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(activation_uint8(x), _once_per_version(self, "weight", channel_int8), self.bias)


class Int8Embedding(nn.Embedding):
    """The looked-up rows of a per-tensor uint8 table (the range is the whole table's)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.weight.detach()
        return _uint8(super().forward(ids), table.amin(), table.amax())


class Int8LayerNorm(nn.LayerNorm):
    """LayerNorm with per-tensor uint8 gain and bias (QEmbedLayerNormalization stores them so)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else _once_per_version(self, "weight", tensor_uint8)
        bias = None if self.bias is None else _once_per_version(self, "bias", tensor_uint8)
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def _targets(model: nn.Module) -> list[tuple[nn.Module, type[nn.Module]]]:
    """The modules the int8 graph quantizes, with their emulating class.

    Every Linear does except a BERT pooler's, which the student never uses (it is not in the graph);
    the embeddings' tables and LayerNorm are those of the module named `embeddings`.
    """
    swaps: list[tuple[nn.Module, type[nn.Module]]] = []
    for name, module in model.named_modules():
        parts = name.split(".")
        if type(module) is nn.Linear and "pooler" not in parts:
            swaps.append((module, Int8Linear))
        elif "embeddings" in parts[:-1] and type(module) is nn.Embedding:
            swaps.append((module, Int8Embedding))
        elif "embeddings" in parts[:-1] and type(module) is nn.LayerNorm:
            swaps.append((module, Int8LayerNorm))
    return swaps


@contextmanager
def int8_emulation(model: nn.Module, enabled: bool = True) -> Iterator[int]:
    """Within the block, `model` computes as its int8 export would; yields how many modules were swapped."""
    swaps = _targets(model) if enabled else []
    originals = [type(module) for module, _ in swaps]
    try:
        for module, emulating in swaps:
            module.__class__ = emulating
        yield len(swaps)
    finally:
        for (module, _), original in zip(swaps, originals, strict=True):
            module.__class__ = original
            module.__dict__.pop(_CACHE, None)
