"""Multi-head attention, one step at a time, each step a forward/backward pair.

Every step is ``NAME_forward(...) -> (out, cache)`` followed directly by
``NAME_backward(d_out, cache)``. A backward line names the forward line it reverses (``# ← F1``).
Shapes use B = batch, H = heads, Lq / Lk = query / key length, E = embed dim, d = E / H.
The derivation of every formula is in ``docs/derivation.md``.

Mask convention (the only one used inside mha_numpy): a boolean mask is True where a query
*may attend* to a key; a floating mask is *added* to the scores (use -inf to block).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_float_array, check_dropout, check_mask

# --------------------------------------------------------------------------- linear


def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """y = x Wᵀ + b, with W in PyTorch layout.

    x: (..., in)   W: (out, in)   b: (out,) or None   ->   y: (..., out)
    """
    x = as_float_array(x, "x")
    W = as_float_array(W, "W", ndim=2)
    if x.ndim < 1 or x.shape[-1] != W.shape[1]:
        raise ValueError(
            f"x with shape {x.shape} does not match W with shape {W.shape}: x.shape[-1] must be {W.shape[1]}"
        )
    if b is not None:
        b = as_float_array(b, "b", ndim=1)
        if b.shape[0] != W.shape[0]:
            raise ValueError(f"b with shape {b.shape} does not match W with shape {W.shape}")
    # one GEMM over all leading positions: a stacked (B, L, in) @ (in, out) runs B small products, ~2x slower
    y = (x.reshape(-1, x.shape[-1]) @ W.T).reshape(*x.shape[:-1], W.shape[0])  # F1: (N, in) @ (in, out) -> (..., out)
    if b is not None:
        y = y + b  # F2: (..., out) + (out,)
    return y, (x, W, b is not None)


def linear_backward(dy: np.ndarray, cache):
    """dy: (..., out)  ->  dx: (..., in), dW: (out, in), db: (out,) or None."""
    x, W, has_bias = cache
    x2 = x.reshape(-1, x.shape[-1])  # (N, in), N = product of leading dims
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, out)
    dx = (dy2 @ W).reshape(x.shape)  # ← F1: (N, out) @ (out, in) -> (N, in) -> (..., in)
    dW = dy2.T @ x2  # ← F1: (out, N) @ (N, in) -> (out, in)
    db = dy2.sum(axis=0) if has_bias else None  # ← F2: (out,)
    return dx, dW, db


# --------------------------------------------------------------------------- heads


def split_heads_forward(x: np.ndarray, num_heads: int):
    """(B, L, E) -> (B, H, L, d): head h sees features h*d ... (h+1)*d - 1."""
    x = as_float_array(x, "x", ndim=3)
    B, L, E = x.shape
    if num_heads <= 0 or E % num_heads != 0:
        raise ValueError(f"x with shape {x.shape}: last dim {E} is not divisible by num_heads={num_heads}")
    d = E // num_heads
    out = x.reshape(B, L, num_heads, d)  # F1: (B, L, H, d)
    out = out.transpose(0, 2, 1, 3)  # F2: (B, H, L, d)
    return out, (B, L, E)


def split_heads_backward(d_out: np.ndarray, cache):
    """(B, H, L, d) -> (B, L, E)."""
    B, L, E = cache
    dx = d_out.transpose(0, 2, 1, 3)  # ← F2: (B, L, H, d)
    return dx.reshape(B, L, E)  # ← F1: (B, L, E)


def merge_heads_forward(x: np.ndarray):
    """(B, H, L, d) -> (B, L, E): the inverse of split_heads (concatenate the heads)."""
    x = as_float_array(x, "x", ndim=4)
    B, H, L, d = x.shape
    out = x.transpose(0, 2, 1, 3)  # F1: (B, L, H, d)
    out = out.reshape(B, L, H * d)  # F2: (B, L, E)
    return out, (B, H, L, d)


def merge_heads_backward(d_out: np.ndarray, cache):
    """(B, L, E) -> (B, H, L, d)."""
    B, H, L, d = cache
    dx = d_out.reshape(B, L, H, d)  # ← F2: (B, L, H, d)
    return dx.transpose(0, 2, 1, 3)  # ← F1: (B, H, L, d)


# --------------------------------------------------------------------------- scores


def attention_scores_forward(q: np.ndarray, k: np.ndarray, scale: float):
    """scores = q kᵀ · scale.

    q: (B, H, Lq, d)   k: (B, H, Lk, d)   ->   scores: (B, H, Lq, Lk)
    """
    scores = q @ k.swapaxes(-1, -2)  # F1: (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    scores = scores * scale  # F2
    return scores, (q, k, scale)


def attention_scores_backward(d_scores: np.ndarray, cache):
    """d_scores: (B, H, Lq, Lk)  ->  dq: (B, H, Lq, d), dk: (B, H, Lk, d)."""
    q, k, scale = cache
    d_raw = d_scores * scale  # ← F2
    dq = d_raw @ k  # ← F1: (B, H, Lq, Lk) @ (B, H, Lk, d) -> (B, H, Lq, d)
    dk = d_raw.swapaxes(-1, -2) @ q  # ← F1: (B, H, Lk, Lq) @ (B, H, Lq, d) -> (B, H, Lk, d)
    return dq, dk


# --------------------------------------------------------------------------- mask


def apply_mask_forward(scores: np.ndarray, mask: np.ndarray | None = None):
    """Block the positions a query may not attend to.

    scores: (B, H, Lq, Lk)
    mask: None | bool, True = may attend (blocked -> -inf) | float, added to the scores;
          any shape broadcastable to (B, H, Lq, Lk).
    -> masked scores (B, H, Lq, Lk). The input is never modified.
    """
    mask = check_mask(mask, scores.shape)
    if mask is None:
        return scores, None
    if mask.dtype == np.bool_:
        out = np.where(mask, scores, -np.inf).astype(scores.dtype, copy=False)  # F1
    else:
        out = scores + mask.astype(scores.dtype, copy=False)  # F1
    blocked = np.isneginf(out)  # (B, H, Lq, Lk) positions that get zero weight
    return out, blocked


def apply_mask_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, Lq, Lk) -> d_scores: (B, H, Lq, Lk); zero where the mask blocked."""
    blocked = cache
    if blocked is None:
        return d_out
    return np.where(blocked, 0.0, d_out).astype(d_out.dtype, copy=False)  # ← F1


