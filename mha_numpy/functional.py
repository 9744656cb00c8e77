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
    y = x @ W.T  # F1: (..., in) @ (in, out) -> (..., out)
    if b is not None:
        y = y + b  # F2: (..., out) + (out,)
    return y, (x, W, b is not None)


def linear_backward(dy: np.ndarray, cache):
    """dy: (..., out)  ->  dx: (..., in), dW: (out, in), db: (out,) or None."""
    x, W, has_bias = cache
    dx = dy @ W  # ← F1: (..., out) @ (out, in) -> (..., in)
    x2 = x.reshape(-1, x.shape[-1])  # (N, in), N = product of leading dims
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, out)
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


# --------------------------------------------------------------------------- today's variants: GQA, RoPE, ALiBi


def repeat_kv_forward(x: np.ndarray, n_rep: int):
    """Share each key/value head with ``n_rep`` query heads (grouped-query / multi-query attention).

    x: (B, Hkv, L, d) -> out: (B, Hkv·n_rep, L, d); out head h is x head h // n_rep, the grouping of torch
    SDPA's ``enable_gqa=True`` and Hugging Face's ``repeat_kv``. n_rep = 1 returns x itself (no copy).
    """
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


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The rotation angles of RoPE, Hugging Face Llama convention, always computed in float64.

    positions: (L,) or (B, L) -> cos, sin: (L, d) or (B, L, d), with
    angle[..., i] = position · inv_freq[i mod d/2] and inv_freq = 1 / theta ** (arange(0, d, 2) / d):
    feature i and feature i + d/2 turn together by the same angle (the pair ``rotate_half`` mixes).
    """
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (d/2,)
    freqs = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq  # (..., L, 1) * (d/2,) -> (..., L, d/2)
    angles = np.concatenate([freqs, freqs], axis=-1)  # (..., L, d)
    return np.cos(angles), np.sin(angles)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """(..., d) -> (..., d): [x1, x2] -> [-x2, x1] with x1, x2 the two halves of the last axis (a 90° turn per pair)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def check_positions(positions, B: int, L: int) -> np.ndarray:
    """positions as an array (L,), (1, L) or (B, L) of finite integers or floats, or ValueError naming it."""
    pos = np.asarray(positions)
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


def rope_forward(x: np.ndarray, positions: np.ndarray | None = None, theta: float = 10000.0):
    """Rotary position embedding: turn each feature pair (i, i + d/2) of x by the angle of its position.

    x: (B, H, L, d), d even   positions: None (0, 1, ..., L-1), (L,) or (B, L)   ->   out: (B, H, L, d)
    out = x · cos + rotate_half(x) · sin (Hugging Face Llama's ``apply_rotary_pos_emb``). Rotated q·k then
    depends on the positions only through their difference. The angles are float64, cast to x's dtype.
    """
    x, pos = _check_rope(x, positions, theta)
    cos, sin = rope_cos_sin(pos, x.shape[-1], theta)  # (L, d) or (B, L, d)
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


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The ALiBi paper's per-head slopes (Press et al. 2022), float64 (H,); as Hugging Face's BLOOM builds them.

    For H a power of two: m_h = 2^(-8 (h+1) / H), a geometric sequence from 2^(-8/H) down to 2^-8. Otherwise
    the slopes of the closest power of two P < H, followed by every other slope of 2P (the odd powers of its
    ratio) until there are H.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
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
    Lk = Lq if Lk is None else Lk
    if min(Lq, Lk) <= 0:
        raise ValueError(f"alibi_bias needs positive lengths, got Lq={Lq}, Lk={Lk}")
    distance = np.abs(np.arange(Lq)[:, None] + offset - np.arange(Lk)[None, :])  # (Lq, Lk)
    bias = -alibi_slopes(num_heads)[:, None, None] * distance  # (H, 1, 1) * (Lq, Lk) -> (H, Lq, Lk)
    return bias[None].astype(dtype)  # (1, H, Lq, Lk)


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
