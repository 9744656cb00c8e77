# expect: FAIL
# where: scaled_dot_product_attention_backward q
# name: relation factor 1/√d
"""Near scores_no_scale, inside attention: the forward scales by 1/√d, the backward by 1/d (the student
"recomputed" the scale as 1 / q.shape[-1]), so dq and dk are 1/√d times the right ones; dv is right."""

import numpy as np


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    d = q.shape[-1]
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    tot = e.sum(axis=-1, keepdims=True)
    p = e / np.where(tot > 0, tot, 1.0)
    return p @ v, (q, k, v, p)


def scaled_dot_product_attention_backward(d_out, cache):
    q, k, v, p = cache
    dv = np.einsum("bhqk,bhqd->bhkd", p, d_out)
    dp = np.einsum("bhqd,bhkd->bhqk", d_out, v)
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
    ds = ds / q.shape[-1]  # BUG: 1/d, the forward used 1/sqrt(d)
    dq = np.einsum("bhqk,bhkd->bhqd", ds, k)
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q)
    return dq, dk, dv
