"""Multi-head attention, one step at a time, each step a forward/backward pair.

Every step is ``NAME_forward(...) -> (out, cache)`` followed directly by
``NAME_backward(d_out, cache)``. A backward line names the forward line it reverses (``# ← F1``).
Shapes use B = batch, H = heads, Lq / Lk = query / key length, E = embed dim, d = E / H.
The derivation of every formula is in ``docs/derivation.md``.

Mask convention (the only one used inside mha_numpy): a boolean mask is True where a query
*may attend* to a key; a floating mask is *added* to the scores (use -inf to block).

Validation: a pair called directly checks its arguments (``ValueError`` naming the argument and its shape).
``MultiHeadAttention`` checks everything once, at its boundary, and then calls the pairs with ``check=False``:
the same arithmetic without checking again what it has just checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_array,
    as_bool,
    as_float_array,
    as_generator,
    as_int,
    as_number,
    check_d_context,
    check_d_lse,
    check_dropout,
    check_mask,
    check_probability,
    check_qkv,
    default_scale,
)

# --------------------------------------------------------------------------- linear


def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None, matmul=np.matmul, check: bool = True):
    """y = x Wᵀ + b, with W in PyTorch layout.

    x: (..., in)   W: (out, in)   b: (out,) or None   ->   y: (..., out)
    matmul: the 2-D product to use (``MultiHeadAttention`` passes its kernel's, so that every product of a
    call runs on the same threads); the backward takes the same.
    """
    if check:
        x, W, b = check_linear(x, W, b)
    # (N, in), N = product of the leading dims: one GEMM, not one per batch item (N given: -1 is undefined at in = 0)
    x2 = x.reshape(math.prod(x.shape[:-1]), W.shape[1])
    y = matmul(x2, W.T)  # F1: (N, in) @ (in, out) -> (N, out)
    if b is not None:
        y += b  # F2: (N, out) + (out,), in place on the fresh product
    return y.reshape(*x.shape[:-1], W.shape[0]), (x2, W, b is not None, x.shape)  # (..., out)


def check_linear(x, W, b):
    """x (..., in), W (out, in), b (out,) or None as floating arrays, or ValueError naming the one that does not fit."""
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
    return x, W, b


def linear_cache(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """The cache ``linear_forward(x, W, b)`` returns, without computing y: all its backward needs.

    For activation checkpointing (``MultiHeadAttention(recompute=True)``), whose backward recomputes a head
    group's forward but needs only the inputs of that group's share of the output projection.
    """
    return x.reshape(math.prod(x.shape[:-1]), W.shape[1]), W, b is not None, x.shape  # (N, in)


def linear_backward(dy: np.ndarray, cache, matmul=np.matmul):
    """dy: (..., out)  ->  dx: (..., in), dW: (out, in), db: (out,) or None."""
    x2, W, has_bias, x_shape = cache
    dy2 = dy.reshape(x2.shape[0], W.shape[0])  # (N, out)
    dx = matmul(dy2, W).reshape(x_shape)  # ← F1: (N, out) @ (out, in) -> (N, in) -> (..., in)
    dW = matmul(dy2.T, x2)  # ← F1: (out, N) @ (N, in) -> (out, in)
    db = dy2.sum(axis=0) if has_bias else None  # ← F2: (out,), summed over every leading axis
    return dx, dW, db


def fused_linear_forward(
    x: np.ndarray, Ws: list[np.ndarray], bs: list[np.ndarray] | None = None, matmul=np.matmul, check: bool = True
):
    """[y₁, ..., yₙ] with yᵢ = x Wᵢᵀ + bᵢ, as one GEMM over the stacked weights (q, k, v of self-attention).

    x: (..., in)   Wᵢ: (outᵢ, in)   bᵢ: (outᵢ,)   ->   [yᵢ: (..., outᵢ)] (views of one array), cache
    """
    W = np.concatenate(Ws)  # (Σ outᵢ, in)
    b = None if bs is None else np.concatenate(bs)  # (Σ outᵢ,)
    y, c = linear_forward(x, W, b, matmul, check)  # F1: (..., Σ outᵢ)
    cuts = np.cumsum([w.shape[0] for w in Ws])[:-1]
    return np.split(y, cuts, axis=-1), (c, cuts)  # F2: split the columns


def fused_linear_backward(dys: list[np.ndarray], cache, matmul=np.matmul):
    """[dyᵢ: (..., outᵢ)] -> ([dxᵢ: (..., in)] one per output, [dWᵢ], [dbᵢ] or None).

    Each output's gradients are those of ``linear_backward`` on its rows of the stacked weight (nothing of
    size (N, Σ outᵢ) is assembled); the input gradient is kept per output (the three paths of
    self-attention), each dyᵢ Wᵢ.
    """
    (x2, W, has_bias, x_shape), cuts = cache
    caches = [(x2, w, has_bias, x_shape) for w in np.split(W, cuts)]  # ← F2: each output's rows of W
    grads = [linear_backward(dy, c, matmul) for dy, c in zip(dys, caches)]  # ← F1
    dxs, dWs, dbs = (list(g) for g in zip(*grads))  # [(..., in)], [(outᵢ, in)], [(outᵢ,) or None]
    return dxs, dWs, dbs if has_bias else None


# --------------------------------------------------------------------------- heads


def split_heads_forward(x: np.ndarray, num_heads: int, check: bool = True):
    """(B, L, E) -> (B, H, L, d): head h sees features h*d ... (h+1)*d - 1."""
    if check:
        x = as_float_array(x, "x", ndim=3)
        num_heads = as_int(num_heads, "num_heads", minimum=1)
        if x.shape[2] % num_heads != 0:
            raise ValueError(f"x with shape {x.shape}: last dim {x.shape[2]} is not divisible by num_heads={num_heads}")
    B, L, E = x.shape
    d = E // num_heads
    out = x.reshape(B, L, num_heads, d)  # F1: (B, L, H, d)
    out = out.transpose(0, 2, 1, 3)  # F2: (B, H, L, d)
    return out, (B, L, E)


def split_heads_backward(d_out: np.ndarray, cache):
    """(B, H, L, d) -> (B, L, E)."""
    B, L, E = cache
    dx = d_out.transpose(0, 2, 1, 3)  # ← F2: (B, L, H, d)
    return dx.reshape(B, L, E)  # ← F1: (B, L, E)


def merge_heads_forward(x: np.ndarray, check: bool = True):
    """(B, H, L, d) -> (B, L, E): the inverse of split_heads (concatenate the heads)."""
    if check:
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
    scores = (q * scale) @ k.swapaxes(-1, -2)  # F1: (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk), the scale on q
    return scores, (q, k, scale)  # the cache is (q, k, scale): the course's checker hands it to students' backwards


def attention_scores_backward(d_scores: np.ndarray, cache):
    """d_scores: (B, H, Lq, Lk)  ->  dq: (B, H, Lq, d), dk: (B, H, Lk, d)."""
    q, k, scale = cache
    dq = d_scores @ k  # ← F1: (B, H, Lq, Lk) @ (B, H, Lk, d) -> (B, H, Lq, d)
    dk = d_scores.swapaxes(-1, -2) @ q  # ← F1: (B, H, Lk, Lq) @ (B, H, Lq, d) -> (B, H, Lk, d)
    dq *= scale  # ← F1: the scale, applied to the (L, d) results rather than to the (Lq, Lk) d_scores
    dk *= scale  # ← F1
    return dq, dk


# --------------------------------------------------------------------------- mask


def apply_mask_forward(scores: np.ndarray, mask: np.ndarray | None = None, check: bool = True):
    """Block the positions a query may not attend to.

    scores: (B, H, Lq, Lk)
    mask: None | bool, True = may attend (blocked -> -inf) | float, added to the scores;
          any shape broadcastable to (B, H, Lq, Lk).
    -> masked scores (B, H, Lq, Lk). The input is never modified.
    """
    if check:
        scores = as_float_array(scores, "scores")  # an int -inf would be INT64_MIN
        mask = check_mask(mask, scores.shape)
    if mask is None:
        return scores, None
    if mask.dtype == np.bool_:
        out = np.where(mask, scores, -np.inf).astype(scores.dtype, copy=False)  # F1
    else:
        out = scores + mask.astype(scores.dtype, copy=False)  # F1
    blocked = out == -np.inf  # (B, H, Lq, Lk) positions that get zero weight (np.isneginf's answer, in one pass)
    return out, blocked


def apply_mask_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, Lq, Lk) -> d_scores: (B, H, Lq, Lk); zero where the mask blocked."""
    blocked = cache
    if blocked is None:
        return d_out
    return np.where(blocked, 0.0, d_out).astype(d_out.dtype, copy=False)  # ← F1


# --------------------------------------------------------------------------- softmax


