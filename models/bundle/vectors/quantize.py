"""Vector quantization shared by index build, search and rescoring.

int8 is FAISS's 8-bit scalar quantizer with per-dimension ranges calibrated on the corpus:
code = floor(255 * clip((x - vmin) / vdiff, 0, 1)), decoded as vmin + vdiff * (code + 0.5) / 255.
The numpy codec here mirrors FAISS exactly, so rescoring vectors and the FAISS index agree.
Binary keeps the sign bit of each dimension, packed 8 per byte (FAISS IndexBinary layout).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

_LEVELS = 255.0


@dataclass(frozen=True)
class Int8Calibration:
    """Per-dimension range of the corpus vectors; stored in the bundle."""

    vmin: np.ndarray
    vdiff: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Int8Calibration:
        x = np.asarray(x, dtype=np.float32)
        vmin = x.min(axis=0)
        vdiff = np.maximum(x.max(axis=0) - vmin, 1e-6).astype(np.float32)
        return cls(vmin=vmin.astype(np.float32), vdiff=vdiff)

    @classmethod
    def fit_stream(cls, chunks: Iterable[np.ndarray]) -> Int8Calibration:
        """`fit` over chunks: running per-dimension min and max, so equal to `fit` on their concatenation."""
        lo = hi = None
        for chunk in chunks:
            x = np.asarray(chunk, dtype=np.float32)
            lo = x.min(axis=0) if lo is None else np.minimum(lo, x.min(axis=0))
            hi = x.max(axis=0) if hi is None else np.maximum(hi, x.max(axis=0))
        if lo is None or hi is None:
            raise ValueError("no vectors to calibrate on")
        return cls(vmin=lo.astype(np.float32), vdiff=np.maximum(hi - lo, 1e-6).astype(np.float32))

    def to_array(self) -> np.ndarray:
        """[2, dim] float32: FAISS's `sq.trained` layout (vmin then vdiff)."""
        return np.stack([self.vmin, self.vdiff]).astype(np.float32)

    @classmethod
    def from_array(cls, arr: np.ndarray) -> Int8Calibration:
        arr = np.asarray(arr, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] != 2:
            raise ValueError(f"calibration must have shape [2, dim], got {arr.shape}")
        return cls(vmin=arr[0].copy(), vdiff=arr[1].copy())

    @property
    def dim(self) -> int:
        return int(self.vmin.shape[0])

    def max_error(self) -> np.ndarray:
        """Per-dimension bound on |x - decode(encode(x))| for x inside the calibrated range."""
        return self.vdiff * (0.5 / _LEVELS)


def int8_encode(x: np.ndarray, cal: Int8Calibration) -> np.ndarray:
    scaled = np.clip((np.asarray(x, dtype=np.float32) - cal.vmin) / cal.vdiff, 0.0, 1.0)
    return np.floor(scaled * _LEVELS).astype(np.uint8)


def int8_decode(codes: np.ndarray, cal: Int8Calibration) -> np.ndarray:
    """vmin + vdiff · (code + 0.5) / 255 in float32, computed in place in one array: the same operations in the same
    order, so the same bits, without a temporary per step (a query's rescoring decodes its whole pool)."""
    out = codes.astype(np.float32)
    out += np.float32(0.5)
    out /= np.float32(_LEVELS)
    out *= cal.vdiff
    out += cal.vmin
    return out


def binary_encode(x: np.ndarray) -> np.ndarray:
    """Sign bits (x > 0 → 1), packed 8 per byte; shape [n, ceil(dim / 8)]."""
    return np.packbits(np.asarray(x) > 0, axis=-1)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamming distances between packed codes a [n, B] and b [m, B] (reference, for tests)."""
    xor = np.bitwise_xor(a[:, None, :], b[None, :, :])
    return np.unpackbits(xor, axis=-1).sum(axis=-1)
