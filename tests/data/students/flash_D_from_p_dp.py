"""A correct FlashAttention backward that takes D as the whole row's Σ_j P_j ∘ dP_j (a first pass over the key
blocks) instead of rowsum(dO ∘ O): the two are equal, so it passes (tests/test_checker.py)."""

import numpy as np


def flash_attention_forward(q, k, v, mask, block):
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale  # a plain forward with the cache the notebook describes
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    l = np.exp(s - m).sum(axis=-1, keepdims=True)  # noqa: E741
    inv_l = np.where(l > 0, 1.0 / np.where(l > 0, l, 1.0), 0.0)
    o = np.exp(s - m) * inv_l @ v
    return o, (q, k, v, mask, o, m, inv_l, block)


def _tile(q, k, mask, m, inv_l, j, block):
    s = q @ k[:, :, j : j + block].swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(np.broadcast_to(mask, (*s.shape[:3], mask.shape[-1]))[..., j : j + block], s, -np.inf)
    return np.exp(s - m) * inv_l


def flash_attention_backward(d_o, cache):
    q, k, v, mask, o, m, inv_l, block = cache
    scale, Lk = 1.0 / np.sqrt(q.shape[-1]), k.shape[2]
    D = 0.0
    for j in range(0, Lk, block):  # first pass: D = Σ over every tile of rowsum(P_j ∘ dP_j)
        D = D + (_tile(q, k, mask, m, inv_l, j, block) * (d_o @ v[:, :, j : j + block].swapaxes(-1, -2))).sum(
            axis=-1, keepdims=True
        )
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for j in range(0, Lk, block):
        p = _tile(q, k, mask, m, inv_l, j, block)
        dv[:, :, j : j + block] = p.swapaxes(-1, -2) @ d_o
        ds = p * (d_o @ v[:, :, j : j + block].swapaxes(-1, -2) - D)
        dq += ds @ k[:, :, j : j + block] * scale
        dk[:, :, j : j + block] = ds.swapaxes(-1, -2) @ q * scale
    return dq, dk, dv
