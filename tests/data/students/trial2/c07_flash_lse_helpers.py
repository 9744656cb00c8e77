# expect: PASS
"""Correct, unusual style: FlashAttention with a tile generator, in-place updates of its own running sums, and the
log-sum-exp kept in the cache (one array) in place of m and 1/l."""

import numpy as np


def _tiles(k, v, mask, block):
    for j in range(0, k.shape[2], block):
        cut = slice(j, j + block)
        yield cut, k[:, :, cut], v[:, :, cut], None if mask is None else mask[..., cut]


def _scores(q, k_j, mask_j, scale):
    s = (q @ k_j.swapaxes(-1, -2)) * scale  # (B, H, Lq, bk)
    return s if mask_j is None else np.where(mask_j, s, -np.inf)


def flash_attention_forward(q, k, v, mask, block):
    scale = 1.0 / np.sqrt(q.shape[-1])
    if mask is not None:
        mask = np.broadcast_to(mask, q.shape[:3] + (k.shape[2],))
    m = np.full(q.shape[:3] + (1,), -np.inf)
    l = np.zeros(q.shape[:3] + (1,))
    acc = np.zeros(q.shape[:3] + (v.shape[-1],))
    for _, k_j, v_j, mask_j in _tiles(k, v, mask, block):
        s = _scores(q, k_j, mask_j, scale)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isneginf(m_new), 0.0, m_new)
        alpha = np.exp(m - shift)
        e = np.exp(s - shift)
        l *= alpha
        l += e.sum(axis=-1, keepdims=True)
        acc *= alpha
        acc += e @ v_j
        m = m_new
    seen = l > 0
    o = acc / np.where(seen, l, 1.0)
    lse = np.where(seen, np.where(np.isneginf(m), 0.0, m) + np.log(np.where(seen, l, 1.0)), np.inf)
    return o, (q, k, v, mask, o, lse, block)


def flash_attention_backward(d_o, cache):
    q, k, v, mask, o, lse, block = cache
    scale = 1.0 / np.sqrt(q.shape[-1])
    D = np.einsum("bhqd,bhqd->bhq", d_o, o)[..., None]  # (B, H, Lq, 1)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for cut, k_j, v_j, mask_j in _tiles(k, v, mask, block):
        p = np.exp(_scores(q, k_j, mask_j, scale) - lse)  # exp(-inf) and exp(x - inf): 0
        dv[:, :, cut] = p.swapaxes(-1, -2) @ d_o
        ds = p * (d_o @ v_j.swapaxes(-1, -2) - D)
        dq += ds @ k_j * scale
        dk[:, :, cut] = ds.swapaxes(-1, -2) @ q * scale
    return dq, dk, dv