def softmax_forward(x: np.ndarray, check: bool = True):
    """Numerically stable softmax over the last axis.

    x: (..., Lk) -> p: (..., Lk). A row whose entries are all -inf (fully masked) gives all-zero
    weights instead of NaN (PyTorch's softmax gives NaN there; see docs/masks.md). A NaN or a +inf
    in a row makes the whole row NaN, as in PyTorch. Lk = 0 gives an empty result.
    """
    if check:
        x = as_float_array(x, "x")
    if x.shape[-1] == 0:
        return x.copy(), x.copy()  # no key at all: nothing to weigh
    row_max = x.max(axis=-1, keepdims=True)  # (..., 1); NaN if the row holds a NaN
    row_max = np.where(np.isneginf(row_max), 0.0, row_max)  # fully masked row: shift by 0, exp(-inf) = 0
    p = x - row_max  # (..., Lk), a new array: the steps below work in place on it
    np.exp(p, out=p)  # F1: (..., Lk), every entry in [0, 1] (or NaN)
    total = p.sum(axis=-1, keepdims=True)  # F2: (..., 1), 0 only for a fully masked row
    p *= 1.0 / np.where(total == 0, 1.0, total)  # F3: (..., Lk), one division per row; masked rows stay 0
    return p, p


def softmax_backward(dp: np.ndarray, cache, d_lse: np.ndarray | None = None):
    """Vector-Jacobian product of softmax: dx = p ∘ (dp - Σ_j p_j dp_j).

    Never the full Jacobian, never the diagonal-only p(1 - p) shortcut.
    dp: (..., Lk) -> dx: (..., Lk)
    d_lse: None, or (...,) the gradient of the rows' log-sum-exp (``log_sum_exp``), used downstream beside p. Its
    derivative is p itself (∂ lse / ∂x_j = p_j), so it joins the row term: dx = p ∘ (dp - (Σ_j p_j dp_j - d_lse)).
    """
    p = cache
    row_dot = np.einsum("...k,...k->...", p, dp)[..., None]  # ← F3, F2: (..., 1) Σ_j p_j dp_j
    if d_lse is not None:
        row_dot -= d_lse[..., None]  # ← lse = log Σ exp(x): its gradient p ∘ d_lse, folded into the row term
    dx = dp - row_dot  # ← F1: (..., Lk), a new array
    dx *= p  # ← F1: p ∘ (dp - Σ p dp), in place
    return dx


def log_sum_exp(x: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """Each row's log-sum-exp over the last axis, lse = log Σ_j exp(x_j): (..., Lk) -> (...,), float64.

    The log of the softmax's denominator, so softmax(x) = exp(x - lse): FlashAttention's convention, what merges
    attention computed over disjoint sets of keys. Natural log; computed as m + log Σ_j exp(x_j - m) with the row
    max m kept apart until the end, in float64 whatever x's dtype (beside a large m, a float32 lse would lose
    log ℓ). A row with no finite entry (fully masked, or no key at all) gives -inf, the log of an empty sum; a NaN
    (or a +inf) gives NaN. No backward of its own: its gradient p ∘ d_lse is ``softmax_backward(..., d_lse)``'s.
    sink: None, or broadcastable to x.shape[:-1]: the sink's logit counts, lse = log(exp(sink) + Σ_j exp(x_j)),
    the denominator of ``sink_softmax_forward`` (a row with every key blocked then has lse = sink).
    """
    x = np.asarray(x, dtype=np.float64)  # (..., Lk): the working dtype's scores, exactly
    sink = np.full((), -np.inf) if sink is None else np.asarray(sink, dtype=np.float64)  # -inf: no sink
    m = np.maximum(x.max(axis=-1, initial=-np.inf), sink)  # (...,) the row max, the sink's logit included
    m = np.where(np.isneginf(m), 0.0, m)  # a row with nothing allowed: shift by 0, exp(-inf) = 0
    with np.errstate(divide="ignore"):  # log 0 = -inf for such a row (and for no key at all)
        return m + np.log(np.exp(x - m[..., None]).sum(axis=-1) + np.exp(sink - m))  # (...,)


def sink_softmax_forward(x: np.ndarray, sink: np.ndarray, check: bool = True):
    """Softmax over the last axis with one more logit per row in its denominator, an attention sink (gpt-oss):

        p_j = exp(x_j) / (exp(sink) + Σ_k exp(x_k))

    a weight 1 - Σ_j p_j that goes to no key (the sink has no value), so a row may attend to nothing much.
    x: (..., Lk)   sink: broadcastable to x.shape[:-1] (e.g. (H, 1) for scores (B, H, Lq, Lk): one logit per head)
    -> p (..., Lk), the keys' weights (the sink's is dropped, as gpt-oss drops its column), cache.
    A fully masked row puts its whole weight on the sink: p = 0 there without a special case. A sink of -inf is
    the plain softmax. Derivation: docs/derivation.md § 23.
    """
    if check:
        x = as_float_array(x, "x")
        sink = check_mask(sink, x.shape[:-1], name="sink", allow_bool=False, dtype=x.dtype)
    m = np.maximum(x.max(axis=-1, initial=-np.inf), sink)  # (...,) the row max, the sink's logit included
    m = np.where(np.isneginf(m), 0.0, m)  # no key and no sink: shift by 0, exp(-inf) = 0
    p = x - m[..., None]  # (..., Lk), a new array: the steps below work in place on it
    np.exp(p, out=p)  # F1: (..., Lk) every entry in [0, 1] (or NaN)
    e_sink = np.exp(sink - m)  # F1: (...,) the sink's entry
    total = p.sum(axis=-1) + e_sink  # F2: (...,) the denominator, sink included
    inv = 1.0 / np.where(total == 0, 1.0, total)  # (...,) one division per row
    p *= inv[..., None]  # F3: (..., Lk) the keys' weights
    return p, (p, e_sink * inv, np.shape(sink))  # F3: the sink's weight, kept for the backward


def sink_softmax_backward(dp: np.ndarray, cache, d_lse: np.ndarray | None = None):
    """dp: (..., Lk) -> dx: (..., Lk), d_sink: the sink's shape (summed over what it was broadcast to).

    The sink is one more entry of the softmax row whose value is nothing, so its dp is 0 and the VJP of the row
    [x, sink] is dx_j = p_j (dp_j - D), d_sink = p_sink (0 - D), D = Σ_j p_j dp_j. d_lse as in ``softmax_backward``
    (∂ lse / ∂ sink = p_sink): D - d_lse in place of D.
    """
    p, p_sink, sink_shape = cache
    row_dot = np.einsum("...k,...k->...", p, dp)  # ← F3, F2: (...,) Σ_j p_j dp_j; the sink adds p_sink · 0
    if d_lse is not None:
        row_dot -= d_lse  # ← the lse's gradient, folded into the row term
    dx = dp - row_dot[..., None]  # ← F1: (..., Lk), a new array
    dx *= p  # ← F1: p ∘ (dp - D)
    d_sink = sum_to_shape(-p_sink * row_dot, sink_shape)  # ← F1: p_sink (0 - D), summed to the sink's shape
    return dx, d_sink


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
    p = check_probability(p, "p")
    if keep_mask is None:
        if p == 0.0:
            return x, None
        if rng is None:
            raise ValueError("dropout with p > 0 needs rng (a numpy.random.Generator) or keep_mask")
        keep_mask = rng.random(x.shape) >= p  # (...) True = keep
    keep_mask = as_array(keep_mask, "keep_mask")
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


# --------------------------------------------------------------------------- today's variants: GQA, RoPE, ALiBi


def repeat_kv_forward(x: np.ndarray, n_rep: int, check: bool = True):
    """Share each key/value head with ``n_rep`` query heads (grouped-query / multi-query attention).

    x: (B, Hkv, L, d) -> out: (B, Hkv·n_rep, L, d); out head h is x head h // n_rep, the grouping of torch
    SDPA's ``enable_gqa=True`` and Hugging Face's ``repeat_kv``. n_rep = 1 returns x itself (no copy).
    """
    if check:
        x = as_float_array(x, "x", ndim=4)
        if not isinstance(n_rep, (int, np.integer)) or isinstance(n_rep, bool) or n_rep <= 0:
            raise ValueError(f"n_rep must be a positive int (num_heads // num_kv_heads), got {n_rep!r}")
    if n_rep == 1:
        return x, (x.shape, 1)
    out = np.repeat(x, n_rep, axis=1)  # F1: (B, Hkv, L, d) -> (B, Hkv·n_rep, L, d), head h <- h // n_rep
    return out, (x.shape, int(n_rep))


def repeat_kv_backward(d_out: np.ndarray, cache):
    """d_out: (B, Hkv·n_rep, L, d) -> dx: (B, Hkv, L, d), the sum over each group of n_rep query heads."""
    (B, Hkv, L, d), n_rep = cache
    if n_rep == 1:
        return d_out
    grouped = d_out.reshape(B, Hkv, n_rep, L, d)  # ← F1: (B, Hkv, n_rep, L, d), the heads of one group together
    return grouped.sum(axis=2)  # ← F1: (B, Hkv, L, d)


def rms_norm_forward(x: np.ndarray, weight: np.ndarray, eps: float, check: bool = True):
    """Divide each feature vector by its root mean square, then scale by weight (Llama's RMSNorm, T5's LayerNorm).

    x: (..., E)   weight: (E,)   ->   out: (..., E) = x · rsqrt(mean(x²) + eps) · weight. No mean is removed and
    there is no bias. In the attention module it is QK-norm, a per-head norm of Q and K (E = d). Computed in x's
    dtype: float32 as Hugging Face's LlamaRMSNorm (which upcasts to float32), float64 in float64 (where
    LlamaRMSNorm would round through float32). Derivation: docs/derivation.md, "RMSNorm".
    """
    if check:
        x = as_float_array(x, "x")
        weight = as_float_array(weight, "weight", ndim=1)
        if x.ndim < 1 or weight.shape != (x.shape[-1],):
            raise ValueError(f"rms_norm: x {x.shape} needs weight of shape (E,), got {weight.shape}")
    ms = (x * x).mean(axis=-1, keepdims=True)  # F1: (..., 1) mean of the squares
    r = 1.0 / np.sqrt(ms + eps)  # F2: (..., 1) 1/rms
    x_hat = x * r  # F3: (..., E) unit root mean square
    out = x_hat * weight  # F4: (..., E)
    return out, (x_hat, r, weight)


def rms_norm_backward(d_out: np.ndarray, cache):
    """d_out: (..., E) -> dx: (..., E), dweight: (E,).

    dx = r · (dx̂ - x̂ · mean(dx̂ · x̂)) with dx̂ = d_out · weight: LayerNorm's backward without the mean term.
    """
    x_hat, r, weight = cache
    lead = tuple(range(d_out.ndim - 1))  # every axis but the features
    dweight = (d_out * x_hat).sum(axis=lead)  # ← F4: (E,)
    dx_hat = d_out * weight  # ← F4: (..., E)
    mean_dx = (dx_hat * x_hat).mean(axis=-1, keepdims=True)  # ← F2, F1: (..., 1) the part that moves the rms
    dx = r * (dx_hat - x_hat * mean_dx)  # ← F3 ... F1: (..., E)
    return dx, dweight


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The rotation angles of RoPE, Hugging Face Llama convention, always computed in float64.

    positions: (L,) or (B, L) -> cos, sin: (L, d) or (B, L, d), with
    angle[..., i] = position · inv_freq[i mod d/2] and inv_freq = 1 / theta ** (arange(0, d, 2) / d):
    feature i and feature i + d/2 turn together by the same angle (the pair ``rotate_half`` mixes).
    """
    head_dim = as_int(head_dim, "head_dim", minimum=1)
    inv_freq = 1.0 / as_number(theta, "theta", positive=True) ** (np.arange(0, head_dim, 2) / head_dim)  # (d/2,)
    positions = as_array(positions, "positions").astype(np.float64)  # (L,) or (B, L)
    freqs = positions[..., None] * inv_freq  # (..., L, 1) * (d/2,) -> (..., L, d/2)
    angles = np.concatenate([freqs, freqs], axis=-1)  # (..., L, d)
    return np.cos(angles), np.sin(angles)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """(..., d) -> (..., d): [x1, x2] -> [-x2, x1] with x1, x2 the two halves of the last axis (a 90° turn per pair)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def check_positions(positions, B: int, L: int) -> np.ndarray:
    """positions as an array (L,), (1, L) or (B, L) of finite integers or floats, or ValueError naming it."""
    pos = as_array(positions, "positions")
    if not (np.issubdtype(pos.dtype, np.integer) or np.issubdtype(pos.dtype, np.floating)):
        raise ValueError(f"positions must be integer or float, got dtype {pos.dtype} with shape {pos.shape}")
    if pos.shape not in ((L,), (B, L), (1, L)):
        raise ValueError(f"positions with shape {pos.shape} must be (L,) = ({L},) or (B, L) = ({B}, {L})")
    if not np.all(np.isfinite(pos)):
        raise ValueError(f"positions with shape {pos.shape} holds non-finite values")
    return pos


def _check_rope(x, positions, theta):
    """ValueError naming the argument; returns x and the positions as an array (L,) or (B, L)."""
    x = as_float_array(x, "x", ndim=4)
    B, _, L, d = x.shape
    if d % 2:
        raise ValueError(f"x with shape {x.shape}: RoPE rotates pairs of features, the head dim d={d} must be even")
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.integer, np.floating)) or not theta > 0:
        raise ValueError(f"theta (rope_theta) must be a positive number, got {theta!r}")
    return x, (np.arange(L) if positions is None else check_positions(positions, B, L))


