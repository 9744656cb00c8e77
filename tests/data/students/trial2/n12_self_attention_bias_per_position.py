# expect: FAIL
# where: self_attention_backward b_v
# name: relation sum-missing
"""Near bias_batch_only: in a hand-written self-attention, the value bias's gradient left per position (B, L, E)."""

import numpy as np


def _split(t, H):
    B, L, E = t.shape
    return t.reshape(B, L, H, E // H).transpose(0, 2, 1, 3)  # (B, H, L, D)


def _merge(t):
    B, H, L, D = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, L, H * D)  # (B, L, E)


def self_attention_forward(x, params, num_heads, mask=None):
    P = params
    q, k, v = (x @ P[f"W_{n}"].T + P[f"b_{n}"] for n in "qkv")  # (B, L, E) each
    qh, kh, vh = (_split(t, num_heads) for t in (q, k, v))
    scale = 1.0 / np.sqrt(qh.shape[-1])
    s = qh @ kh.swapaxes(-1, -2) * scale  # (B, H, L, L)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    w = e / e.sum(axis=-1, keepdims=True)
    merged = _merge(w @ vh)
    out = merged @ P["W_o"].T + P["b_o"]
    return out, (x, P, qh, kh, vh, w, merged, scale)


def self_attention_backward(d_out, cache):
    x, P, qh, kh, vh, w, merged, scale = cache
    E = x.shape[-1]
    X = x.reshape(-1, E)
    g = {"W_o": d_out.reshape(-1, E).T @ merged.reshape(-1, E), "b_o": d_out.sum(axis=(0, 1))}
    d_ctx = _split(d_out @ P["W_o"], qh.shape[1])
    d_w = d_ctx @ vh.swapaxes(-1, -2)
    d_vh = w.swapaxes(-1, -2) @ d_ctx
    d_s = w * (d_w - (w * d_w).sum(axis=-1, keepdims=True))
    d_qh, d_kh = d_s @ kh * scale, d_s.swapaxes(-1, -2) @ qh * scale
    dx = np.zeros_like(x)
    for n, d_h in (("q", d_qh), ("k", d_kh), ("v", d_vh)):
        d_t = _merge(d_h)  # (B, L, E)
        g[f"W_{n}"] = d_t.reshape(-1, E).T @ X
        g[f"b_{n}"] = d_t if n == "v" else d_t.sum(axis=(0, 1))  # BUG: b_v's sum over the tokens forgotten
        dx += d_t @ P[f"W_{n}"]
    g["x"] = dx
    return g