# --------------------------------------------------------------------------- softmax


def softmax_forward(x: np.ndarray):
    """Numerically stable softmax over the last axis.

    x: (..., Lk) -> p: (..., Lk). A row with no finite entry (fully masked) gives all-zero
    weights instead of NaN. PyTorch's softmax gives NaN there; see docs/masks.md.
    """
    row_max = x.max(axis=-1, keepdims=True)  # (..., 1)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # fully masked row: shift by 0
    e = np.exp(x - row_max)  # F1: (..., Lk), every entry in [0, 1]
    total = e.sum(axis=-1, keepdims=True)  # F2: (..., 1)
    p = e / np.where(total > 0, total, 1.0)  # F3: (..., Lk); a fully masked row stays 0
    return p, p


def softmax_backward(dp: np.ndarray, cache):
    """Vector-Jacobian product of softmax: dx = p ∘ (dp - Σ_j p_j dp_j).

    Never the full Jacobian, never the diagonal-only p(1 - p) shortcut.
    dp: (..., Lk) -> dx: (..., Lk)
    """
    p = cache
    row_dot = (p * dp).sum(axis=-1, keepdims=True)  # ← F3, F2: (..., 1)
    return p * (dp - row_dot)  # ← F1: (..., Lk)


# --------------------------------------------------------------------------- dropout