def rope_forward(x: np.ndarray, positions: np.ndarray | None = None, theta: float = 10000.0, check: bool = True):
    """Rotary position embedding: turn each feature pair (i, i + d/2) of x by the angle of its position.

    x: (B, H, L, d), d even   positions: None (0, 1, ..., L-1), (L,) or (B, L)   ->   out: (B, H, L, d)
    out = x · cos + rotate_half(x) · sin (Hugging Face Llama's ``apply_rotary_pos_emb``). Rotated q·k then
    depends on the positions only through their difference. The angles are float64, cast to x's dtype.
    """
    if check:
        x, positions = _check_rope(x, positions, theta)
    cos, sin = rope_cos_sin(
        np.arange(x.shape[2]) if positions is None else positions, x.shape[-1], theta
    )  # (L, d) or (B, L, d)
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, d): one rotation shared by the heads
    cos, sin = cos.astype(x.dtype, copy=False), sin.astype(x.dtype, copy=False)
    out = x * cos + rotate_half(x) * sin  # F1: (B, H, L, d)
    return out, (cos, sin)


def rope_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L, d) -> dx: (B, H, L, d): the transposed rotation, i.e. the turn by minus the angle.

    rotate_half is R = [[0, -I], [I, 0]] per pair and Rᵀ = -R, while cos and sin commute with R (the same
    angle on both features of a pair): dx = cos · d_out + Rᵀ(sin · d_out) = d_out · cos - rotate_half(d_out) · sin.
    """
    cos, sin = cache
    return d_out * cos - rotate_half(d_out) * sin  # ← F1


def partial_rope_forward(x: np.ndarray, positions=None, theta: float = 10000.0, rotary_dim=None, check: bool = True):
    """RoPE on the first ``rotary_dim`` features of each head, the rest passed through (Hugging Face's
    ``partial_rotary_factor``: Phi, StableLM, GPT-NeoX's rotary_pct, Qwen3-Next; ``apply_rotary_pos_emb`` with cos
    and sin ``rotary_dim`` wide). Within the turned part the pairs are (i, i + rotary_dim/2), as ``rope_forward``.

    x: (B, H, L, d)   rotary_dim: even, 2 ... d (None: d, all of it)   ->   out: (B, H, L, d)
    """
    if check:
        x = as_float_array(x, "x", ndim=4)
        r = x.shape[-1] if rotary_dim is None else as_int(rotary_dim, "rotary_dim", minimum=2)
        if r % 2 or r > x.shape[-1]:
            raise ValueError(f"rotary_dim={r} must be even and at most the head dim {x.shape[-1]} (x {x.shape})")
        _check_rope(x[..., :r], positions, theta)
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    if r == x.shape[-1]:  # all of it: RoPE itself, no copy
        out, (cos, sin) = rope_forward(x, positions, theta, check=check)  # F1: (B, H, L, d)
        return out, (cos, sin, r)
    turned, (cos, sin) = rope_forward(x[..., :r], positions, theta, check=False)  # F1: (B, H, L, r)
    out = np.concatenate([turned, x[..., r:]], axis=-1)  # F2: (B, H, L, r) + (B, H, L, d - r) -> (B, H, L, d)
    return out, (cos, sin, r)


def partial_rope_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L, d) -> dx: (B, H, L, d): the turned part turned back, the rest passed through."""
    cos, sin, r = cache
    if r == d_out.shape[-1]:
        return rope_backward(d_out, (cos, sin))  # ← F1
    d_turned = rope_backward(d_out[..., :r], (cos, sin))  # ← F2, ← F1: (B, H, L, r)
    return np.concatenate([d_turned, d_out[..., r:]], axis=-1)  # (B, H, L, d)


def rope_interleaved_forward(x: np.ndarray, positions=None, theta: float = 10000.0, check: bool = True,
                             inv_freq=None, attention_factor: float = 1.0):  # fmt: skip
    """RoPE on features paired as (0, 1), (2, 3), ... gathered into halves (DeepSeek's layout; HF's
    ``apply_rotary_pos_emb_interleave``).

    x: (B, H, L, d), d even   ->   out: (B, H, L, d). The pairs are gathered into halves [x0, x2, ..., x1, x3, ...]
    and turned as ``rotary_forward`` turns (i, i + d/2); the output stays in halves, as HF's does (the same scores
    as GPT-J's layout, ``rotary_forward(..., interleaved=True)``, whose output keeps the pairs in place: q and k
    permuted alike). inv_freq (d/2,), attention_factor: a scaled table (``rope_scaling``); None: theta's.
    """
    if check:
        x, positions = _check_rope(x, positions, theta)
    if inv_freq is None:
        inv_freq = 1.0 / theta ** (np.arange(0, x.shape[-1], 2) / x.shape[-1])  # (d/2,) RoPE's own table
    halves = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)  # F1: (B, H, L, d), pair i at (i, i + d/2)
    return rotary_forward(halves, positions, inv_freq, attention_factor, check=check)  # F2: (B, H, L, d)


