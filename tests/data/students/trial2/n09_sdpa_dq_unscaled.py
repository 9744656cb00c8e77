# expect: FAIL
# where: scaled_dot_product_attention_backward q
# name: relation factor 1/√d
"""Near scores_no_scale: in a hand-written attention the 1/√d is applied to dk and forgotten on dq."""

import numpy as np


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale  # (B, H, Lq, Lk)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    p = e / np.where(z > 0, z, 1.0)  # a fully masked row: all 0
    return p @ v, (q, k, v, p, s, scale)


def scaled_dot_product_attention_backward(d_out, cache):
    q, k, v, p, s, scale = cache
    dp = d_out @ v.swapaxes(-1, -2)  # (B, H, Lq, Lk)
    dv = p.swapaxes(-1, -2) @ d_out
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = ds @ k  # BUG: the scores were multiplied by scale
    dk = ds.swapaxes(-1, -2) @ q * scale
    return dq, dk, dv