def dropout_forward(
    x: np.ndarray,
    p: float,
    rng: np.random.Generator | None = None,
    keep_mask: np.ndarray | None = None,
):
    """Inverted dropout: zero each entry with probability p, scale survivors by 1/(1-p).

    x: (...)  ->  out: (...). ``keep_mask`` (bool, same shape as x) replaces sampling, e.g. to
    hold the mask fixed in a gradient check. The cache keeps the mask for the backward.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    if keep_mask is None:
        if p == 0.0:
            return x, None
        if rng is None:
            raise ValueError("dropout with p > 0 needs rng (a numpy.random.Generator) or keep_mask")
        keep_mask = rng.random(x.shape) >= p  # (...) True = keep
    keep_mask = np.asarray(keep_mask)
    if keep_mask.shape != x.shape or keep_mask.dtype != np.bool_:
        raise ValueError(f"keep_mask must be boolean with shape {x.shape}, got {keep_mask.dtype} {keep_mask.shape}")
    scale = 1.0 / (1.0 - p)
    out = x * keep_mask * scale  # F1
    return out, (keep_mask, scale)


def dropout_backward(d_out: np.ndarray, cache):
    """d_out: (...) -> dx: (...), using the same mask as the forward."""
    if cache is None:
        return d_out
    keep_mask, scale = cache
    return d_out * keep_mask * scale  # ← F1


# --------------------------------------------------------------------------- weighted sum


def attention_context_forward(p: np.ndarray, v: np.ndarray):
    """context = p v.

    p: (B, H, Lq, Lk)   v: (B, H, Lk, d)   ->   context: (B, H, Lq, d)
    """
    context = p @ v  # F1: (B, H, Lq, Lk) @ (B, H, Lk, d) -> (B, H, Lq, d)
    return context, (p, v)


def attention_context_backward(d_context: np.ndarray, cache):
    """d_context: (B, H, Lq, d) -> dp: (B, H, Lq, Lk), dv: (B, H, Lk, d)."""
    p, v = cache
    dp = d_context @ v.swapaxes(-1, -2)  # ← F1: (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    dv = p.swapaxes(-1, -2) @ d_context  # ← F1: (B, H, Lk, Lq) @ (B, H, Lq, d) -> (B, H, Lk, d)
    return dp, dv


# --------------------------------------------------------------------------- attention


@dataclass
class AttentionCache:
    """What the attention backward needs, plus the named intermediates for inspection.

    scores: (B, H, Lq, Lk) q kᵀ · scale, before the mask.
    masked_scores: (B, H, Lq, Lk) after the mask (-inf where blocked).
    attn_weights: (B, H, Lq, Lk) after softmax, before dropout. Fully masked rows are 0.
    dropout_mask: (B, H, Lq, Lk) bool keep-mask, or None when no dropout was applied.
    """

    scores: np.ndarray
    masked_scores: np.ndarray
    attn_weights: np.ndarray
    dropout_mask: np.ndarray | None
    _caches: tuple
    impl: str = "vectorized"  # which implementation made this cache (its backward is chosen by it)


IMPLS = ("vectorized", "naive", "chunked")


def impl_module(impl: str):
    """The module holding the ``naive`` or ``chunked`` implementation (imported lazily: both build on this one)."""
    from . import chunked, naive

    return {"naive": naive, "chunked": chunked}[impl]


def check_impl(impl: str, block_size=None, num_threads=None) -> None:
    """ValueError naming the argument unless impl is one of IMPLS and block_size / num_threads fit it."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl != "chunked" and (block_size is not None or num_threads is not None):
        raise ValueError(f"block_size and num_threads apply only to impl='chunked', got impl={impl!r}")
    if impl == "chunked":
        impl_module(impl).check_block_size(block_size)
        impl_module(impl).check_num_threads(num_threads)