def rope_interleaved_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L, d) -> dx: (B, H, L, d): the inverse rotation, then each half back to its pairs' places."""
    d_halves = rotary_backward(d_out, cache)  # ← F2
    half = d_out.shape[-1] // 2
    dx = np.empty_like(d_halves)
    dx[..., 0::2], dx[..., 1::2] = d_halves[..., :half], d_halves[..., half:]  # ← F1: a permutation's inverse
    return dx


def rotary_cos_sin(positions: np.ndarray, inv_freq: np.ndarray, attention_factor: float = 1.0):
    """positions (L,) or (B, L), inv_freq (n,) -> cos, sin (L, n) or (B, L, n), float64: the angles
    position · inv_freq[i] of the n turned pairs, each times ``attention_factor`` (transformers scales cos, sin)."""
    angles = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq  # (..., L, 1) * (n,) -> (..., L, n)
    return np.cos(angles) * attention_factor, np.sin(angles) * attention_factor


def _pair_slices(n: int, interleaved: bool) -> tuple[slice, slice]:
    """The two features of each turned pair: (i, i + n) (half-split) or (2i, 2i + 1) (interleaved), i < n."""
    return (slice(0, 2 * n, 2), slice(1, 2 * n, 2)) if interleaved else (slice(0, n), slice(n, 2 * n))


def rotary_forward(x: np.ndarray, positions=None, inv_freq=None, attention_factor: float = 1.0,
                   interleaved: bool = False, check: bool = True):  # fmt: skip
    """RoPE by a frequency table: pair i of the first 2n features of each head turned by position · inv_freq[i]
    and scaled by ``attention_factor``, the other features passed through (transformers' cos and sin of any
    ``rope_type``: ``mha_numpy.rope_scaling``).

    x: (B, H, L, d)   positions: None (0 ... L-1), (L,) or (B, L)   inv_freq: (n,), 2n ≤ d   ->   out: (B, H, L, d)
    The pairs: (i, i + n), half-split, Llama's ``rotate_half`` (``interleaved=False``); or (2i, 2i + 1), GPT-J's
    ``rotate_every_two`` and Llama 4's complex form (``interleaved=True``). The output keeps the input's layout.
    With a, b the two features of a pair, c = f cos, s = f sin:  a' = a c - b s,  b' = b c + a s.
    """
    if check:
        x = as_float_array(x, "x", ndim=4)
        inv_freq = as_float_array(inv_freq, "inv_freq", ndim=1)
        if 2 * inv_freq.size > x.shape[-1] or not np.all(np.isfinite(inv_freq)):
            raise ValueError(f"inv_freq {inv_freq.shape} must be finite and turn 2n ≤ d features (x {x.shape})")
        attention_factor = as_number(attention_factor, "attention_factor", positive=True)
        interleaved = as_bool(interleaved, "interleaved")
        positions = np.arange(x.shape[2]) if positions is None else check_positions(positions, x.shape[0], x.shape[2])
    n = inv_freq.size
    c, s = rotary_cos_sin(np.arange(x.shape[2]) if positions is None else positions, inv_freq, attention_factor)
    if c.ndim == 3:
        c, s = c[:, None], s[:, None]  # (B, 1, L, n): one rotation shared by the heads
    c, s = c.astype(x.dtype, copy=False), s.astype(x.dtype, copy=False)
    ia, ib = _pair_slices(n, interleaved)
    a, b = x[..., ia], x[..., ib]  # (B, H, L, n) each: the pairs' two features
    out = x.copy()  # the features past 2n pass through
    out[..., ia] = a * c - b * s  # F1: (B, H, L, n)
    out[..., ib] = b * c + a * s  # F2
    return out, (c, s, n, interleaved)


