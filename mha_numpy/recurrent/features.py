"""The maps applied to queries and keys before a recurrence, each a pair.

- ``l2norm``: x / sqrt(Σ x² + eps) over the last axis, the form of flash-linear-attention and transformers'
  ``l2norm`` (eps inside the root, added, not a floor). Gated DeltaNet's ``use_qk_l2norm`` applies it to q and k.
- ``elu_plus_one``: φ(x) = elu(x) + 1 (x + 1 for x > 0, eˣ otherwise), positive everywhere: linear attention's
  feature map (Katharopoulos et al., 2020).
"""

from __future__ import annotations

import numpy as np

L2NORM_EPS = 1e-6  # transformers' and flash-linear-attention's default


def l2norm_forward(x: np.ndarray, eps: float = L2NORM_EPS):
    """y = x · r, r = (Σ_d x_d² + eps)^(-1/2) over the last axis.   x: (..., d) -> y: (..., d)"""
    r = 1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)  # F1: (..., 1)
    y = x * r  # F2: (..., d)
    return y, (y, r)


def l2norm_backward(dy: np.ndarray, cache) -> np.ndarray:
    """dx = r (dy − y (y · dy)): the projection that removes the radial part (exact with eps: ∂r/∂x = −r³ x).
    dy: (..., d) -> dx: (..., d)"""
    y, r = cache
    return r * (dy - y * np.sum(y * dy, axis=-1, keepdims=True))  # ← F2, F1


def elu_plus_one_forward(x: np.ndarray):
    """φ(x) = elu(x) + 1: x + 1 where x > 0, eˣ elsewhere.   x: (...) -> φ: (...)"""
    e = np.exp(np.minimum(x, 0.0))  # F1: eˣ where x ≤ 0, 1 elsewhere (no overflow on the other side)
    return np.where(x > 0, x + 1.0, e), e  # F2


def elu_plus_one_backward(d_phi: np.ndarray, cache) -> np.ndarray:
    """φ'(x) = 1 where x > 0, eˣ elsewhere: exactly the e the forward kept."""
    return d_phi * cache  # ← F2, F1
