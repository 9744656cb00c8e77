"""Independent references for the tests: written with einsum and loops, sharing no code with mha_numpy.

- ``einsum_mha``: the module, one einsum per step, whole tensors at once.
- ``per_head_loop``: the module one (batch item, head) at a time, with explicit allowed-key sets (the
  "Σₕ headₕ W_oₕᵀ" reading of the formula).
- ``attention``: the attention alone on (B, H, L, d) arrays, with a float mask, a bias and a keep-mask.
"""

from __future__ import annotations

import numpy as np


def _softmax_rows(s):
    """Softmax over the last axis; rows with no finite entry (all -inf) give zeros, NaN stays NaN."""
    w = np.zeros_like(s)
    has_key = ~np.isneginf(s).all(-1)  # rows with at least one key allowed (or a NaN)
    z = s[has_key] - s[has_key].max(-1, keepdims=True)
    w[has_key] = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    return w


def attention(q, k, v, mask=None, scale=None, bias=None, keep=None, p=0.0):
    """softmax(q kᵀ · scale + bias + mask) (keep / (1 - p)) v -> (context, weights before dropout)."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    w = _softmax_rows(s)
    dropped = w if keep is None else w * keep / (1 - p)
    return np.einsum("bhqk,bhkd->bhqd", dropped, v), w


def einsum_mha(params, query, key, value, mask, H):
    """Straightforward reference: one einsum per step -> (output (B, Lq, E), weights (B, H, Lq, Lk))."""
    E = params["W_q"].shape[0]
    d = E // H

    def proj(x, w, b):
        return np.einsum("bli,oi->blo", x, params[w]) + params.get(b, 0.0)

    def heads(x):  # (B, L, E) -> (B, H, L, d)
        return x.reshape(x.shape[0], x.shape[1], H, d).transpose(0, 2, 1, 3)

    Q, K, V = heads(proj(query, "W_q", "b_q")), heads(proj(key, "W_k", "b_k")), heads(proj(value, "W_v", "b_v"))
    ctx, w = attention(Q, K, V, mask)
    ctx = ctx.transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], E)
    return proj(ctx, "W_o", "b_o"), w


def per_head_loop(params, query, key, value, keep, H):
    """One head and one batch element at a time; ``keep`` (B, H, Lq, Lk) bool = may attend."""
    B, Lq, E = query.shape
    d = E // H
    q = np.einsum("bli,oi->blo", query, params["W_q"]) + params.get("b_q", 0)
    k = np.einsum("bli,oi->blo", key, params["W_k"]) + params.get("b_k", 0)
    v = np.einsum("bli,oi->blo", value, params["W_v"]) + params.get("b_v", 0)
    out = np.zeros((B, Lq, E)) + params.get("b_o", 0)
    weights = np.zeros((B, H, Lq, key.shape[1]))
    for b in range(B):
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            s = np.einsum("id,jd->ij", q[b, :, sl], k[b, :, sl]) / np.sqrt(d)
            allowed = keep[b, h]
            for i in range(Lq):
                if allowed[i].any():
                    z = np.exp(s[i, allowed[i]] - s[i, allowed[i]].max())
                    weights[b, h, i, allowed[i]] = z / z.sum()
            out[b] += (weights[b, h] @ v[b, :, sl]) @ params["W_o"][:, sl].T  # Σₕ headₕ W_oₕᵀ
    return out, weights
