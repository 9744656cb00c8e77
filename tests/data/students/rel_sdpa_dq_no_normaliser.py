"""A student's attention backward that writes dq's score gradient without the softmax's −D term (dk uses the right
one): the two were computed in two places and only one was corrected."""

# relation: scaled_dot_product_attention_backward dq (in scaled_dot_product_attention_backward) lacks the contribution
#   of the −p ∘ Σ(p ∘ dp) term
import numpy as np


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    scale = q.shape[-1] ** -0.5
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale  # (B, H, Lq, Lk)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    return np.einsum("bhqk,bhkd->bhqd", p, v), (q, k, v, p, scale)  # (B, H, Lq, dv)


def scaled_dot_product_attention_backward(d_out, cache):
    q, k, v, p, scale = cache
    dp = np.einsum("bhqd,bhkd->bhqk", d_out, v)  # (B, H, Lq, Lk)
    dv = np.einsum("bhqk,bhqd->bhkd", p, d_out)  # (B, H, Lk, dv)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # (B, H, Lq, Lk)
    dq = np.einsum("bhqk,bhkd->bhqd", p * dp, k) * scale  # the −D term forgotten here only
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q) * scale
    return dq, dk, dv
