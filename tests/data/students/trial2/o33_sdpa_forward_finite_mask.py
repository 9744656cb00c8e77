# expect: FAIL
# where: scaled_dot_product_attention_forward out
# name: relation masked-rows
"""Outside the catalogue: blocked scores set to -1e9 instead of -inf, so a fully masked row gets uniform weights (the
mean of v) where the convention is zero weights and zero context; every other row is right."""

import numpy as np


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        s = np.where(mask, s, -1e9)  # BUG: a row with every key blocked stays a softmax over equal scores
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return p @ v, (q, k, v, p)


def scaled_dot_product_attention_backward(d_out, cache):
    q, k, v, p = cache
    dp = d_out @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ d_out
