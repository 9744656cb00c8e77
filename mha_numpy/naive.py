"""The textbook version: a Python loop over batch and heads, each head its own small matmuls.

This is the formula of "Attention Is All You Need" read literally,

    head_h = softmax(Q_h K_hᵀ / sqrt(d) + mask) V_h      with Q_h = query W_q,hᵀ + b_q,h  (one head's rows of W_q)
    output = concat(head_1, ..., head_H) W_oᵀ + b_o  =  Σ_h head_h W_o[:, h]ᵀ + b_o

one (batch item, head) at a time, with the same step functions as ``functional`` applied to 2-D
(L, ·) arrays. It gives the same numbers as the vectorized path (``attention.py``) and is the
baseline of the benchmark: the loop issues B·H small products instead of a few large ones, and
each head still builds its full (Lq, Lk) score matrix. Same cache and gradients as the vectorized
path; use it to read, not to run. The backward walks the same loops, each line reversing a forward line.
"""

from __future__ import annotations

import numpy as np

from . import functional as F
from ._checks import as_float_array, check_dropout, check_mask
from .attention import MHACache

# --------------------------------------------------------------------------- one head


def head_forward(q, k, v, mask, scale: float, keep, dropout_p: float):
    """One head: softmax(q kᵀ · scale + mask) v.

    q: (Lq, d)   k: (Lk, d)   v: (Lk, dv)   mask: None or broadcastable to (Lq, Lk)
    keep: None or bool (Lq, Lk) dropout keep-mask   ->   context (Lq, dv), cache
    """
    scores = q @ k.T * scale  # F1: (Lq, d) @ (d, Lk) -> (Lq, Lk)
    masked, c_mask = F.apply_mask_forward(scores, mask)  # F2: (Lq, Lk), -inf where blocked
    weights, c_soft = F.softmax_forward(masked)  # F3: (Lq, Lk), each row sums to 1 (or is 0)
    dropped, c_drop = F.dropout_forward(weights, dropout_p, keep_mask=keep)  # F4: (Lq, Lk)
    context = dropped @ v  # F5: (Lq, Lk) @ (Lk, dv) -> (Lq, dv)
    return context, (q, k, v, scale, c_mask, c_soft, c_drop, dropped, scores, masked, weights)


def head_backward(d_context, cache):
    """d_context (Lq, dv) -> dq (Lq, d), dk (Lk, d), dv (Lk, dv) for one head."""
    q, k, v, scale, c_mask, c_soft, c_drop, dropped = cache[:8]
    d_dropped = d_context @ v.T  # ← F5: (Lq, dv) @ (dv, Lk) -> (Lq, Lk)
    dv = dropped.T @ d_context  # ← F5: (Lk, Lq) @ (Lq, dv) -> (Lk, dv)
    d_weights = F.dropout_backward(d_dropped, c_drop)  # ← F4: (Lq, Lk)
    d_masked = F.softmax_backward(d_weights, c_soft)  # ← F3: p ∘ (dp - Σ p dp), (Lq, Lk)
    d_scores = F.apply_mask_backward(d_masked, c_mask) * scale  # ← F2, F1 (the scale): (Lq, Lk)
    dq = d_scores @ k  # ← F1: (Lq, Lk) @ (Lk, d) -> (Lq, d)
    dk = d_scores.T @ q  # ← F1: (Lk, Lq) @ (Lq, d) -> (Lk, d)
    return dq, dk, dv


def _keep_mask(shape, dropout_p: float, rng, dropout_mask):
    """The (B, H, Lq, Lk) keep-mask drawn exactly as ``functional.dropout_forward`` draws it, or None."""
    keep = check_dropout(shape, dropout_p, rng, dropout_mask)
    if keep is not None or dropout_p == 0.0:
        return keep
    return rng.random(shape) >= dropout_p  # (B, H, Lq, Lk) True = keep


def _loop_heads(q, k, v, mask, scale, keep, dropout_p, context):
    """Run head_forward for every (b, h); fill context (B, H, Lq, dv); return the AttentionCache."""
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    full_mask = None if mask is None else np.broadcast_to(mask, (B, H, Lq, Lk))  # a view, no copy
    dt = context.dtype
    scores, masked, weights = (np.empty((B, H, Lq, Lk), dtype=dt) for _ in range(3))
    heads = {}
    for b in range(B):
        for h in range(H):
            mask_bh = None if mask is None else full_mask[b, h]  # (Lq, Lk)
            keep_bh = None if keep is None else keep[b, h]  # (Lq, Lk)
            context[b, h], heads[b, h] = head_forward(q[b, h], k[b, h], v[b, h], mask_bh, scale, keep_bh, dropout_p)
            scores[b, h], masked[b, h], weights[b, h] = heads[b, h][8:]
    return F.AttentionCache(scores, masked, weights, keep, _caches=(heads,), impl="naive")


# --------------------------------------------------------------------------- attention on (B, H, L, d)


def attention_forward(q, k, v, mask=None, scale=None, dropout_p=0.0, rng=None, dropout_mask=None):
    """Same contract as ``functional.scaled_dot_product_attention_forward``, one head at a time.

    q: (B, H, Lq, d)   k: (B, H, Lk, d)   v: (B, H, Lk, dv)   -> context (B, H, Lq, dv), AttentionCache
    """
    q, k, v = F._check_qkv(q, k, v)  # the same checks as the vectorized path
    B, H, Lq, d = q.shape
    mask = check_mask(mask, (B, H, Lq, k.shape[2]))
    keep = _keep_mask((B, H, Lq, k.shape[2]), dropout_p, rng, dropout_mask)
    scale = 1.0 / float(np.sqrt(d)) if scale is None else float(scale)  # a Python float keeps float32
    context = np.empty((B, H, Lq, v.shape[3]), dtype=np.result_type(q, k, v))
    cache = _loop_heads(q, k, v, mask, scale, keep, dropout_p, context)
    return context, cache


