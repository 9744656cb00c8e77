# expect: FAIL
# where: scaled_dot_product_attention_backward v
# name: relation factor the number of heads
"""Outside the catalogue: dv averaged over the heads ("each head got a share"): divided by H."""

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
    H = q.shape[1]
    dp = d_out @ v.swapaxes(-1, -2)
    dv = p.swapaxes(-1, -2) @ d_out / H  # BUG: each head has its own v; nothing is shared
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, dv