def rotary_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L, d) -> dx: (B, H, L, d): each pair turned back (the transposed rotation, times the same
    factor): da = da' c + db' s, db = db' c - da' s; the untouched features' gradient passes through."""
    c, s, n, interleaved = cache
    ia, ib = _pair_slices(n, interleaved)
    da_out, db_out = d_out[..., ia], d_out[..., ib]
    dx = d_out.copy()
    dx[..., ia] = da_out * c + db_out * s  # ← F1, F2
    dx[..., ib] = db_out * c - da_out * s  # ← F2, F1
    return dx


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The ALiBi paper's per-head slopes (Press et al. 2022), float64 (H,); as Hugging Face's BLOOM builds them.

    For H a power of two: m_h = 2^(-8 (h+1) / H), a geometric sequence from 2^(-8/H) down to 2^-8. Otherwise
    the slopes of the closest power of two P < H, followed by every other slope of 2P (the odd powers of its
    ratio) until there are H.
    """
    num_heads = as_int(num_heads, "num_heads", minimum=1)
    P = 2 ** int(np.floor(np.log2(num_heads)))  # the closest power of two <= H

    def geometric(n: int) -> np.ndarray:
        return 2.0 ** (-8.0 * np.arange(1, n + 1) / n)  # (n,): 2^(-8/n), 2^(-16/n), ..., 2^-8

    return np.concatenate([geometric(P), geometric(2 * P)[0::2][: num_heads - P]])  # (H,)


def alibi_bias(num_heads: int, Lq: int, Lk: int | None = None, offset: int = 0, dtype=np.float64) -> np.ndarray:
    """ALiBi's linear distance penalty, an additive score bias (1, H, Lq, Lk): -m_h · |(i + offset) - j|.

    Query i sits at position i + offset (pass offset = Lk - Lq for Lq new queries after Lk - Lq cached keys),
    key j at position j. For a key in the past this is the paper's -m_h (i - j); keys in the future get the
    symmetric penalty (mask them for a causal model). Hugging Face's BLOOM adds +m_h · j instead: the same
    softmax under a causal mask, since the two differ by -m_h · i, a constant per row. Constant: no gradient flows
    into it (a kernel's dbias for it is discarded).
    """
    Lq = as_int(Lq, "Lq", minimum=0)
    Lk = Lq if Lk is None else as_int(Lk, "Lk", minimum=0)
    offset = as_int(offset, "offset")
    h, i, j = np.ix_(range(num_heads), range(Lq), range(Lk))  # (H, 1, 1), (1, Lq, 1), (1, 1, Lk)
    return _alibi_term(alibi_slopes(num_heads), h, i, j, offset)[None].astype(dtype)  # (1, H, Lq, Lk)


# --------------------------------------------------------------------------- score bias


def score_bias_forward(scores: np.ndarray, bias: np.ndarray | None = None):
    """Add a learned or fixed bias to the scores (ALiBi, a relative-position table, ...).

    scores: (B, H, Lq, Lk)   bias: None or float, broadcastable to (B, H, Lq, Lk)   ->   (B, H, Lq, Lk)
    Unlike a float mask, the bias gets a gradient (reduced to the bias's own shape).
    """
    if bias is None:
        return scores, None
    return scores + bias, np.shape(bias)  # F1: (B, H, Lq, Lk) + (broadcast)


def score_bias_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, Lq, Lk) -> (d_scores (B, H, Lq, Lk), d_bias with the bias's shape, or None)."""
    if cache is None:
        return d_out, None
    return d_out, sum_to_shape(d_out, cache)  # ← F1: a broadcast's backward sums over the broadcast axes


def sum_to_shape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the axes that broadcasting added or stretched, so the result has ``shape``."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape) if axes else x


def relative_position_bias_forward(table: np.ndarray, Lq: int, Lk: int, check: bool = True):
    """A learned bias per head and clipped distance j - i (as in T5 / Shaw et al., without buckets).

    table: (H, 2R + 1), column R + t is the bias for key j = i + t, t clipped to [-R, R]
    -> bias (1, H, Lq, Lk), to be added to the scores by ``score_bias_forward``.
    """
    if check:
        table = as_float_array(table, "table", ndim=2)
        Lq, Lk = as_int(Lq, "Lq", minimum=0), as_int(Lk, "Lk", minimum=0)
        if table.shape[1] % 2 != 1:
            raise ValueError(f"table with shape {table.shape} must have an odd number 2R + 1 of columns")
    idx = _relative_column(np.arange(Lq)[:, None], np.arange(Lk)[None, :], table.shape[1])  # (Lq, Lk)
    bias = table[:, idx][None]  # F1: (H, Lq, Lk) gather -> (1, H, Lq, Lk)
    return bias, (idx, table.shape)


def relative_position_bias_backward(d_bias: np.ndarray, cache):
    """d_bias: (..., H, Lq, Lk) broadcast over a batch axis -> d_table: (H, 2R + 1)."""
    idx, shape = cache
    d = d_bias.sum(axis=tuple(range(d_bias.ndim - 3)))  # (H, Lq, Lk), summed over the batch (empty ones too)
    d_table = np.zeros(shape, dtype=d_bias.dtype)
    np.add.at(d_table, (slice(None), idx), d)  # ← F1: scatter-add, repeated columns accumulate
    return d_table


# --------------------------------------------------------------------------- score terms (kernels.ScoreMod's form)
#
# A score term is a pair ``NAME_score(score, b, h, q_idx, kv_idx, **params) -> score'`` / ``NAME_score_vjp(score,
# b, h, q_idx, kv_idx, d_out, **params) -> (d_score, {param: gradient})``, torch FlexAttention's score_mod and its
# VJP: every kernel calls it on the block of scores it holds, with that block's indices (broadcastable to it), and
# sums the parameters' gradients over its blocks. ``steps.ScoreTerm`` turns one into an option of the module.


def sum_by_index(d: np.ndarray, index, size: int) -> np.ndarray:
    """Σ of ``d`` over the entries that share an index: index (ints, broadcastable to d) -> (size,) float64
    (the backward of a gather ``table.ravel()[index]``; repeated indices accumulate)."""
    flat = np.broadcast_to(index, d.shape).ravel()
    return np.bincount(flat, weights=d.ravel(), minlength=size)  # (size,)


def _only_keys(term, kv_idx, keys: int | None):
    """``term`` where the key j < keys, 0 at the keys appended after them (torch MHA's add_bias_kv, add_zero_attn);
    keys None: every key is the sequence's."""
    if keys is None or np.size(kv_idx) == 0 or np.max(kv_idx) < keys:
        return term  # no appended key in this block
    return np.where(kv_idx < keys, term, 0.0)


def _relative_column(q_idx, kv_idx, columns: int):
    """The column of a relative-position table of ``columns`` = 2R + 1 for each (i, j): clip(j - i, -R, R) + R, the
    one formula of ``relative_position_bias_forward`` and ``relative_position_score`` (and its VJP)."""
    R = (columns - 1) // 2
    return np.clip(kv_idx - q_idx, -R, R) + R


def relative_position_score(score, b, h, q_idx, kv_idx, *, rel_bias, keys=None):
    """score + rel_bias[h, clip(j - i, -R, R) + R] for the keys j < ``keys`` (appended keys get no term; None: all):
    the relative-position bias of ``relative_position_bias_forward`` on a block. rel_bias: (H, 2R + 1)."""
    col = _relative_column(q_idx, kv_idx, rel_bias.shape[1])  # F1: the table's column of each (i, j)
    term = rel_bias[h, col]  # F2: gather, broadcast to the block
    return score + _only_keys(term, kv_idx, keys)  # F3


def relative_position_score_vjp(score, b, h, q_idx, kv_idx, d_out, *, rel_bias, keys=None):
    """-> (d_score = d_out, {"rel_bias": (H, 2R + 1) the sum of d_out over the entries each column reached})."""
    n = rel_bias.shape[1]
    col = _relative_column(q_idx, kv_idx, n)  # ← F1
    d_term = _only_keys(d_out, kv_idx, keys)  # ← F3
    d_table = sum_by_index(d_term, h * n + col, rel_bias.size).reshape(rel_bias.shape)  # ← F2: scatter-add
    return d_out, {"rel_bias": d_table.astype(rel_bias.dtype)}


def _alibi_term(slopes, h, q_idx, kv_idx, offset: int):
    """-slopes[h] · |(i + offset) - j|, float64 broadcast to the indices: the one formula of ``alibi_bias`` and
    ``alibi_score``."""
    return -slopes[h] * np.abs(q_idx + offset - kv_idx)


def alibi_score(score, b, h, q_idx, kv_idx, *, slopes, offset: int = 0, keys=None):
    """score - slopes[h] · |(i + offset) - j| for the keys j < ``keys`` (None: all): ``alibi_bias`` on a block
    (slopes: (H,) ``alibi_slopes``, a constant)."""
    term = _alibi_term(slopes, h, q_idx, kv_idx, offset).astype(score.dtype)  # the block's penalties
    return score + _only_keys(term, kv_idx, keys)


def alibi_score_vjp(score, b, h, q_idx, kv_idx, d_out, *, slopes, offset: int = 0, keys=None):
    """-> (d_out, {}): a constant term."""
    return d_out, {}


def head_temperature_score(score, b, h, q_idx, kv_idx, *, head_temperature):
    """score · exp(t_h): a learned temperature per head (head_temperature (H,), 0 = unchanged)."""
    return score * np.exp(head_temperature)[h]  # F1: (H,)[h] broadcast to the block


def head_temperature_score_vjp(score, b, h, q_idx, kv_idx, d_out, *, head_temperature):
    """-> (d_out · exp(t_h), {"head_temperature": (H,) Σ over each head's entries of d_out · score · exp(t_h)})."""
    gain = np.exp(head_temperature)[h]  # ← F1
    d_t = sum_by_index(d_out * score * gain, h, head_temperature.size)  # (H,)
    return d_out * gain, {"head_temperature": d_t.astype(head_temperature.dtype)}


def log_length_scale_score(score, b, h, q_idx, kv_idx, *, attn_scale, floor_scale, offset: int = 0):
    """score · (log(⌊(p + 1) / floor_scale⌋ + 1) · attn_scale + 1), p = q_idx + offset the query's position (offset:
    the positions cached before the call): Llama 4's attention temperature tuning, a constant gain per query row.
    Llama 4 multiplies the query states by it, which multiplies the row's scores q·k by the same number."""
    p = np.asarray(q_idx + offset)  # the queries' positions, broadcastable to the block
    gain = np.log1p(np.floor((p + 1) / floor_scale)) * attn_scale + 1.0  # F1: (…, Lq, 1)-like, float64
    return score * gain.astype(score.dtype)  # F2


def log_length_scale_score_vjp(score, b, h, q_idx, kv_idx, d_out, *, attn_scale, floor_scale, offset: int = 0):
    """-> (d_out · gain, {}): a constant gain per row, no parameter."""
    p = np.asarray(q_idx + offset)
    gain = np.log1p(np.floor((p + 1) / floor_scale)) * attn_scale + 1.0  # ← F1
    return d_out * gain.astype(d_out.dtype), {}  # ← F2


def append_positions_forward(x: np.ndarray, extra: np.ndarray):
    """Append positions to a sequence of heads: a learned key/value (torch MHA's ``add_bias_kv``) or a zero one
    (``add_zero_attn``).

    x: (B, H, L, d)   extra: broadcastable to (B, H, n, d), e.g. (H, 1, d)   ->   out: (B, H, L + n, d)
    """
    B, H, L, d = x.shape
    tail = np.broadcast_to(extra, (B, H, np.shape(extra)[-2], d))  # (B, H, n, d), a view
    return np.concatenate([x, tail], axis=2), (L, np.shape(extra))  # F1: (B, H, L + n, d)


def append_positions_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L + n, d) -> dx: (B, H, L, d), d_extra: extra's shape (summed over what it was broadcast to)."""
    L, extra_shape = cache
    return d_out[:, :, :L], sum_to_shape(d_out[:, :, L:], extra_shape)  # ← F1: the two parts of the concatenation


def split_features_forward(x: np.ndarray, sizes, check: bool = True):
    """Cut the last axis into consecutive parts (MLA: a query head into [nope | rope], a latent into [c_kv | k_rope]).

    x: (..., n₁ + n₂ + ...)   sizes: (n₁, n₂, ...)   ->   [(..., n₁), (..., n₂), ...] (views), cache
    """
    if check:
        x = as_float_array(x, "x")
        sizes = [as_int(n, "sizes", minimum=0) for n in sizes]
        if x.ndim < 1 or sum(sizes) != x.shape[-1]:
            raise ValueError(f"x with shape {x.shape}: sizes {tuple(sizes)} must add up to its last dim")
    cuts = np.cumsum(sizes)[:-1]
    return np.split(x, cuts, axis=-1), tuple(sizes)  # F1: views of x


def split_features_backward(d_parts, cache):
    """[(..., n₁), (..., n₂), ...] -> dx: (..., n₁ + n₂ + ...): the parts' gradients side by side."""
    return np.concatenate(d_parts, axis=-1)  # ← F1


def concat_features_forward(a: np.ndarray, b: np.ndarray):
    """[a, b] along the last axis, b broadcast over a's other axes (MLA's key: each head's k_nope next to the one
    rope key every head shares).

    a: (B, H, L, n)   b: broadcastable to (B, H, L, m), e.g. (B, 1, L, m)   ->   out: (B, H, L, n + m)
    """
    tail = np.broadcast_to(b, (*a.shape[:-1], b.shape[-1]))  # (B, H, L, m), a view
    return np.concatenate([a, tail], axis=-1), (a.shape[-1], b.shape)  # F1: (B, H, L, n + m)


def concat_features_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L, n + m) -> da: (B, H, L, n), db: b's shape (summed over the heads it was shared by)."""
    n, b_shape = cache
    return d_out[..., :n], sum_to_shape(d_out[..., n:], b_shape)  # ← F1: the two parts; a broadcast's sum


def soft_cap_forward(scores: np.ndarray, cap: float):
    """Soft-capping (Gemma 2): cap · tanh(scores / cap), elementwise; the scores stay within (-cap, cap).

    scores: (...) -> (...). Small scores pass almost unchanged, large ones flatten towards ±cap.
    """
    t = np.tanh(scores / cap)  # F1: (...) in (-1, 1); a Python float keeps float32 float32
    return t * cap, t  # F2


def soft_cap_backward(d_out: np.ndarray, cache):
    """d_out: (...) -> d_scores: (...), d/ds [cap · tanh(s / cap)] = 1 - tanh²(s / cap)."""
    t = cache
    return d_out * (1.0 - t * t)  # ← F2, F1


