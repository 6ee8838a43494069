"""Closed-form ridge regression from pooled backbone features to teacher vectors.

A linear map from MiniLM's pooled space into mpnet's already recovers most of the
teacher's retrieval quality, so training starts from there instead of from noise. The
penalty is picked on the validation texts from a grid relative to the feature scale.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from models.contract import l2_normalize

log = logging.getLogger(__name__)

ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


@dataclass(frozen=True)
class RidgeFit:
    weight: np.ndarray  # [teacher_dim, backbone_dim], as nn.Linear stores it
    bias: np.ndarray  # [teacher_dim]
    alpha: float
    val_loss: float


def l2_loss(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean over rows of ||normalize(pred) − target||₂: the training loss."""
    return float(np.linalg.norm(l2_normalize(pred) - target, axis=1).mean())


def fit_ridge(x: np.ndarray, t: np.ndarray, x_val: np.ndarray, t_val: np.ndarray) -> RidgeFit:
    """Fit t ≈ x W + b for each alpha in the grid (one eigendecomposition); keep the best on validation."""
    x64, t64 = x.astype(np.float64), t.astype(np.float64)
    x_mean, t_mean = x64.mean(axis=0), t64.mean(axis=0)
    xc, tc = x64 - x_mean, t64 - t_mean
    eigvals, eigvecs = np.linalg.eigh(xc.T @ xc)
    projected = eigvecs.T @ (xc.T @ tc)
    scale = float(eigvals.mean())
    best: RidgeFit | None = None
    for rel in ALPHAS:
        alpha = rel * scale
        w = eigvecs @ (projected / (eigvals + alpha)[:, None])
        b = t_mean - x_mean @ w
        loss = l2_loss(x_val @ w + b, t_val)
        log.debug("ridge alpha=%.3g (×%g): val loss %.4f", alpha, rel, loss)
        if best is None or loss < best.val_loss:
            best = RidgeFit(weight=w.T.astype(np.float32), bias=b.astype(np.float32), alpha=alpha, val_loss=loss)
    assert best is not None
    log.info("ridge init: alpha %.3g, validation loss %.4f", best.alpha, best.val_loss)
    return best
