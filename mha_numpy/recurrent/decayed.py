"""The products of a chunk weighted by the decay between two positions, a pair (``delta_chunked``'s C3 and C5).

    Z_ij = Σ_d X_id Y_jd exp(γ_id − γ_jd)   for j ≤ i (j < i with ``strict``), 0 above

X, Y (…, C, d), γ (…, C, 1) one decay a head (then Z = (X Yᵀ) ⊙ Γ, Γ_ij = exp(γ_i − γ_j): one GEMM) or (…, C, d)
one a channel (Kimi Delta Attention: a (C, C, d) array per chunk, formed a few chunks at a time so the memory stays
bounded). exp is taken only where j ≤ i (γ_i − γ_j ≤ 0 there: no overflow). Backward, with G_ijd the summand times
dZ_ij: dX_i = Σ_j dZ_ij (Y_j ⊙ Γ_ij), dY_j = Σ_i dZ_ij (X_i ⊙ Γ_ij), dγ_i += Σ_j G_ij·, dγ_j −= Σ_i G_ij·.
"""

from __future__ import annotations

import numpy as np

BLOCK_ELEMENTS = 1 << 22  # per-channel products: about this many (C, C, d) entries at a time (32 MB in float64)


def _mask(C: int, strict: bool) -> np.ndarray:
    return np.tril(np.ones((C, C), dtype=bool), -1 if strict else 0)


def _decays(gam: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Γ_ijd = exp(γ_id − γ_jd) where the mask allows, 0 elsewhere.   gam (n, C, d) -> (n, C, C, d)"""
    diff = gam[:, :, None, :] - gam[:, None, :, :]  # (n, C, 1, d) - (n, 1, C, d) -> (n, C, C, d)
    return np.where(mask[..., None], np.exp(np.where(mask[..., None], diff, 0.0)), 0.0)


def _blocks(n: int, C: int, d: int):
    step = max(1, BLOCK_ELEMENTS // max(1, C * C * d))
    return (slice(s, min(s + step, n)) for s in range(0, n, step))


def decayed_products_cache(X: np.ndarray, Y: np.ndarray, gam: np.ndarray, strict: bool = False):
    """What the backward needs, without Z: Γ (…, C, C) for one gate a head (F1), the inputs for one a channel."""
    if gam.shape[-1] != 1:
        return X, Y, gam, None, strict
    mask = _mask(X.shape[-2], strict)
    diff = gam[..., :, 0, None] - gam[..., None, :, 0]  # F1: (…, C, 1) - (…, 1, C) -> (…, C, C)
    return X, Y, gam, np.where(mask, np.exp(np.where(mask, diff, 0.0)), 0.0), strict  # F1: 0 outside the mask


def decayed_products_forward(X: np.ndarray, Y: np.ndarray, gam: np.ndarray, strict: bool = False):
    """Z (…, C, C) = Σ_d X_id Y_jd exp(γ_id − γ_jd), j ≤ i (j < i if strict).   X, Y (…, C, d), gam (…, C, 1 or d)"""
    cache = decayed_products_cache(X, Y, gam, strict)  # F1
    C, d = X.shape[-2:]
    if cache[3] is not None:
        return (X @ Y.swapaxes(-1, -2)) * cache[3], cache  # F2: (…, C, d) @ (…, d, C), ⊙ Γ
    mask = _mask(C, strict)
    X2, Y2, g2 = (a.reshape(-1, C, a.shape[-1]) for a in (X, Y, gam))  # (n, C, ·): the chunks in a row
    Z = np.empty((X2.shape[0], C, C), dtype=X.dtype)
    for b in _blocks(X2.shape[0], C, d):
        E = _decays(g2[b], mask)  # F1: (n_b, C, C, d)
        Z[b] = np.sum(X2[b, :, None, :] * Y2[b, None, :, :] * E, axis=-1)  # F2: (n_b, C, 1, d) * (n_b, 1, C, d) * E
    return Z.reshape(*X.shape[:-2], C, C), cache


def decayed_products_backward(dZ: np.ndarray, cache):
    """dZ (…, C, C) -> (dX (…, C, d), dY (…, C, d), dgam (…, C, 1 or d))."""
    X, Y, gam, Gam, strict = cache
    C, d = X.shape[-2:]
    if Gam is not None:
        dZm = dZ * Gam  # ← F2
        G = dZm * (X @ Y.swapaxes(-1, -2))  # ← F1: dZ_ij Z_ij, (…, C, d) @ (…, d, C)
        dgam = (np.sum(G, axis=-1) - np.sum(G, axis=-2))[..., None]  # ← F1: (…, C, 1)
        return dZm @ Y, dZm.swapaxes(-1, -2) @ X, dgam  # ← F2: (…, C, C) @ (…, C, d)
    mask = _mask(C, strict)
    X2, Y2, g2 = (a.reshape(-1, C, a.shape[-1]) for a in (X, Y, gam))
    dZ2 = dZ.reshape(-1, C, C)
    dX, dY, dgam = np.empty_like(X2), np.empty_like(Y2), np.empty_like(g2)
    for b in _blocks(X2.shape[0], C, d):
        W = dZ2[b, :, :, None] * _decays(g2[b], mask)  # ← F2, F1: dZ_ij Γ_ijd, (n_b, C, C, d)
        dX[b] = np.sum(W * Y2[b, None, :, :], axis=2)  # ← F2: Σ_j, (n_b, C, d)
        dY[b] = np.sum(W * X2[b, :, None, :], axis=1)  # ← F2: Σ_i
        G = W * X2[b, :, None, :] * Y2[b, None, :, :]  # ← F1: G_ijd
        dgam[b] = np.sum(G, axis=2) - np.sum(G, axis=1)  # ← F1
    return dX.reshape(X.shape), dY.reshape(Y.shape), dgam.reshape(gam.shape)
