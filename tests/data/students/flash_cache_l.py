"""A student's FlashAttention whose forward returns the right output but stores ℓ where the cache holds 1/ℓ; the
backward is right for the cache the notebook describes. The backward FAILs, with a hint that the forward's cache is
the culprit (tests/test_checker.py)."""

import numpy as np


def flash_attention_forward(q, k, v, mask, block):
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale  # the whole score matrix: a forward that is right, not blocked
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)  # noqa: E741
    o = (e / np.where(l > 0, l, 1.0)) @ v
    return o, (q, k, v, mask, o, m, l, block)  # BUG: l, where the backward reads 1/l


def flash_attention_backward(d_o, cache):
    q, k, v, mask, o, m, inv_l, block = cache
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = np.exp(s - m) * inv_l
    dp = d_o @ v.swapaxes(-1, -2)
    ds = p * (dp - (d_o * o).sum(axis=-1, keepdims=True))
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, p.swapaxes(-1, -2) @ d_o
