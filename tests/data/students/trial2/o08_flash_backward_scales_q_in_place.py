# expect: FAIL
# where: flash_attention_backward
# name: relation mutation
"""Outside the catalogue: the backward pre-scales q in place ("one multiply instead of one per tile"); every gradient
is right, but the cache the forward made is changed."""

import numpy as np


def flash_attention_forward(q, k, v, mask, block):
    scale = 1.0 / np.sqrt(q.shape[-1])
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = np.broadcast_to(mask, (B, H, Lq, Lk))
    m = np.full((B, H, Lq, 1), -np.inf)
    l = np.zeros((B, H, Lq, 1))
    acc = np.zeros((B, H, Lq, v.shape[-1]))
    for j in range(0, Lk, block):
        s = q @ k[:, :, j : j + block].swapaxes(-1, -2) * scale
        if mask is not None:
            s = np.where(mask[..., j : j + block], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)
        alpha, e = np.exp(m - shift), np.exp(s - shift)
        l = alpha * l + e.sum(axis=-1, keepdims=True)
        acc = alpha * acc + e @ v[:, :, j : j + block]
        m = m_new
    inv_l = np.where(l > 0, 1.0 / np.where(l > 0, l, 1.0), 0.0)
    return acc * inv_l, (q, k, v, mask, acc * inv_l, np.where(np.isfinite(m), m, 0.0), inv_l, block)


def flash_attention_backward(d_o, cache):
    q, k, v, mask, o, m, inv_l, block = cache
    scale = 1.0 / np.sqrt(q.shape[-1])
    q *= scale  # BUG: writes into the cache (the forward's q)
    D = (d_o * o).sum(axis=-1, keepdims=True)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for j in range(0, k.shape[2], block):
        k_j, v_j = k[:, :, j : j + block], v[:, :, j : j + block]
        s = q @ k_j.swapaxes(-1, -2)
        if mask is not None:
            s = np.where(mask[..., j : j + block], s, -np.inf)
        p = np.exp(s - m) * inv_l
        dv[:, :, j : j + block] = p.swapaxes(-1, -2) @ d_o
        ds = p * (d_o @ v_j.swapaxes(-1, -2) - D)
        dq += ds @ k_j * scale
        dk[:, :, j : j + block] = ds.swapaxes(-1, -2) @ q  # q holds q * scale already
    return dq, dk, dv