def soft_cap_score(score, b, h, q_idx, kv_idx, *, cap: float):
    """cap · tanh(score / cap): ``soft_cap_forward`` as a score term (a FlexAttention score_mod: pass
    ``partial(soft_cap_score, cap=50.0)`` with ``partial(soft_cap_score_vjp, cap=50.0)``)."""
    return soft_cap_forward(score, cap)[0]


def soft_cap_score_vjp(score, b, h, q_idx, kv_idx, d_out, *, cap: float):
    """-> (d_out · (1 - tanh²(score / cap)), {}): ``soft_cap_backward`` at the block's own scores."""
    return soft_cap_backward(d_out, soft_cap_forward(score, cap)[1]), {}


# --------------------------------------------------------------------------- differential attention (DiffLlama)


def _check_paired_heads(x, name: str) -> np.ndarray:
    x = as_float_array(x, name, ndim=4)
    if x.shape[1] % 2:
        raise ValueError(f"{name} with shape {x.shape}: differential attention pairs its heads, axis 1 must be even")
    return x


def diff_values_forward(v: np.ndarray, check: bool = True):
    """Differential attention's values: key/value heads j and j + Hkv/2 side by side, for the pair's two maps.

    v: (B, Hkv, L, d), Hkv even -> out: (B, Hkv, L, 2d), out head j = [v_{j mod Hkv/2}, v_{j mod Hkv/2 + Hkv/2}]
    (Hugging Face DiffLlama's two halves of V, each repeated to Hkv heads, concatenated). A query head h and its
    partner h + H/2 then read the same 2d-wide values after ``repeat_kv``, so their contexts differ only by the map.
    """
    if check:
        v = _check_paired_heads(v, "v")
    half = v.shape[1] // 2
    pair = np.concatenate([v[:, :half], v[:, half:]], axis=-1)  # F1: (B, Hkv/2, L, 2d), [v_j, v_{j + Hkv/2}]
    return np.concatenate([pair, pair], axis=1), v.shape  # F2: (B, Hkv, L, 2d), both halves of the heads


def diff_values_backward(d_out: np.ndarray, cache):
    """d_out: (B, Hkv, L, 2d) -> dv: (B, Hkv, L, d)."""
    d = cache[-1]
    half = d_out.shape[1] // 2
    d_pair = d_out[:, :half] + d_out[:, half:]  # ← F2: (B, Hkv/2, L, 2d), the pair was used by both halves
    return np.concatenate([d_pair[..., :d], d_pair[..., d:]], axis=1)  # ← F1: (B, Hkv, L, d)


def diff_lambda_forward(lambda_q1, lambda_k1, lambda_q2, lambda_k2, lambda_init: float, check: bool = True):
    """Differential attention's weight, re-parameterised: λ = exp(λ_q1 · λ_k1) − exp(λ_q2 · λ_k2) + λ_init.

    lambda_q1, lambda_k1, lambda_q2, lambda_k2: (d,) learned; lambda_init: a number (DiffLlama: 0.8 − 0.6 ·
    exp(−0.3 · layer_idx)) -> lam: () in the vectors' dtype. Derivation: docs/derivation.md, "Differential attention".
    """
    if check:
        names = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
        given = (lambda_q1, lambda_k1, lambda_q2, lambda_k2)
        lambda_q1, lambda_k1, lambda_q2, lambda_k2 = (as_float_array(a, n, ndim=1) for a, n in zip(given, names))
        shapes = {n: a.shape + (a.dtype.name,) for n, a in zip(names, (lambda_q1, lambda_k1, lambda_q2, lambda_k2))}
        if len(set(shapes.values())) > 1:
            raise ValueError(f"{', '.join(names)} must share one shape (d,) and dtype, got {shapes}")
        lambda_init = as_number(lambda_init, "lambda_init")
    e1 = np.exp(lambda_q1 @ lambda_k1)  # F1: () exp of the dot product, (d,) @ (d,) -> ()
    e2 = np.exp(lambda_q2 @ lambda_k2)  # F2: ()
    lam = e1 - e2 + lambda_init  # F3: ()
    return lam, (lambda_q1, lambda_k1, lambda_q2, lambda_k2, e1, e2)


def diff_lambda_backward(d_lam, cache):
    """d_lam: () -> d_lambda_q1, d_lambda_k1, d_lambda_q2, d_lambda_k2: (d,) each."""
    q1, k1, q2, k2, e1, e2 = cache
    d_dot1 = d_lam * e1  # ← F3, F1: d exp(a)/da = exp(a)
    d_dot2 = -d_lam * e2  # ← F3, F2: λ falls as the second exponential grows
    return d_dot1 * k1, d_dot1 * q1, d_dot2 * k2, d_dot2 * q2  # ← F1, F2: the dot products' two factors


def diff_combine_forward(context: np.ndarray, lam, lambda_init: float, eps: float, check: bool = True):
    """Differential attention's heads: the pair of query heads p and p + H/2 becomes one head of width 2d,

        out_p = (1 − λ_init) · RMSNorm(context_p − λ · context_{p + H/2})     (the RMSNorm over 2d, no weights)

    context: (B, H, Lq, 2d) each head's map times its pair's values (``diff_values_forward``), lam: () the learned
    weight (``diff_lambda_forward``) -> out: (B, H/2, Lq, 2d). The two heads of a pair read the same values, so
    context_p − λ context_{p + H/2} = (A_p − λ A_{p + H/2}) V_pair: the difference of the two maps, applied to them.
    The RMSNorm is DiffLlama's "groupnorm" (``rms_norm_forward`` with the constant gain 1 − λ_init as its weight).
    """
    if check:
        context = _check_paired_heads(context, "context")
        lam = as_float_array(lam, "lam", ndim=0)
        if lam.dtype != context.dtype:
            raise ValueError(f"lam has dtype {lam.dtype}, context {context.dtype}: one dtype (float32 stays float32)")
        lambda_init, eps = as_number(lambda_init, "lambda_init"), as_number(eps, "eps", positive=True)
    half = context.shape[1] // 2
    first, second = context[:, :half], context[:, half:]  # F1: (B, H/2, Lq, 2d) each, views
    diff = first - lam * second  # F2: (B, H/2, Lq, 2d)
    gain = np.full(context.shape[-1], 1.0 - lambda_init, dtype=context.dtype)  # (2d,) a constant, not learned
    out, norm = rms_norm_forward(diff, gain, eps, check=False)  # F3: (B, H/2, Lq, 2d)
    return out, (second, lam, norm)


def diff_combine_backward(d_out: np.ndarray, cache):
    """d_out: (B, H/2, Lq, 2d) -> d_context: (B, H, Lq, 2d), d_lam: ()."""
    second, lam, norm = cache
    d_diff = rms_norm_backward(d_out, norm)[0]  # ← F3: (B, H/2, Lq, 2d); the gain is a constant, its gradient unused
    d_lam = -np.sum(d_diff * second)  # ← F2: ()
    return np.concatenate([d_diff, -lam * d_diff], axis=1), d_lam  # ← F2, F1: (B, H, Lq, 2d)


# --------------------------------------------------------------------------- attention


@dataclass
class AttentionCache:
    """The cache of ``scaled_dot_product_attention_forward``: named intermediates and each step's cache.

    scores: (B, H, Lq, Lk) q kᵀ · scale (+ bias, then any score changes such as a soft-cap), before the mask.
    masked_scores: (B, H, Lq, Lk) after the mask (-inf where blocked).
    attn_weights: (B, H, Lq, Lk) after softmax, before dropout. Fully masked rows are 0.
    dropout_mask: (B, H, Lq, Lk) bool keep-mask, or None when no dropout was applied.
    steps: each step's cache by name: "scores", "bias", "mask", "softmax", "dropout", "context", and
        "score_mods" when the call had score changes (``score_mods_forward``'s cache).
    kernel: the kernel that made this cache (set by ``mha_numpy.kernels``), or None.
    lse (a property): (B, H, Lq) float64, each row's log-sum-exp of the masked scores (``log_sum_exp``), the sink
        counted when the call had one ("sinks" in steps: the logits as given, broadcast to (B, H, Lq)).
    """

    scores: np.ndarray
    masked_scores: np.ndarray
    attn_weights: np.ndarray
    dropout_mask: np.ndarray | None
    steps: dict
    kernel: object = None

    @property
    def lse(self) -> np.ndarray:
        """(B, H, Lq) float64 log Σ_j exp(masked score_ij) (+ exp(sink)), -inf for a fully masked row without a
        sink; computed now."""
        return log_sum_exp(self.masked_scores, self.steps.get("sinks"))


