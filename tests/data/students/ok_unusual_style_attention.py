"""A correct student's attention in unusual styles: einsum throughout, the softmax's row term D taken as
rowsum(dO ∘ O), heads split with moveaxis, the sink as one more column of the softmax: every function passes and no
relation is said (tests/test_checker_relations.py)."""

import numpy as np


def split_heads_forward(x, num_heads):
    B, L, E = x.shape
    return np.moveaxis(x.reshape(B, L, num_heads, -1), 2, 1), x.shape  # (B, H, L, d)


def split_heads_backward(d_out, cache):
    return np.moveaxis(d_out, 1, 2).reshape(cache)


def merge_heads_forward(x):
    return np.einsum("bhld->blhd", x).reshape(x.shape[0], x.shape[2], -1), x.shape


def merge_heads_backward(d_out, cache):
    B, H, L, d = cache
    return np.einsum("blhd->bhld", d_out.reshape(B, L, H, d))


def attention_scores_forward(q, k, scale):
    return scale * np.einsum("...qd,...kd->...qk", q, k), (q, k, scale)


def attention_scores_backward(d_scores, cache):
    q, k, scale = cache
    return scale * np.einsum("...qk,...kd->...qd", d_scores, k), scale * np.einsum("...qk,...qd->...kd", d_scores, q)


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    allowed = np.ones(s.shape, dtype=bool) if mask is None else np.broadcast_to(mask, s.shape)
    s = np.where(allowed, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = np.sum(e, axis=-1, keepdims=True)
    p = e / np.maximum(total, np.finfo(float).tiny)  # a row with no key: 0 / tiny = 0
    o = np.einsum("bhqk,bhkd->bhqd", p, v)
    return o, (q, k, v, p, o)


def scaled_dot_product_attention_backward(d_o, cache):
    q, k, v, p, o = cache
    D = np.einsum("bhqd,bhqd->bhq", d_o, o)[..., None]  # rowsum(dO ∘ O) = Σ p ∘ dp
    ds = p * (np.einsum("bhqd,bhkd->bhqk", d_o, v) - D) / np.sqrt(q.shape[-1])
    dq = np.einsum("bhqk,bhkd->bhqd", ds, k)
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q)
    dv = np.einsum("bhqk,bhqd->bhkd", p, d_o)
    return dq, dk, dv


def sink_softmax_forward(x, sink):
    col = np.broadcast_to(np.asarray(sink, dtype=float), x.shape[:-1])[..., None]  # (..., 1): the sink's logit
    ext = np.concatenate([x, col], axis=-1)  # (..., Lk + 1)
    e = np.exp(ext - ext.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return p[..., :-1], (p, np.shape(sink))


def sink_softmax_backward(dp, cache):
    p, sink_shape = cache
    dp_ext = np.concatenate([dp, np.zeros(dp.shape[:-1] + (1,))], axis=-1)  # the sink's weight is dropped: dp 0
    d_ext = p * (dp_ext - np.sum(p * dp_ext, axis=-1, keepdims=True))
    d_sink = d_ext[..., -1]  # (...,)
    lead = d_sink.ndim - len(sink_shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(sink_shape) if n == 1)
    return d_ext[..., :-1], np.sum(d_sink, axis=axes, keepdims=True).reshape(sink_shape)
