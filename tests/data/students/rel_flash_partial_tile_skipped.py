"""A student's FlashAttention backward whose loop over the key blocks stops before a last, partial block (the
forward's loop is right): Lk = 7 with blocks of 3 loses key 6."""

# relation: flash_attention_backward dq (in flash_attention_backward) lacks the contribution of key block 2 (keys 6 to
#   6, the last and partial one)'s tile
import numpy as np


def flash_attention_forward(q, k, v, mask, block):
    scale = 1.0 / np.sqrt(q.shape[-1])
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    mask = None if mask is None else np.broadcast_to(mask, (B, H, Lq, Lk))
    m, l, acc = np.full((B, H, Lq, 1), -np.inf), np.zeros((B, H, Lq, 1)), np.zeros((B, H, Lq, v.shape[-1]))  # noqa: E741
    for j in range(0, Lk, block):
        s = (q @ k[:, :, j : j + block].swapaxes(-1, -2)) * scale  # (B, H, Lq, bk)
        if mask is not None:
            s = np.where(mask[..., j : j + block], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)
        alpha, e = np.exp(m - shift), np.exp(s - shift)
        l, acc, m = alpha * l + e.sum(axis=-1, keepdims=True), alpha * acc + e @ v[:, :, j : j + block], m_new  # noqa: E741
    inv_l = np.where(l > 0, 1.0 / np.where(l > 0, l, 1.0), 0.0)
    o = acc * inv_l
    return o, (q, k, v, mask, o, np.where(np.isfinite(m), m, 0.0), inv_l, block)


def flash_attention_backward(d_o, cache):
    q, k, v, mask, o, m, inv_l, block = cache
    scale = 1.0 / np.sqrt(q.shape[-1])
    Lk = k.shape[2]
    D = (d_o * o).sum(axis=-1, keepdims=True)  # (B, H, Lq, 1)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for j in range(0, Lk - block + 1, block):  # "whole tiles only": the last, partial one is skipped
        k_j, v_j = k[:, :, j : j + block], v[:, :, j : j + block]
        s = (q @ k_j.swapaxes(-1, -2)) * scale
        if mask is not None:
            s = np.where(mask[..., j : j + block], s, -np.inf)
        p = np.exp(s - m) * inv_l
        dv[:, :, j : j + block] = p.swapaxes(-1, -2) @ d_o
        ds = p * (d_o @ v_j.swapaxes(-1, -2) - D)
        dq += ds @ k_j * scale
        dk[:, :, j : j + block] = ds.swapaxes(-1, -2) @ q * scale
    return dq, dk, dv