def attention_backward(d_context, cache: F.AttentionCache):
    """d_context (B, H, Lq, dv) -> dq (B, H, Lq, d), dk (B, H, Lk, d), dv (B, H, Lk, dv)."""
    (heads,) = cache._caches
    d_context = as_float_array(d_context, "d_context", ndim=4)
    q0, k0, v0 = heads[0, 0][:3]
    B, H = d_context.shape[:2]
    dq = np.empty((B, H) + q0.shape, dtype=d_context.dtype)
    dk = np.empty((B, H) + k0.shape, dtype=d_context.dtype)
    dv = np.empty((B, H) + v0.shape, dtype=d_context.dtype)
    for b in range(B):
        for h in range(H):
            dq[b, h], dk[b, h], dv[b, h] = head_backward(d_context[b, h], heads[b, h])
    return dq, dk, dv


# --------------------------------------------------------------------------- the module, one head at a time


def mha_forward(mha, query, key, value, mask, dropout_p: float, dropout_mask):
    """``MultiHeadAttention.forward`` with impl="naive" (inputs already checked by the module).

    query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim) -> output (B, Lq, E), MHACache.
    Head h uses rows h·d ... (h+1)·d - 1 of W_q, W_k, W_v (and of their biases), and the same
    columns of W_o.
    """
    P, H, d = mha.params, mha.num_heads, mha.head_dim
    B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
    keep = _keep_mask((B, H, Lq, Lk), dropout_p, mha.rng, dropout_mask)
    full_mask = None if mask is None else np.broadcast_to(mask, (B, H, Lq, Lk))
    scale = 1.0 / float(np.sqrt(d))  # a Python float keeps float32
    dt = mha.dtype
    Q, K, V, context = (np.empty((B, H, n, d), dtype=dt) for n in (Lq, Lk, Lk, Lq))
    output = np.zeros((B, Lq, mha.embed_dim), dtype=dt)

    def bias(name, rows):
        return P[name][rows] if mha.bias else 0.0

    heads = {}
    for b in range(B):
        for h in range(H):
            r = slice(h * d, (h + 1) * d)  # this head's rows of W_q, W_k, W_v; columns of W_o
            Q[b, h] = query[b] @ P["W_q"][r].T + bias("b_q", r)  # F1: (Lq, E) @ (E, d) -> (Lq, d)
            K[b, h] = key[b] @ P["W_k"][r].T + bias("b_k", r)  # F2: (Lk, kdim) @ (kdim, d) -> (Lk, d)
            V[b, h] = value[b] @ P["W_v"][r].T + bias("b_v", r)  # F3: (Lk, vdim) @ (vdim, d) -> (Lk, d)
            mask_bh = None if mask is None else full_mask[b, h]  # (Lq, Lk)
            keep_bh = None if keep is None else keep[b, h]  # (Lq, Lk)
            context[b, h], heads[b, h] = head_forward(Q[b, h], K[b, h], V[b, h], mask_bh, scale, keep_bh, dropout_p)
            output[b] += context[b, h] @ P["W_o"][:, r].T  # F4: (Lq, d) @ (d, E) -> (Lq, E), Σ over heads
        if mha.bias:
            output[b] += P["b_o"]  # F5: (Lq, E) + (E,)

    scores, masked, weights = (np.empty((B, H, Lq, Lk), dtype=dt) for _ in range(3))
    for (b, h), c in heads.items():
        scores[b, h], masked[b, h], weights[b, h] = c[8:]
    attention = F.AttentionCache(scores, masked, weights, keep, _caches=(heads,), impl="naive")
    caches = dict(query=query, key=key, value=value)
    return output, MHACache(Q=Q, K=K, V=V, attention=attention, context=context, _caches=caches, impl="naive")


def mha_backward(mha, d_output, cache: MHACache) -> dict[str, np.ndarray]:
    """``MultiHeadAttention.backward`` for impl="naive": the same loops, each line reversing one forward line."""
    P, H, d = mha.params, mha.num_heads, mha.head_dim
    query, key, value = cache._caches["query"], cache._caches["key"], cache._caches["value"]
    (heads,) = cache.attention._caches
    g = {name: np.zeros_like(x) for name, x in (("query", query), ("key", key), ("value", value))}
    g.update({name: np.zeros_like(param) for name, param in P.items()})
    for b in range(query.shape[0]):
        if mha.bias:
            g["b_o"] += d_output[b].sum(axis=0)  # ← F5: (E,)
        for h in range(H):
            r = slice(h * d, (h + 1) * d)
            d_context = d_output[b] @ P["W_o"][:, r]  # ← F4: (Lq, E) @ (E, d) -> (Lq, d)
            g["W_o"][:, r] += d_output[b].T @ cache.context[b, h]  # ← F4: (E, Lq) @ (Lq, d) -> (E, d)
            dQ, dK, dV = head_backward(d_context, heads[b, h])  # (Lq, d), (Lk, d), (Lk, d)
            for x, dX, name, w in ((query, dQ, "query", "q"), (key, dK, "key", "k"), (value, dV, "value", "v")):
                g[name][b] += dX @ P["W_" + w][r]  # ← F1-F3: (L, d) @ (d, in) -> (L, in)
                g["W_" + w][r] += dX.T @ x[b]  # ← F1-F3: (d, L) @ (L, in) -> (d, in)
                if mha.bias:
                    g["b_" + w][r] += dX.sum(axis=0)  # ← F1-F3: (d,)
    return g
