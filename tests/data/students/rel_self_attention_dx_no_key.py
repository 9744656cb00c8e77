"""A student's self-attention backward (plain NumPy, a dict of gradients) whose dx adds the query and value paths
and forgets the key's."""

# relation: self_attention_backward dx (in self_attention_backward) lacks the contribution of the key path
import numpy as np


def _heads(t, H):
    B, L, E = t.shape
    return t.reshape(B, L, H, E // H).transpose(0, 2, 1, 3)  # (B, L, H, d) -> (B, H, L, d)


def _merge(t):
    B, H, L, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, L, H * d)  # (B, H, L, d) -> (B, L, E)


def self_attention_forward(x, params, num_heads, mask=None):
    P = params
    q, k, v = (_heads(x @ P[f"W_{n}"].T + P[f"b_{n}"], num_heads) for n in "qkv")  # (B, H, L, d) each
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale  # (B, H, L, L)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    merged = _merge(p @ v)  # (B, L, E)
    out = merged @ P["W_o"].T + P["b_o"]
    return out, (x, P, q, k, v, p, merged, scale)


def self_attention_backward(d_out, cache):
    x, P, q, k, v, p, merged, scale = cache
    E = x.shape[-1]
    g = {"W_o": d_out.reshape(-1, E).T @ merged.reshape(-1, E), "b_o": d_out.sum(axis=(0, 1))}
    d_ctx = _heads(d_out @ P["W_o"], q.shape[1])  # (B, H, L, d)
    dp = d_ctx @ v.swapaxes(-1, -2)  # (B, H, L, L)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * scale
    d = {"q": _merge(ds @ k), "k": _merge(ds.swapaxes(-1, -2) @ q), "v": _merge(p.swapaxes(-1, -2) @ d_ctx)}
    for n in "qkv":
        g[f"W_{n}"] = d[n].reshape(-1, E).T @ x.reshape(-1, E)  # (E, N) @ (N, E)
        g[f"b_{n}"] = d[n].sum(axis=(0, 1))
    g["x"] = d["q"] @ P["W_q"] + d["v"] @ P["W_v"]  # the key's path, d["k"] @ P["W_k"], is missing
    return g