def scaled_dot_product_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    dropout_mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
):
    """softmax(q kᵀ · scale + bias + mask) v, composed from the pairs above.

    q: (B, H, Lq, d)   k: (B, H, Lk, d)   v: (B, H, Lk, dv)
    mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk) (a ``masks.StructuredMask``
    too: this composition holds the whole score tensor, so it builds the mask's entries)
    scale: defaults to 1/sqrt(d). dropout_p > 0 drops attention weights (needs rng or
    dropout_mask, a bool keep-mask of shape (B, H, Lq, Lk)).
    bias: optional float, broadcastable to (B, H, Lq, Lk), added to the scores; it gets a gradient.
    -> context: (B, H, Lq, dv), cache (an AttentionCache; cache.attn_weights is (B, H, Lq, Lk))
    Other kernels computing the same thing (naive, chunked) are in ``mha_numpy.kernels``.
    """
    q, k, v = check_qkv(q, k, v)
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])  # (B, H, Lq, Lk)
    mask = check_mask(mask, shape)
    bias = check_mask(bias, shape, name="bias", allow_bool=False, dtype=q.dtype)
    keep = check_dropout(shape, dropout_p, rng, dropout_mask)
    if keep is None and dropout_p > 0.0:
        keep = as_generator(rng).random(shape) >= dropout_p  # (B, H, Lq, Lk) True = keep
    return attention_steps_forward(q, k, v, mask, default_scale(q.shape[-1], scale), dropout_p, keep, bias)


def attention_steps_forward(
    q, k, v, mask, scale: float, dropout_p: float, keep, bias=None, score_mods=(), kernel=None, sinks=None, index=None
):
    """The composition itself, on arguments already checked (``keep``: bool keep-mask or None).

    score_mods: changes of the scores after the bias, before the mask (a soft-cap, a relative-position table, ...),
    each called ``mod(score, b, h, q_idx, kv_idx)`` with ``mod.backward(score, b, h, q_idx, kv_idx, d_out) ->
    (d_score, {param: grad})`` (``kernels.ScoreMod``); index: their (b, h, q_idx, kv_idx), broadcastable to the
    scores (default: the positions in a (B, H, Lq, Lk) tensor, ``score_index``).
    kernel: the kernel running this composition, recorded in the cache (None when called directly).
    sinks: None, or each row's sink logit, broadcastable to (B, H, Lq) (a kernel passes its heads' (H, 1)): the
    softmax is then ``sink_softmax_forward`` and the backward returns the sinks' gradient in that shape.
    """
    scores, c_scores = attention_scores_forward(q, k, scale)  # (B, H, Lq, Lk)
    biased, c_bias = score_bias_forward(scores, bias)  # (B, H, Lq, Lk)
    modded, c_mods = score_mods_forward(biased, score_mods, index)  # (B, H, Lq, Lk)
    masked, c_mask = apply_mask_forward(modded, mask, check=False)  # (B, H, Lq, Lk)
    if sinks is None:
        weights, c_soft = softmax_forward(masked, check=False)  # (B, H, Lq, Lk)
    else:
        weights, c_soft = sink_softmax_forward(masked, sinks, check=False)  # (B, H, Lq, Lk), the sinks' weights apart
    dropped, c_drop = dropout_forward(weights, dropout_p, keep_mask=keep)  # (B, H, Lq, Lk)
    context, c_ctx = attention_context_forward(dropped, v)  # (B, H, Lq, dv)
    steps = dict(scores=c_scores, bias=c_bias, mask=c_mask, softmax=c_soft, dropout=c_drop, context=c_ctx)
    if score_mods:
        steps["score_mods"] = c_mods  # (mods, inputs, index)
    if sinks is not None:
        steps["sinks"] = sinks
    return context, AttentionCache(modded, masked, weights, None if c_drop is None else c_drop[0], steps, kernel)


def score_index(shape) -> tuple:
    """(b, h, q_idx, kv_idx) of every entry of a (B, H, Lq, Lk) score tensor, broadcastable to it:
    (B, 1, 1, 1), (1, H, 1, 1), (1, 1, Lq, 1), (1, 1, 1, Lk)."""
    return np.ix_(*(np.arange(n) for n in shape))


def score_mods_forward(scores: np.ndarray, mods=(), index=None):
    """Apply each score change in order: scores (B, H, Lq, Lk) or any block of them -> the same shape, and the
    cache (the mods, each one's input, the block's index (b, h, q_idx, kv_idx); default ``score_index``)."""
    index = score_index(scores.shape) if index is None and mods else index
    inputs = []
    for mod in mods:
        inputs.append(scores)  # what its backward is taken at
        scores = mod(scores, *index)  # F1: one per change
    return scores, (tuple(mods), inputs, index)


def score_mods_backward(d_out: np.ndarray, cache):
    """d_out: the gradient of the changed scores -> (the gradient of the scores before the changes, in reverse
    order, {mod name: {param: gradient}} for the changes with parameters)."""
    mods, inputs, index = cache
    d_params = {}
    for mod, scores in zip(reversed(mods), reversed(inputs)):
        d_out, grads = mod.backward(scores, *index, d_out)  # ← F1
        if grads:
            d_params[mod.name] = grads
    return d_out, d_params


def scaled_dot_product_attention_backward(d_context: np.ndarray, cache: AttentionCache, d_lse=None):
    """d_context: (B, H, Lq, dv) -> dq: (B, H, Lq, d), dk: (B, H, Lk, d), dv: (B, H, Lk, dv), d_bias: the
    bias's shape, or None when the forward was given no bias (one gradient per differentiable input, always four).
    d_lse: None, or (B, H, Lq) the gradient of ``cache.lse`` when the rows' log-sum-exp is used downstream."""
    p, v = cache.steps["context"]  # (B, H, Lq, Lk), (B, H, Lk, dv)
    d_context = check_d_context(d_context, (*p.shape[:-1], v.shape[-1]), v.dtype)  # no silent broadcast
    d_lse = check_d_lse(d_lse, p.shape[:-1], v.dtype)
    return attention_steps_backward(d_context, cache, d_lse)[:4]  # dq, dk, dv, d_bias or None: no sinks here


def attention_steps_backward(d_context: np.ndarray, cache: AttentionCache, d_lse=None):
    """The steps of ``attention_steps_forward`` in reverse: -> (dq, dk, dv, d_bias or None, d_sinks or None,
    {mod name: {param: gradient}} of the score mods with parameters).

    d_lse: None, or (B, H, Lq) (checked) the gradient of the rows' log-sum-exp (``cache.lse``)."""
    c = cache.steps
    d_dropped, dv = attention_context_backward(d_context, c["context"])  # (B, H, Lq, Lk), (B, H, Lk, dv)
    d_weights = dropout_backward(d_dropped, c["dropout"])  # (B, H, Lq, Lk)
    if "sinks" in c:
        d_masked, d_sinks = sink_softmax_backward(d_weights, c["softmax"], d_lse)  # (B, H, Lq, Lk), sinks' shape
    else:
        lse_grad = () if d_lse is None else (d_lse,)  # a softmax_backward(dp, cache) swapped in still fits
        d_masked, d_sinks = softmax_backward(d_weights, c["softmax"], *lse_grad), None  # d_lse: lse's gradient joins
    d_modded = apply_mask_backward(d_masked, c["mask"])  # (B, H, Lq, Lk)
    d_biased, d_params = score_mods_backward(d_modded, c["score_mods"]) if "score_mods" in c else (d_modded, {})
    d_scores, d_bias = score_bias_backward(d_biased, c["bias"])  # (B, H, Lq, Lk), bias shape
    dq, dk = attention_scores_backward(d_scores, c["scores"])  # (B, H, Lq, d), (B, H, Lk, d)
    return dq, dk, dv, d_bias, d_sinks, d_params


# Short alias: the functional "call" is the forward half of the pair.
scaled_dot_product_attention = scaled_dot_product_attention_forward


# --------------------------------------------------------------------------- merging partial attention
#
# Attention over keys split into disjoint sets (key blocks, KV-cache shards, a ring's ranks) is S partial results
# (C_s, lse_s): C_s = Σ_{j∈s} exp(S_ij - lse_s) V_j, each normalised over its own keys, and lse_s their row's
# log-sum-exp (a kernel's ``cache.lse``). The whole row's lse is log Σ_s exp(lse_s), and each partial weighs
# w_s = exp(lse_s - lse) in the whole softmax, so C = Σ_s w_s C_s exactly: a softmax over the S partials, whose
# "scores" are their lses. Derivation: docs/derivation.md § 27.

MERGE_ORDERS = ("flat", "sequential", "tree")


def _check_partials(contexts, lses) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """contexts: S >= 1 arrays (B, H, Lq, dv) of one shape and dtype (a list, or one (S, B, H, Lq, dv) array);
    lses: S arrays (B, H, Lq) -> (contexts, lses as float64), or ValueError naming the argument and its shape."""
    for name, parts in (("contexts", contexts), ("lses", lses)):
        if isinstance(parts, (str, bytes)) or not hasattr(parts, "__len__") or len(parts) == 0:
            raise ValueError(f"{name} must be a non-empty sequence of arrays (one per partial), got {parts!r:.60}")
    if len(contexts) != len(lses):
        raise ValueError(f"contexts has {len(contexts)} partials but lses has {len(lses)}: one lse per context")
    C = [as_float_array(c, f"contexts[{s}]", ndim=4) for s, c in enumerate(contexts)]
    L = [as_float_array(lse, f"lses[{s}]") for s, lse in enumerate(lses)]
    for s, (c, lse) in enumerate(zip(C, L)):
        if c.shape != C[0].shape or c.dtype != C[0].dtype:
            raise ValueError(f"contexts[{s}] is {c.dtype} {c.shape} but contexts[0] is {C[0].dtype} {C[0].shape}")
        if lse.shape != c.shape[:3]:
            raise ValueError(f"lses[{s}] has shape {lse.shape}; expected {c.shape[:3]} (B, H, Lq) like contexts[{s}]")
    return C, [lse.astype(np.float64, copy=False) for lse in L]


