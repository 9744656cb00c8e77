# expect: PASS
"""Correct, unusual style: self-attention built from small layer objects (each with forward and backward, as a
framework would), attention through one helper used by both pairs, and the online-softmax update written on copies
with np.multiply(..., out=)."""

import numpy as np


class Linear:
    def __init__(self, W, b):
        self.W, self.b = W, b

    def forward(self, x):
        return x @ self.W.T + self.b, x

    def backward(self, d, x):
        rows = d.reshape(-1, d.shape[-1])  # (N, out)
        return d @ self.W, rows.T @ x.reshape(-1, x.shape[-1]), rows.sum(axis=0)


def _attend(q, k, v, mask):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    alive = np.isfinite(s).any(axis=-1, keepdims=True)
    e = np.exp(s - np.where(alive, s.max(axis=-1, keepdims=True), 0.0))
    p = e / np.where(alive, e.sum(axis=-1, keepdims=True), 1.0)
    return p @ v, p


def _attend_back(d_out, q, k, v, p):
    dp = d_out @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ d_out


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    out, p = _attend(q, k, v, mask)
    return out, (q, k, v, p)


def scaled_dot_product_attention_backward(d_out, cache):
    return _attend_back(d_out, *cache)


def self_attention_forward(x, params, num_heads, mask=None):
    layers = {n: Linear(params[f"W_{n}"], params[f"b_{n}"]) for n in "qkvo"}
    B, L, E = x.shape
    heads = {}
    for n in "qkv":
        y, _ = layers[n].forward(x)
        heads[n] = y.reshape(B, L, num_heads, E // num_heads).transpose(0, 2, 1, 3)  # (B, H, L, D)
    ctx, p = _attend(heads["q"], heads["k"], heads["v"], mask)
    merged = ctx.transpose(0, 2, 1, 3).reshape(B, L, E)
    out, _ = layers["o"].forward(merged)
    return out, (layers, x, heads, p, merged)


def self_attention_backward(d_out, cache):
    layers, x, heads, p, merged = cache
    B, L, E = x.shape
    g = {}
    d_merged, g["W_o"], g["b_o"] = layers["o"].backward(d_out, merged)
    d_ctx = d_merged.reshape(B, L, -1, heads["q"].shape[-1]).transpose(0, 2, 1, 3)
    d_heads = dict(zip("qkv", _attend_back(d_ctx, heads["q"], heads["k"], heads["v"], p)))
    g["x"] = np.zeros_like(x)
    for n in "qkv":
        d_y = d_heads[n].transpose(0, 2, 1, 3).reshape(B, L, E)
        d_x, g[f"W_{n}"], g[f"b_{n}"] = layers[n].backward(d_y, x)
        g["x"] += d_x
    return g


def online_softmax_update(m, l, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha = np.exp(m - shift)
    l_new = np.multiply(l, alpha, out=np.empty_like(l))  # on new arrays: the caller's stay as they are
    acc_new = np.multiply(acc, alpha, out=np.empty(np.broadcast_shapes(acc.shape, alpha.shape)))
    e = np.exp(s - shift)
    l_new += e.sum(axis=-1, keepdims=True)
    acc_new += e @ v
    return m_new, l_new, acc_new
