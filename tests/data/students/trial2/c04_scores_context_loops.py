# expect: PASS
"""Correct, unusual style: scores by explicit loops over batch and head with np.tensordot; the context with einsum."""

import numpy as np


def attention_scores_forward(q, k, scale):
    B, H, Lq, _ = q.shape
    out = np.empty((B, H, Lq, k.shape[2]))
    for b in range(B):
        for h in range(H):
            out[b, h] = np.tensordot(q[b, h], k[b, h], axes=([1], [1])) * scale  # (Lq, d) x (Lk, d) -> (Lq, Lk)
    return out, (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    dq, dk = np.zeros_like(q), np.zeros_like(k)
    for b, h in np.ndindex(q.shape[:2]):
        g = d_scores[b, h] * scale  # (Lq, Lk)
        dq[b, h] = g @ k[b, h]  # (Lq, Lk) @ (Lk, d)
        dk[b, h] = g.T @ q[b, h]  # (Lk, Lq) @ (Lq, d)
    return dq, dk


def attention_context_forward(p, v):
    return np.einsum("bhqk,bhkd->bhqd", p, v), (p, v)


def attention_context_backward(d_context, cache):
    p, v = cache
    dp = np.einsum("bhqd,bhkd->bhqk", d_context, v)
    dv = np.einsum("bhqk,bhqd->bhkd", p, d_context)
    return dp, dv
