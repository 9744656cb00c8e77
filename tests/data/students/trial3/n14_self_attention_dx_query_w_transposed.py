# expect: FAIL
# where: self_attention_backward x
# name: relation path
"""Near linear_swapped_dw, on a square weight inside self-attention: the query path's dx is taken through W_qᵀ
(dq @ W_q.T, as if the forward were x @ W_q) while the key and value paths use W right; W_q is (E, E), so no
shape complains. Every parameter's gradient is right; dx is off on the query's path only."""

import numpy as np


def _heads(t, H):
    B, L, E = t.shape
    return t.reshape(B, L, H, E // H).transpose(0, 2, 1, 3)  # (B, L, E) -> (B, H, L, D)


def _unheads(t):
    B, H, L, D = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, L, H * D)  # (B, H, L, D) -> (B, L, E)


def self_attention_forward(x, params, num_heads, mask=None):
    W = params
    q = _heads(x @ W["W_q"].T + W["b_q"], num_heads)
    k = _heads(x @ W["W_k"].T + W["b_k"], num_heads)
    v = _heads(x @ W["W_v"].T + W["b_v"], num_heads)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])  # (B, H, L, L)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
    z = e.sum(-1, keepdims=True)
    p = e / np.where(z > 0, z, 1.0)
    merged = _unheads(p @ v)
    out = merged @ W["W_o"].T + W["b_o"]
    return out, (x, W, q, k, v, p, merged)


def self_attention_backward(d_out, cache):
    x, W, q, k, v, p, merged = cache
    H = q.shape[1]
    E = x.shape[-1]
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    g = {"W_o": flat(d_out).T @ flat(merged), "b_o": flat(d_out).sum(0)}
    d_ctx = _heads(d_out @ W["W_o"], H)
    dp = d_ctx @ v.transpose(0, 1, 3, 2)
    dv = p.transpose(0, 1, 3, 2) @ d_ctx
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
    dx = np.zeros_like(x)
    for name, d in (("q", dq), ("k", dk), ("v", dv)):
        d = _unheads(d)  # (B, L, E)
        g["W_" + name] = flat(d).T @ flat(x)
        g["b_" + name] = flat(d).sum(0)
        Wn = W["W_q"].T if name == "q" else W["W_" + name]  # BUG: the query's weight transposed
        dx += (d.reshape(-1, E) @ Wn).reshape(x.shape)
    g["x"] = dx
    return g
