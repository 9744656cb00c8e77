# expect: FAIL
# where: scaled_dot_product_attention_backward q
# name: relation masked-rows
"""Outside the catalogue: the backward recomputes the weights from the cached scores without the forward's guard, so
a fully masked row gives NaN (exp(-inf - -inf)) in the backward only."""

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
    q, k, v, _, s, scale = cache
    e = np.exp(s - s.max(axis=-1, keepdims=True))  # BUG: a row of -inf gives NaN here
    p = e / e.sum(axis=-1, keepdims=True)
    dp = d_out @ v.swapaxes(-1, -2)
    dv = np.nan_to_num(p).swapaxes(-1, -2) @ d_out
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, dv
