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

from ._checks import (
    as_float_array,
    as_generator,
    check_dropout,
    check_mask,
    check_probability,
    check_qkv,
    default_scale,
)

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
    x2 = x.reshape(-1, W.shape[1])  # (N, in), N = product of the leading dims: one GEMM, not one per batch item
    y = x2 @ W.T  # F1: (N, in) @ (in, out) -> (N, out)
    if b is not None:
        y += b  # F2: (N, out) + (out,), in place on the fresh product
    return y.reshape(*x.shape[:-1], W.shape[0]), (x2, W, b is not None, x.shape)  # (..., out)


def linear_backward(dy: np.ndarray, cache):
    """dy: (..., out)  ->  dx: (..., in), dW: (out, in), db: (out,) or None."""
    x2, W, has_bias, x_shape = cache
    dy2 = dy.reshape(-1, W.shape[0])  # (N, out)
    dx = (dy2 @ W).reshape(x_shape)  # ← F1: (N, out) @ (out, in) -> (N, in) -> (..., in)
    dW = dy2.T @ x2  # ← F1: (out, N) @ (N, in) -> (out, in)
    db = dy2.sum(axis=0) if has_bias else None  # ← F2: (out,), summed over every leading axis
    return dx, dW, db


def fused_linear_forward(x: np.ndarray, Ws: list[np.ndarray], bs: list[np.ndarray] | None = None):
    """[y₁, ..., yₙ] with yᵢ = x Wᵢᵀ + bᵢ, as one GEMM over the stacked weights (q, k, v of self-attention).

    x: (..., in)   Wᵢ: (outᵢ, in)   bᵢ: (outᵢ,)   ->   [yᵢ: (..., outᵢ)] (views of one array), cache
    """
    W = np.concatenate(Ws)  # (Σ outᵢ, in)
    b = None if bs is None else np.concatenate(bs)  # (Σ outᵢ,)
    y, c = linear_forward(x, W, b)  # F1: (..., Σ outᵢ)
    cuts = np.cumsum([w.shape[0] for w in Ws])[:-1]
    return np.split(y, cuts, axis=-1), (c, cuts)  # F2: split the columns


def fused_linear_backward(dys: list[np.ndarray], cache):
    """[dyᵢ: (..., outᵢ)] -> ([dxᵢ: (..., in)] one per output, [dWᵢ], [dbᵢ] or None).

    Each output's gradients are those of ``linear_backward`` on its rows of the stacked weight (nothing of
    size (N, Σ outᵢ) is assembled); the input gradient is kept per output (the three paths of
    self-attention), each dyᵢ Wᵢ.
    """
    (x2, W, has_bias, x_shape), cuts = cache
    grads = [linear_backward(dy, (x2, w, has_bias, x_shape)) for dy, w in zip(dys, np.split(W, cuts))]  # ← F2, F1
    dxs, dWs, dbs = (list(g) for g in zip(*grads))  # [(..., in)], [(outᵢ, in)], [(outᵢ,) or None]
    return dxs, dWs, dbs if has_bias else None


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
    scores *= scale  # F2, in place on the fresh product
    return scores, (q, k, scale)


