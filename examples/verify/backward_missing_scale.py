"""BUG: the backward forgets the scale: dq = dS K and dk = dSᵀ q instead of dS K · scale and dSᵀ q · scale. The forward
is right, so every forward check passes; the gradients of q and k are 1/scale = sqrt(d) times too large.

    python -m mha_numpy verify examples/verify/backward_missing_scale.py:attention
    -> FAIL on every case (scale = 1 excepted) in dq and dk, detected "backward scale missing".
"""

import numpy as np


def _kv(x, H):
    """(B, Hkv, L, d) -> (B, H, L, d): query head h reads key/value head h // (H / Hkv) (grouped-query attention)."""
    return np.repeat(x, H // x.shape[1], axis=1)


def _weights(q, k, mask, scale, is_causal):
    """softmax(q kᵀ · scale + mask) (B, H, Lq, Lk), and the scores' blocked entries."""
    s = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, Lq, Lk)
    Lq, Lk = s.shape[-2:]
    blocked = np.zeros(s.shape, dtype=bool)
    if mask is not None and mask.dtype == np.bool_:
        blocked |= ~mask  # True = may attend
    elif mask is not None:
        s = s + mask  # a float mask is added
    if is_causal:  # bottom-right: query i sits at position i + Lk - Lq
        blocked |= np.arange(Lk)[None, :] > np.arange(Lq)[:, None] + (Lk - Lq)
    s = np.where(blocked, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0, m))  # the row max subtracted; a fully masked row is all 0
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1, total), np.isneginf(s)  # a fully masked row: zero weights, never NaN


def _setup(q, k, v, mask, scale, is_causal, dropout_p, dropout_mask):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    K, V = _kv(k, q.shape[1]), _kv(v, q.shape[1])
    p, blocked = _weights(q, K, mask, scale, is_causal)
    keep = 1.0 if dropout_mask is None else (dropout_mask / (1.0 - dropout_p)).astype(q.dtype)  # inverted dropout
    return scale, K, V, p, blocked, keep


def attention(q, k, v, mask=None, scale=None, is_causal=False, dropout_p=0.0, dropout_mask=None):
    """q (B, H, Lq, d), k, v (B, Hkv, Lk, d) -> out (B, H, Lq, d), weights (B, H, Lq, Lk) before dropout."""
    _, _, V, p, _, keep = _setup(q, k, v, mask, scale, is_causal, dropout_p, dropout_mask)
    return (p * keep) @ V, p


def attention_vjp(q, k, v, d_out, mask=None, scale=None, is_causal=False, dropout_p=0.0, dropout_mask=None):
    """d_out (B, H, Lq, d) -> dq (B, H, Lq, d), dk, dv (B, Hkv, Lk, d)."""
    scale, K, V, p, blocked, keep = _setup(q, k, v, mask, scale, is_causal, dropout_p, dropout_mask)
    dV = (p * keep).swapaxes(-1, -2) @ d_out  # (B, H, Lk, d)
    dp = (d_out @ V.swapaxes(-1, -2)) * keep  # (B, H, Lq, Lk), through dropout
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # the softmax's VJP
    ds = np.where(blocked, 0, ds)
    dq, dK = ds @ K, ds.swapaxes(-1, -2) @ q  # BUG: no scale
    B, Hkv, Lk, d = k.shape
    group = lambda g: g.reshape(B, Hkv, -1, Lk, g.shape[-1]).sum(axis=2)  # noqa: E731 - each kv head's query heads
    return dq, group(dK), group(dV)
