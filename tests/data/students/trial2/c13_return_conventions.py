# expect: PASS
"""Correct, unusual conventions the checker accepts: a list of gradients, a dict of gradients by input name, one
gradient per differentiable input with None for the bias the call did not give, a dataclass as the cache."""

from dataclasses import dataclass

import numpy as np


@dataclass
class LinearCache:
    x: np.ndarray
    W: np.ndarray


def linear_forward(x, W, b):
    return x @ W.T + b, LinearCache(x, W)


def linear_backward(dy, cache):
    rows = dy.reshape(-1, dy.shape[-1])
    return [dy @ cache.W, rows.T @ cache.x.reshape(-1, cache.x.shape[-1]), rows.sum(axis=0)]


def attention_scores_forward(q, k, scale):
    return q @ k.swapaxes(-1, -2) * scale, {"q": q, "k": k, "scale": scale}


def attention_scores_backward(d_scores, cache):
    d = d_scores * cache["scale"]
    return {"k": d.swapaxes(-1, -2) @ cache["q"], "q": d @ cache["k"]}


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    z = e.sum(axis=-1, keepdims=True)
    p = e / np.where(z > 0, z, 1.0)
    return p @ v, (q, k, v, p)


def scaled_dot_product_attention_backward(d_out, cache):
    q, k, v, p = cache
    dp = d_out @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ d_out, None  # no bias was given