def attention_scores_backward(d_scores: np.ndarray, cache):
    """d_scores: (B, H, Lq, Lk)  ->  dq: (B, H, Lq, d), dk: (B, H, Lk, d)."""
    q, k, scale = cache
    dq = d_scores @ k  # ← F1: (B, H, Lq, Lk) @ (B, H, Lk, d) -> (B, H, Lq, d)
    dk = d_scores.swapaxes(-1, -2) @ q  # ← F1: (B, H, Lk, Lq) @ (B, H, Lq, d) -> (B, H, Lk, d)
    dq *= scale  # ← F2: the scale, applied to the (L, d) results rather than to the (Lq, Lk) d_scores
    dk *= scale  # ← F2
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

    x: (..., Lk) -> p: (..., Lk). A row whose entries are all -inf (fully masked) gives all-zero
    weights instead of NaN (PyTorch's softmax gives NaN there; see docs/masks.md). A NaN or a +inf
    in a row makes the whole row NaN, as in PyTorch. Lk = 0 gives an empty result.
    """
    if x.shape[-1] == 0:
        return x.copy(), x.copy()  # no key at all: nothing to weigh
    row_max = x.max(axis=-1, keepdims=True)  # (..., 1); NaN if the row holds a NaN
    row_max = np.where(np.isneginf(row_max), 0.0, row_max)  # fully masked row: shift by 0, exp(-inf) = 0
    p = x - row_max  # (..., Lk), a new array: the steps below work in place on it
    np.exp(p, out=p)  # F1: (..., Lk), every entry in [0, 1] (or NaN)
    total = p.sum(axis=-1, keepdims=True)  # F2: (..., 1), 0 only for a fully masked row
    p /= np.where(total == 0, 1.0, total)  # F3: (..., Lk); a fully masked row stays 0, NaN stays NaN
    return p, p


def softmax_backward(dp: np.ndarray, cache):
    """Vector-Jacobian product of softmax: dx = p ∘ (dp - Σ_j p_j dp_j).

    Never the full Jacobian, never the diagonal-only p(1 - p) shortcut.
    dp: (..., Lk) -> dx: (..., Lk)
    """
    p = cache
    row_dot = np.einsum("...k,...k->...", p, dp)[..., None]  # ← F3, F2: (..., 1) Σ_j p_j dp_j
    dx = dp - row_dot  # ← F1: (..., Lk), a new array
    dx *= p  # ← F1: p ∘ (dp - Σ p dp), in place
    return dx


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


def relative_position_bias_forward(table: np.ndarray, Lq: int, Lk: int):
    """A learned bias per head and clipped distance j - i (as in T5 / Shaw et al., without buckets).

    table: (H, 2R + 1), column R + t is the bias for key j = i + t, t clipped to [-R, R]
    -> bias (1, H, Lq, Lk), to be added to the scores by ``score_bias_forward``.
    """
    table = as_float_array(table, "table", ndim=2)
    R = (table.shape[1] - 1) // 2
    if table.shape[1] != 2 * R + 1:
        raise ValueError(f"table with shape {table.shape} must have an odd number 2R + 1 of columns")
    dist = np.arange(Lk)[None, :] - np.arange(Lq)[:, None]  # (Lq, Lk) j - i
    idx = np.clip(dist, -R, R) + R  # (Lq, Lk) column of the table
    bias = table[:, idx][None]  # F1: (H, Lq, Lk) gather -> (1, H, Lq, Lk)
    return bias, (idx, table.shape)


def relative_position_bias_backward(d_bias: np.ndarray, cache):
    """d_bias: (..., H, Lq, Lk) broadcast over a batch axis -> d_table: (H, 2R + 1)."""
    idx, shape = cache
    d = d_bias.reshape(-1, *d_bias.shape[-3:]).sum(axis=0)  # (H, Lq, Lk), summed over the batch
    d_table = np.zeros(shape, dtype=d_bias.dtype)
    np.add.at(d_table, (slice(None), idx), d)  # ← F1: scatter-add, repeated columns accumulate
    return d_table


# --------------------------------------------------------------------------- attention


@dataclass
class AttentionCache:
    """The cache of ``scaled_dot_product_attention_forward``: named intermediates and each step's cache.

    scores: (B, H, Lq, Lk) q kᵀ · scale (+ bias), before the mask.
    masked_scores: (B, H, Lq, Lk) after the mask (-inf where blocked).
    attn_weights: (B, H, Lq, Lk) after softmax, before dropout. Fully masked rows are 0.
    dropout_mask: (B, H, Lq, Lk) bool keep-mask, or None when no dropout was applied.
    steps: each step's cache by name: "scores", "bias", "mask", "softmax", "dropout", "context".
    kernel: the kernel that made this cache (set by ``mha_numpy.kernels``), or None.
    """

    scores: np.ndarray
    masked_scores: np.ndarray
    attn_weights: np.ndarray
    dropout_mask: np.ndarray | None
    steps: dict
    kernel: object = None


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
    mask: bool (True = may attend) or float (added), broadcastable to (B, H, Lq, Lk)
    scale: defaults to 1/sqrt(d). dropout_p > 0 drops attention weights (needs rng or
    dropout_mask, a bool keep-mask of shape (B, H, Lq, Lk)).
    bias: optional float, broadcastable to (B, H, Lq, Lk), added to the scores; it gets a gradient.
    -> context: (B, H, Lq, dv), cache (an AttentionCache; cache.attn_weights is (B, H, Lq, Lk))
    Other kernels computing the same thing (naive, chunked) are in ``mha_numpy.kernels``.
    """
    q, k, v = check_qkv(q, k, v)
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])  # (B, H, Lq, Lk)
    mask = check_mask(mask, shape)
    bias = check_mask(bias, shape, name="bias", allow_bool=False)
    keep = check_dropout(shape, dropout_p, rng, dropout_mask)
    if keep is None and dropout_p > 0.0:
        keep = as_generator(rng).random(shape) >= dropout_p  # (B, H, Lq, Lk) True = keep
    return attention_steps_forward(q, k, v, mask, default_scale(q.shape[-1], scale), dropout_p, keep, bias)