def _merge_weights(L: list[np.ndarray]):
    """S lses (B, H, Lq) float64 -> (lse (B, H, Lq), w (S, B, H, Lq)): the whole row's lse and each partial's weight."""
    lse_s = np.stack(L)  # (S, B, H, Lq) float64
    m = lse_s.max(axis=0)  # (B, H, Lq), NaN if a partial's lse is NaN
    m = np.where(np.isneginf(m), 0.0, m)  # every partial empty for the row: shift by 0, exp(-inf) = 0
    e = np.exp(lse_s - m)  # F1: (S, B, H, Lq) in [0, 1], 0 for a partial empty for the row
    total = e.sum(axis=0)  # F2: (B, H, Lq), 0 only where every partial is empty
    with np.errstate(divide="ignore"):  # log 0 = -inf: the row has no key at all
        lse = m + np.log(total)  # F2: (B, H, Lq) the whole row's log-sum-exp
    return lse, e / np.where(total == 0, 1.0, total)  # F3: (S, B, H, Lq) w_s = exp(lse_s - lse), 0 for an empty row


def _merge(C: list[np.ndarray], L: list[np.ndarray]):
    """The S-way merge on checked partials -> (context, lse, w): w (S, B, H, Lq) float64 each partial's weight."""
    lse, w = _merge_weights(L)  # F1-F3
    context = np.zeros_like(C[0])  # (B, H, Lq, dv) in the contexts' dtype
    for w_s, c_s in zip(w.astype(C[0].dtype), C):
        context += w_s[..., None] * c_s  # F4: (B, H, Lq, 1) * (B, H, Lq, dv), C = Σ_s w_s C_s
    return context, lse, w


def _merge_two(a, b):
    """Two partials (C, lse) -> their merge (C, lse)."""
    return _merge([a[0], b[0]], [a[1], b[1]])[:2]


def merge_attention_forward(contexts, lses, order: str = "flat"):
    """Merge S partial attentions over disjoint key sets into the attention over their union, exactly.

    contexts: S arrays (B, H, Lq, dv) (a list, or one (S, B, H, Lq, dv) array), each softmax-normalised over its own
    keys; lses: S arrays (B, H, Lq), each row's log-sum-exp over those keys (a kernel's ``cache.lse``; -inf where
    the partial has no allowed key for the row).
    -> (context (B, H, Lq, dv) in the contexts' dtype, lse (B, H, Lq) float64), cache.

        lse = log Σ_s exp(lse_s)      w_s = exp(lse_s - lse)      C = Σ_s w_s C_s

    A row where every partial is empty gets a zero context and lse -inf, never NaN; a partial empty for a row
    gets weight 0 there (a kernel gives it a zero context). A NaN stays NaN, in a context even where its weight
    is 0. The weights are float64, the weighted sum in the contexts' dtype (float32 stays float32).
    order: how the S partials are combined, all equal in exact arithmetic (they round differently):
    "flat" one S-way merge (one max, one sum); "sequential" folds them in one by one, ((1, 2), 3), ..., as a ring
    does step by step; "tree" merges neighbours pairwise, ((1, 2), (3, 4)), ..., in log2 S levels.
    The backward is the same for every order (the gradient of the exact merge).
    """
    C, L = _check_partials(contexts, lses)
    if order not in MERGE_ORDERS:
        raise ValueError(f"order must be one of {MERGE_ORDERS}, got {order!r}")
    if order == "flat" or len(C) == 1:
        context, lse, w = _merge(C, L)
    else:
        parts = list(zip(C, L))  # (C_s, lse_s) each
        if order == "sequential":  # the running result, then the next partial
            merged = parts[0]
            for part in parts[1:]:
                merged = _merge_two(merged, part)
        else:  # "tree": one level merges neighbours pairwise, an odd one out goes up as it is
            while len(parts) > 1:
                parts = [
                    _merge_two(*parts[i : i + 2]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)
                ]
            merged = parts[0]
        context, lse = merged
        w = _merge_weights(L)[1]  # (S, B, H, Lq) the weights, for the backward (as e / total: they sum to 1)
    return (context, lse), (C, w)


def merge_attention_backward(d_context: np.ndarray, cache, d_lse: np.ndarray | None = None):
    """d_context: (B, H, Lq, dv) -> (d_contexts: S arrays (B, H, Lq, dv), d_lses: S arrays (B, H, Lq) float64).

    d_lse: None, or (B, H, Lq) the gradient of the merged lse. The merge is a softmax over the partials whose scores
    are their lses, so its VJP is the softmax's, with dp_s = rowsum(dC ∘ C_s) and d_lse joining the row term:

        dC_s = w_s dC        d lse_s = w_s (dp_s - (Σ_t w_t dp_t - d_lse))

    A partial empty for a row (w_s = 0) gets zero gradients there; so does every partial of an empty row.
    """
    C, w = cache
    d_context = check_d_context(d_context, C[0].shape, C[0].dtype)  # no silent broadcast
    d_lse = check_d_lse(d_lse, C[0].shape[:3], np.float64)
    d_contexts = [w_s[..., None].astype(c.dtype) * d_context for w_s, c in zip(w, C)]  # ← F4: (B, H, Lq, dv) each
    dp = np.stack([np.einsum("...d,...d->...", d_context, c, dtype=np.float64) for c in C])  # ← F4: (S, B, H, Lq)
    row_dot = (w * dp).sum(axis=0)  # ← F3: (B, H, Lq) Σ_t w_t dp_t
    if d_lse is not None:
        row_dot -= d_lse  # ← F2: ∂ lse / ∂ lse_s = w_s, folded into the row term
    d_lses = w * (dp - row_dot)  # ← F3, F1: (S, B, H, Lq) w_s (dp_s - (Σ w dp - d_lse))
    return d_contexts, list(d_lses)


# --------------------------------------------------------------------------- the output gate (Qwen3-Next)


def gate_query_forward(x: np.ndarray, check: bool = True):
    """Each head's query: the first half of its 2d features, the second half being its gate (Qwen3-Next's q_proj,
    viewed (B, L, H, 2d) and chunked in two on the last axis).

    x: (B, H, L, 2d)   ->   out: (B, H, L, d), a view.
    """
    if check:
        x = as_float_array(x, "x", ndim=4)
        if x.shape[-1] % 2:
            raise ValueError(f"x with shape {x.shape}: each head's features are [query | gate], an even number")
    d = x.shape[-1] // 2
    return x[..., :d], x.shape  # F1: (B, H, L, d)


def gate_query_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L, d) -> dx: (B, H, L, 2d), zero on the gate's half (its gradient comes by ``output_gate``)."""
    dx = np.zeros(cache, dtype=d_out.dtype)  # (B, H, L, 2d)
    dx[..., : d_out.shape[-1]] = d_out  # ← F1
    return dx


def output_gate_forward(x: np.ndarray, q: np.ndarray, check: bool = True):
    """The heads' contexts gated by the second half of each head's query projection: x · sigmoid(gate) (Qwen3-Next).

    x: (B, H, L, d) the contexts   q: (B, L, H·2d) the query projection, head h's features [query_h | gate_h]
    ->   out: (B, H, L, d). sigmoid(g) = (1 + tanh(g / 2)) / 2, which overflows nowhere.
    """
    if check:
        x = as_float_array(x, "x", ndim=4)
        q = as_float_array(q, "q", ndim=3)
        B, H, L, d = x.shape
        if q.shape != (B, L, 2 * H * d):
            raise ValueError(f"q with shape {q.shape} must be (B, L, 2·H·d) = {(B, L, 2 * H * d)} for x {x.shape}")
    B, H, L, d = x.shape
    gate = q.reshape(B, L, H, 2 * d)[..., d:]  # F1: (B, L, H, d), each head's second half
    gate = gate.transpose(0, 2, 1, 3)  # F2: (B, H, L, d)
    s = 0.5 * (1.0 + np.tanh(0.5 * gate))  # F3: sigmoid(gate), (B, H, L, d)
    return x * s, (x, s)  # F4: (B, H, L, d)


def output_gate_backward(d_out: np.ndarray, cache):
    """d_out: (B, H, L, d) -> (dx (B, H, L, d), dq (B, L, H·2d), zero on the queries' halves)."""
    x, s = cache
    B, H, L, d = x.shape
    dx = d_out * s  # ← F4
    d_gate = d_out * x * s * (1.0 - s)  # ← F4, ← F3: sigmoid' = s (1 − s)
    dq = np.zeros((B, L, H, 2 * d), dtype=d_out.dtype)  # (B, L, H, 2d)
    dq[..., d:] = d_gate.transpose(0, 2, 1, 3)  # ← F2, ← F1: (B, L, H, d) into each head's second half
    return dx, dq.reshape(B, L, 2 * H * d)
