# expect: FAIL
# where: flash_attention_backward q
# name: relation path | relation part
"""Outside the catalogue: dq assigned per key tile (dq = ds @ k_j · scale) as dk and dv are, where it must add up
over the tiles: only the last tile's contribution survives."""

import numpy as np


def flash_attention_forward(q, k, v, mask, block):
    scale = 1.0 / np.sqrt(q.shape[-1])
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = np.broadcast_to(mask, (B, H, Lq, Lk))
    m = np.full((B, H, Lq, 1), -np.inf)
    l = np.zeros((B, H, Lq, 1))  # noqa: E741 - ℓ, as in the notebook
    acc = np.zeros((B, H, Lq, v.shape[-1]))
    for j in range(0, Lk, block):
        s = (q @ k[:, :, j : j + block].swapaxes(-1, -2)) * scale  # (B, H, Lq, bk)
        if mask is not None:
            s = np.where(mask[..., j : j + block], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)  # a row that has seen only -inf
        alpha = np.exp(m - shift)
        e = np.exp(s - shift)
        l = alpha * l + e.sum(axis=-1, keepdims=True)  # noqa: E741
        acc = alpha * acc + e @ v[:, :, j : j + block]
        m = m_new
    inv_l = np.where(l > 0, 1.0 / np.where(l > 0, l, 1.0), 0.0)  # 0 for a row with no key allowed
    o = acc * inv_l
    m = np.where(np.isfinite(m), m, 0.0)
    return o, (q, k, v, mask, o, m, inv_l, block)


def flash_attention_backward(d_o, cache):
    q, k, v, mask, o, m, inv_l, block = cache
    scale = 1.0 / np.sqrt(q.shape[-1])
    Lk = k.shape[2]
    if mask is not None:
        mask = np.broadcast_to(mask, (*q.shape[:3], Lk))
    D = (d_o * o).sum(axis=-1, keepdims=True)  # (B, H, Lq, 1): the row term, once
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for j in range(0, Lk, block):
        k_j, v_j = k[:, :, j : j + block], v[:, :, j : j + block]
        s = (q @ k_j.swapaxes(-1, -2)) * scale
        if mask is not None:
            s = np.where(mask[..., j : j + block], s, -np.inf)
        p = np.exp(s - m) * inv_l  # the tile's weights, recomputed
        dv[:, :, j : j + block] = p.swapaxes(-1, -2) @ d_o
        dp = d_o @ v_j.swapaxes(-1, -2)
        ds = p * (dp - D)
        dq = ds @ k_j * scale  # BUG: overwritten by every tile
        dk[:, :, j : j + block] = ds.swapaxes(-1, -2) @ q * scale
    return dq, dk, dv