def attention_steps_forward(q, k, v, mask, scale: float, dropout_p: float, keep, bias=None):
    """The composition itself, on arguments already checked (``keep``: bool keep-mask or None)."""
    scores, c_scores = attention_scores_forward(q, k, scale)  # (B, H, Lq, Lk)
    biased, c_bias = score_bias_forward(scores, bias)  # (B, H, Lq, Lk)
    masked, c_mask = apply_mask_forward(biased, mask)  # (B, H, Lq, Lk)
    weights, c_soft = softmax_forward(masked)  # (B, H, Lq, Lk)
    dropped, c_drop = dropout_forward(weights, dropout_p, keep_mask=keep)  # (B, H, Lq, Lk)
    context, c_ctx = attention_context_forward(dropped, v)  # (B, H, Lq, dv)
    steps = dict(scores=c_scores, bias=c_bias, mask=c_mask, softmax=c_soft, dropout=c_drop, context=c_ctx)
    return context, AttentionCache(biased, masked, weights, None if c_drop is None else c_drop[0], steps)


def scaled_dot_product_attention_backward(d_context: np.ndarray, cache: AttentionCache):
    """d_context: (B, H, Lq, dv) -> dq: (B, H, Lq, d), dk: (B, H, Lk, d), dv: (B, H, Lk, dv),
    and a fourth entry, d_bias (the bias's shape), when the forward was given a bias."""
    dq, dk, dv, d_bias = attention_steps_backward(d_context, cache)
    return (dq, dk, dv) if d_bias is None else (dq, dk, dv, d_bias)


def attention_steps_backward(d_context: np.ndarray, cache: AttentionCache):
    """The steps of ``attention_steps_forward`` in reverse: -> (dq, dk, dv, d_bias or None)."""
    c = cache.steps
    d_dropped, dv = attention_context_backward(d_context, c["context"])  # (B, H, Lq, Lk), (B, H, Lk, dv)
    d_weights = dropout_backward(d_dropped, c["dropout"])  # (B, H, Lq, Lk)
    d_masked = softmax_backward(d_weights, c["softmax"])  # (B, H, Lq, Lk)
    d_biased = apply_mask_backward(d_masked, c["mask"])  # (B, H, Lq, Lk)
    d_scores, d_bias = score_bias_backward(d_biased, c["bias"])  # (B, H, Lq, Lk), bias shape
    dq, dk = attention_scores_backward(d_scores, c["scores"])  # (B, H, Lq, d), (B, H, Lk, d)
    return dq, dk, dv, d_bias


# Short alias: the functional "call" is the forward half of the pair.
scaled_dot_product_attention = scaled_dot_product_attention_forward