def _check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = as_float_array(q, "q", ndim=4)
    k = as_float_array(k, "k", ndim=4)
    v = as_float_array(v, "v", ndim=4)
    if q.shape[:2] != k.shape[:2] or q.shape[:2] != v.shape[:2]:
        raise ValueError(f"q, k, v must share (B, H): got q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dim d: got q {q.shape}, k {k.shape}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length Lk: got k {k.shape}, v {v.shape}")
    return q, k, v


def scaled_dot_product_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    dropout_mask: np.ndarray | None = None,
    impl: str = "vectorized",
    block_size: int | None = None,
    num_threads: int | None = None,
):
    """softmax(q kᵀ · scale + mask) v, composed from the pairs above.

    q: (B, H, Lq, d)   k: (B, H, Lk, d)   v: (B, H, Lk, dv)
    mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk)
    scale: defaults to 1/sqrt(d). dropout_p > 0 drops attention weights (needs rng or
    dropout_mask, a bool keep-mask of shape (B, H, Lq, Lk)).
    -> context: (B, H, Lq, dv), cache (an AttentionCache; cache.attn_weights is (B, H, Lq, Lk))
    impl: "vectorized" (this function), "naive" (a loop over batch and heads, ``mha_numpy.naive``) or
    "chunked" (blocked online softmax, ``mha_numpy.chunked``; block_size and num_threads apply to it
    only, and its cache computes attn_weights when read). The backward follows the cache.
    """
    check_impl(impl, block_size, num_threads)
    if impl != "vectorized":
        extra = dict(block_size=block_size, num_threads=num_threads) if impl == "chunked" else {}
        return impl_module(impl).attention_forward(q, k, v, mask, scale, dropout_p, rng, dropout_mask, **extra)
    q, k, v = _check_qkv(q, k, v)
    B, H, Lq, d = q.shape
    mask = check_mask(mask, (B, H, Lq, k.shape[2]))
    dropout_mask = check_dropout((B, H, Lq, k.shape[2]), dropout_p, rng, dropout_mask)
    scale = 1.0 / float(np.sqrt(d)) if scale is None else float(scale)  # a Python float keeps float32

    scores, c_scores = attention_scores_forward(q, k, scale)  # (B, H, Lq, Lk)
    masked, c_mask = apply_mask_forward(scores, mask)  # (B, H, Lq, Lk)
    weights, c_soft = softmax_forward(masked)  # (B, H, Lq, Lk)
    dropped, c_drop = dropout_forward(weights, dropout_p, rng, dropout_mask)  # (B, H, Lq, Lk)
    context, c_ctx = attention_context_forward(dropped, v)  # (B, H, Lq, dv)

    cache = AttentionCache(
        scores=scores,
        masked_scores=masked,
        attn_weights=weights,
        dropout_mask=None if c_drop is None else c_drop[0],
        _caches=(c_scores, c_mask, c_soft, c_drop, c_ctx),
    )
    return context, cache


def scaled_dot_product_attention_backward(d_context: np.ndarray, cache: AttentionCache):
    """d_context: (B, H, Lq, dv) -> dq: (B, H, Lq, d), dk: (B, H, Lk, d), dv: (B, H, Lk, dv)."""
    if cache.impl != "vectorized":
        return impl_module(cache.impl).attention_backward(d_context, cache)
    c_scores, c_mask, c_soft, c_drop, c_ctx = cache._caches
    d_dropped, dv = attention_context_backward(d_context, c_ctx)  # (B, H, Lq, Lk), (B, H, Lk, dv)
    d_weights = dropout_backward(d_dropped, c_drop)  # (B, H, Lq, Lk)
    d_masked = softmax_backward(d_weights, c_soft)  # (B, H, Lq, Lk)
    d_scores = apply_mask_backward(d_masked, c_mask)  # (B, H, Lq, Lk)
    dq, dk = attention_scores_backward(d_scores, c_scores)  # (B, H, Lq, d), (B, H, Lk, d)
    return dq, dk, dv


# Short alias: the functional "call" is the forward half of the pair.
scaled_dot_product_attention = scaled_dot_product_attention_forward
