"""A student's attention backward that returns a gradient of zeros for a bias the call never gave (None belongs)."""

# relation: scaled_dot_product_attention_backward dbias (in scaled_dot_product_attention_backward) is an array of zeros
import numpy as np


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)  # a row with no key allowed: all 0
    return p @ v, (q, k, v, p)  # (B, H, Lq, Lk) @ (B, H, Lk, dv) -> (B, H, Lq, dv)


def scaled_dot_product_attention_backward(d_out, cache):
    q, k, v, p = cache
    dp = d_out @ v.swapaxes(-1, -2)  # (B, H, Lq, dv) @ (B, H, dv, Lk) -> (B, H, Lq, Lk)
    dv = p.swapaxes(-1, -2) @ d_out  # (B, H, Lk, Lq) @ (B, H, Lq, dv) -> (B, H, Lk, dv)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
    dq = ds @ k  # (B, H, Lq, Lk) @ (B, H, Lk, d)
    dk = ds.swapaxes(-1, -2) @ q  # (B, H, Lk, Lq) @ (B, H, Lq, d)
    return dq, dk, dv, np.zeros_like(ds)  # "the bias gradient is zero when there is no bias"
