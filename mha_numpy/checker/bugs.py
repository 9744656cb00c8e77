"""The classic backward bugs, each a buggy variant of a reference function, switchable by its key.

The checker recognises a student's mistake by running these variants on the same inputs and
finding the one the student's output matches (or, for a ``by_error`` bug such as ``.T`` on a 4-D array, the
one that raises the error the student's function raised); the bug gallery (notebooks/10_bug_gallery.ipynb)
switches them on one at a time and measures which checks catch them. ``BUGS`` lists them all (BERT's steps,
then ``_MORE``, then ``_NEW``: exercises 11-13's RoPE, repeat_kv, relative bias, soft-cap, sinks and flash, then
``_DELTA``: exercise 14's delta rule backward, its variants in ``checker.delta_rule``);
``sdpa_pair(key)`` is attention (softmax(q kᵀ·scale + mask) v) composed from the reference
pairs with the step that ``key`` names replaced by its buggy variant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import functional as F
from ..models import layers as LY
from . import delta_rule as DR
from . import reference as R


@dataclass(frozen=True)
class Bug:
    """``function`` (e.g. "softmax_backward") written the way ``wrote`` says; ``see``: how to notice it."""

    key: str
    function: str
    title: str
    wrote: str
    see: str
    impl: Callable
    forward: Callable | None = None  # makes the cache a buggy backward reads (default: the reference forward)
    by_error: bool = False  # recognised by the error it raises on the checker's cases (``.T`` on a 4-D array)

    @property
    def pair(self) -> str:
        return self.function.rsplit("_", 1)[0]

    def diagnosis(self) -> str:
        return f"{self.title}. You probably wrote {self.wrote}. How to see it: {self.see}"


# --------------------------------------------------------------------------- the buggy steps


def softmax_backward_diagonal(dp, cache):
    p = cache
    return p * (1 - p) * dp  # BUG: only the diagonal of the Jacobian; the -p_i p_j terms are missing


def softmax_backward_mean(dp, cache):
    p = cache
    return p * (dp - dp.mean(axis=-1, keepdims=True))  # BUG: an unweighted mean where sum(p * dp) belongs


def softmax_forward_nan(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))  # BUG: a row of -inf gives -inf - (-inf) = NaN
    p = e / e.sum(axis=-1, keepdims=True)
    return p, p


def scores_backward_swapped_dq(d_scores, cache):
    q, k, scale = cache
    d_raw = d_scores * scale
    return d_raw.swapaxes(-1, -2) @ k, d_raw.swapaxes(-1, -2) @ q  # BUG: dq from Sᵀ (defined only if Lq = Lk)


def scores_backward_swapped_dk(d_scores, cache):
    q, k, scale = cache
    d_raw = d_scores * scale
    return d_raw @ k, d_raw @ q  # BUG: dk from S, not Sᵀ (defined only if Lq = Lk)


def scores_backward_no_scale(d_scores, cache):
    q, k, _ = cache
    return d_scores @ k, d_scores.swapaxes(-1, -2) @ q  # BUG: the forward multiplied by scale, the backward forgot


def split_heads_forward_reshape(x, num_heads):
    B, L, E = x.shape
    return x.reshape(B, num_heads, L, E // num_heads), (B, L, E)  # BUG: reshape to (B, H, L, d) directly


def split_heads_backward_reshape(d_out, cache):
    return d_out.reshape(cache)  # BUG: the mirror of the reshape-only forward


def merge_heads_forward_reshape(x):
    B, H, L, d = x.shape
    return x.reshape(B, L, H * d), (B, H, L, d)  # BUG: no transpose back to (B, L, H, d) first


def merge_heads_backward_reshape(d_out, cache):
    return d_out.reshape(cache)  # BUG: the mirror of the reshape-only forward


def dropout_backward_no_scale(d_out, cache):
    keep_mask, _ = cache
    return d_out * keep_mask  # BUG: the forward scaled survivors by 1/(1-p), the backward must too


def linear_backward_bias_batch_only(dy, cache):
    dx, dW, _ = F.linear_backward(dy, cache)
    return dx, dW, dy.sum(axis=0)  # BUG: sums over the batch axis only; (B, L, out) gives (L, out)


def embedding_backward_fancy_add(d_out, cache):
    ids, shape = cache
    d_table = np.zeros(shape, dtype=d_out.dtype)
    d_table[ids] += d_out  # BUG: with repeated ids only one of the writes survives
    return d_table


def apply_mask_backward_leak(d_out, cache):
    return d_out  # BUG: blocked positions did not influence the output, they must get gradient 0


def self_attention_backward_paths(paths: tuple[str, ...]):
    """A self-attention backward whose dx adds only ``paths`` of ("query", "key", "value")."""

    def backward(d_out, cache):
        mha, mha_cache = cache
        grads = mha.backward(d_out, mha_cache)
        dx = sum(grads[p] for p in paths)  # BUG: x feeds all three projections; every path adds to dx
        return {"x": dx, **{k: g for k, g in grads.items() if k not in ("query", "key", "value")}}

    return backward


def online_update_no_rescale(m, l_sum, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    safe = np.where(np.isfinite(m_new), m_new, 0.0)
    e = np.exp(s - safe)
    return m_new, l_sum + e.sum(-1, keepdims=True), acc + e @ v  # BUG: old l and acc not rescaled by exp(m - m_new)


def online_update_acc_not_rescaled(m, l_sum, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha, e = np.exp(m - shift), np.exp(s - shift)
    return m_new, alpha * l_sum + e.sum(-1, keepdims=True), acc + e @ v  # BUG: l rescaled, acc not


def online_update_l_not_rescaled(m, l_sum, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha, e = np.exp(m - shift), np.exp(s - shift)
    return m_new, l_sum + e.sum(-1, keepdims=True), alpha * acc + e @ v  # BUG: acc rescaled, l not


def online_update_nan(m, l_sum, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    alpha = np.exp(m - m_new)  # BUG: while a row has seen only -inf, m = m_new = -inf and this is NaN
    e = np.exp(s - m_new)
    return m_new, alpha * l_sum + e.sum(-1, keepdims=True), alpha * acc + e @ v


def linear_backward_swapped_dw(dy, cache):
    x2, W, _, _ = cache
    dx, _, db = F.linear_backward(dy, cache)
    return dx, x2.T @ dy.reshape(x2.shape[0], W.shape[0]), db  # BUG: xᵀ dy is (in, out); W is (out, in)


def linear_backward_no_db(dy, cache):
    dx, dW, _ = F.linear_backward(dy, cache)
    return dx, dW, None  # BUG: b was added in the forward, it is owed a gradient


def linear_forward_keep_x(x, W, b):
    return x @ W.T + b, (x, W, b)  # a student's forward: the cache keeps x as it came


def linear_backward_dot_t(dy, cache):
    x, W, _ = cache
    return dy @ W, dy.T @ x, dy.sum(axis=tuple(range(dy.ndim - 1)))  # BUG: .T reverses every axis of a 3-D dy


def scores_forward_dot_t(q, k, scale):
    return q @ k.T * scale, (q, k, scale)  # BUG: k.T of (B, H, Lk, d) is (d, Lk, H, B)


def scores_backward_dot_t(d_scores, cache):
    q, k, scale = cache
    d_raw = d_scores * scale
    return d_raw @ k, d_raw.T @ q  # BUG: dS.T of (B, H, Lq, Lk) is (Lk, Lq, H, B)


def context_backward_dot_t(d_context, cache):
    p, v = cache
    return d_context @ v.T, p.T @ d_context  # BUG: v.T and p.T reverse all four axes


def scores_forward_divide(q, k, scale):
    return q @ k.swapaxes(-1, -2) / scale, (q, k, scale)  # BUG: divided by the scale, which is already 1/√d


def scores_backward_divide(d_scores, cache):
    q, k, scale = cache
    d_raw = d_scores / scale  # BUG: the forward multiplied by scale, so does the backward
    return d_raw @ k, d_raw.swapaxes(-1, -2) @ q


def dropout_forward_not_inverted(x, p, rng=None, keep_mask=None):
    return x * keep_mask, (keep_mask, 1.0)  # BUG: survivors not scaled by 1/(1-p): the expected value shrinks


def softmax_backward_wrong_axis(dp, cache):
    p = cache
    return p * (dp - (p * dp).sum(axis=-2, keepdims=True))  # BUG: summed over the queries, not over a row's keys


def softmax_backward_no_keepdims(dp, cache):
    p = cache
    return p * (dp - (p * dp).sum(axis=-1))  # BUG: (..., Lq) does not broadcast against (..., Lq, Lk)


def cross_entropy_forward_sum(logits, targets):
    _, cache = LY.softmax_cross_entropy_forward(logits, targets)
    p, _ = cache
    picked = np.take_along_axis(np.log(p), targets[..., None], axis=-1)
    return float(-picked.sum()), cache  # BUG: the sum over the N tokens, not their mean


def cross_entropy_backward_no_mean(d_loss, cache):
    p, targets = cache
    d = p.copy()
    np.put_along_axis(d, targets[..., None], np.take_along_axis(p, targets[..., None], axis=-1) - 1, axis=-1)
    return d * d_loss  # BUG: (p - onehot) without the 1/N of the mean


def sdpa_forward_mask_after_softmax(q, k, v, mask=None):
    p, _ = F.softmax_forward(q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))  # every key, the blocked ones too
    if mask is not None:
        p = np.where(mask, p, 0.0)  # BUG: the kept weights no longer sum to 1
    return p @ v, None


def layer_norm_backward_terms(mean_term: bool, var_term: bool):
    """A LayerNorm backward that keeps only the row means named (both True: the correct one)."""

    def backward(d_out, cache):
        x_hat, rstd, gamma = cache
        lead = tuple(range(d_out.ndim - 1))
        dx_hat = d_out * gamma
        dx = dx_hat.copy()
        if mean_term:
            dx -= dx_hat.mean(axis=-1, keepdims=True)  # the path through μ
        if var_term:
            dx -= x_hat * (dx_hat * x_hat).mean(axis=-1, keepdims=True)  # the path through σ
        return rstd * dx, (d_out * x_hat).sum(axis=lead), d_out.sum(axis=lead)

    return backward


def split_heads_forward_off_by_one(x, num_heads):
    d = x.shape[-1] // num_heads
    heads = [x[..., h * d + 1 : (h + 1) * d + 1] for h in range(num_heads)]  # BUG: each slice one feature late
    return np.stack(heads, axis=1), x.shape


def online_update_rescale_inverted(m, l_sum, acc, s, v):
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha = np.exp(shift - m)  # BUG: exp(m_new - m) >= 1 grows the old sums; the first block gives inf · 0 = NaN
    e = np.exp(s - shift)
    return m_new, alpha * l_sum + e.sum(-1, keepdims=True), alpha * acc + e @ v


# --------------------------------------------------------------------------- beyond BERT (exercises 11-13)


def rope_backward_not_inverted(d_out, cache):
    cos, sin = cache
    return d_out * cos + F.rotate_half(d_out) * sin  # BUG: the forward's rotation again, by +θ, not its inverse


def rope_forward_wrong_direction(x, positions=None, theta=10000.0):
    _, (cos, sin) = F.rope_forward(x, positions, theta)  # the reference's angles, broadcastable to x
    return x * cos - F.rotate_half(x) * sin, (cos, sin)  # BUG: turned by -θ ([x2, -x1] for rotate_half)


def repeat_kv_forward_tiled(x, n_rep):
    return np.tile(x, (1, n_rep, 1, 1)), (x.shape, n_rep)  # BUG: head h <- h % Hkv, not h // n_rep


def repeat_kv_backward_first_head(d_out, cache):
    (B, Hkv, L, d), n_rep = cache
    return d_out[:, ::n_rep]  # BUG: only the first query head of each group; the others used the same k/v head


def repeat_kv_backward_mean(d_out, cache):
    (B, Hkv, L, d), n_rep = cache
    return d_out.reshape(B, Hkv, n_rep, L, d).mean(axis=2)  # BUG: a copy's backward is a sum, not a mean


def repeat_kv_backward_tiled(d_out, cache):
    (B, Hkv, L, d), n_rep = cache
    return d_out.reshape(B, n_rep, Hkv, L, d).sum(axis=1)  # BUG: groups taken as h % Hkv (np.tile's order)


def relative_bias_backward_overwrite(d_bias, cache):
    idx, shape = cache
    d = d_bias.sum(axis=tuple(range(d_bias.ndim - 3)))
    d_table = np.zeros(shape, dtype=d_bias.dtype)
    d_table[:, idx] += d  # BUG: fancy-index += keeps one write per column; np.add.at accumulates them all
    return d_table


def soft_cap_forward_no_divide(scores, cap):
    t = np.tanh(scores)  # BUG: cap · tanh(scores), not cap · tanh(scores / cap)
    return t * cap, np.tanh(scores / cap)


def soft_cap_backward_identity(d_out, cache):
    return d_out  # BUG: tanh' forgotten: the scores' gradient is d_out · (1 - tanh²(s / cap))


def soft_cap_forward_keep_cap(scores, cap):
    t = np.tanh(scores / cap)
    return t * cap, (t, cap)  # the cache the variant below reads (the reference keeps t only)


def soft_cap_backward_times_cap(d_out, cache):
    t, cap = cache
    return d_out * cap * (1.0 - t * t)  # BUG: the outer cap kept, the inner 1/cap of the chain rule forgotten


def sink_softmax_forward_ignored(x, sink):
    p, _ = F.softmax_forward(x)  # BUG: the sink's exp(sink) left out of the denominator
    return p, (p, np.zeros(p.shape[:-1]), np.shape(sink))  # the cache of a sink that weighs nothing


def sink_softmax_backward_no_d_sink(dp, cache):
    dx, _ = F.sink_softmax_backward(dp, cache)
    return dx, None  # BUG: the sink is a parameter too: d_sink = -Σ p_sink D over the rows it was shared by


def sink_softmax_backward_not_summed(dp, cache):
    p, p_sink, _ = cache
    row_dot = np.einsum("...k,...k->...", p, dp)
    return p * (dp - row_dot[..., None]), -p_sink * row_dot  # BUG: one d_sink per row, not summed to sink's shape


def sink_softmax_backward_sign(dp, cache):
    dx, d_sink = F.sink_softmax_backward(dp, cache)
    return dx, -d_sink  # BUG: d_sink = p_sink (0 - D), its dp being 0: minus p_sink D


def flash_forward_rescale_inverted(q, k, v, mask, block):
    scale, shape = 1.0 / np.sqrt(q.shape[-1]), (*q.shape[:-1], k.shape[-2])
    m, l_sum, acc = np.full((*q.shape[:-1], 1), -np.inf), np.zeros((*q.shape[:-1], 1)), 0.0
    for _, k_j, v_j, mask_j in R.key_tiles(k, v, mask, shape, block):
        s = R.tile_scores(q, k_j, mask_j, scale)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)
        alpha = np.exp(shift - m)  # BUG: exp(m_new - m), the rescale upside down (inf at the first tile)
        e = np.exp(s - shift)
        l_sum, acc, m = alpha * l_sum + e.sum(axis=-1, keepdims=True), alpha * acc + e @ v_j, m_new
    o = acc / l_sum
    return o, (q, k, v, mask, o, np.where(np.isfinite(m), m, 0.0), 1.0 / l_sum, block)


def flash_forward_masked_row_nan(q, k, v, mask, block):
    o, cache = R.flash_attention_forward(q, k, v, mask, block)
    inv_l = cache[6]
    return np.where(inv_l == 0, np.nan, o), cache  # BUG: acc / l with l = 0, 0/0, for a row with no key allowed


def flash_backward_with(tile_D: bool = False, normalise: bool = True, scaled: bool = True):
    """Exercise 13's backward (``R.flash_attention_backward``) with one step wrong: ``tile_D``, D = rowsum(P ∘ dP)
    of the current tile only; not ``normalise``, P = exp(S - m) without the final 1/ℓ; not ``scaled``, dQ and dK
    without the 1/√d of the scores."""

    def backward(d_o, cache):
        q, k, v, mask, o, m, inv_l, block = cache
        scale, shape = 1.0 / np.sqrt(q.shape[-1]), (*q.shape[:-1], k.shape[-2])
        D = (d_o * o).sum(axis=-1, keepdims=True)
        dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
        for cut, k_j, v_j, mask_j in R.key_tiles(k, v, mask, shape, block):
            p = np.exp(R.tile_scores(q, k_j, mask_j, scale) - m) * (inv_l if normalise else 1.0)
            dv[..., cut, :] = p.swapaxes(-1, -2) @ d_o
            dp = d_o @ v_j.swapaxes(-1, -2)
            ds = p * (dp - ((p * dp).sum(axis=-1, keepdims=True) if tile_D else D))
            dq += ds @ k_j * (scale if scaled else 1.0)
            dk[..., cut, :] = ds.swapaxes(-1, -2) @ q * (scale if scaled else 1.0)
        return dq, dk, dv

    return backward


# --------------------------------------------------------------------------- attention with one step swapped


STEP_BUGS = {  # key -> (the functional pair's function it replaces, the buggy function)
    "softmax_diagonal": ("softmax_backward", softmax_backward_diagonal),
    "softmax_mean": ("softmax_backward", softmax_backward_mean),
    "softmax_nan": ("softmax_forward", softmax_forward_nan),
    "scores_swapped_dq": ("attention_scores_backward", scores_backward_swapped_dq),
    "scores_swapped_dk": ("attention_scores_backward", scores_backward_swapped_dk),
    "scores_no_scale": ("attention_scores_backward", scores_backward_no_scale),
    "mask_leak": ("apply_mask_backward", apply_mask_backward_leak),
    "dropout_no_scale": ("dropout_backward", dropout_backward_no_scale),
}


def sdpa_pair(*keys: str):
    """(forward, backward) of attention composed from the reference pairs, with the steps in ``keys`` buggy.

    forward(q, k, v, mask=None, scale=None, dropout_p=0.0, keep_mask=None) -> (context, cache);
    backward(d_context, cache) -> (dq, dk, dv). q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv).
    """
    step = {name: getattr(F, name) for name in dict(STEP_BUGS.values())}
    step.update(STEP_BUGS[key] for key in keys)

    def forward(q, k, v, mask=None, scale=None, dropout_p=0.0, keep_mask=None):
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        s, c1 = F.attention_scores_forward(q, k, scale)  # (B, H, Lq, Lk)
        s, c2 = F.apply_mask_forward(s, mask)
        p, c3 = step["softmax_forward"](s)
        p, c4 = F.dropout_forward(p, dropout_p, keep_mask=keep_mask) if dropout_p else (p, None)
        out, c5 = F.attention_context_forward(p, v)  # (B, H, Lq, dv)
        return out, (c1, c2, c3, c4, c5)

    def backward(d_out, cache):
        c1, c2, c3, c4, c5 = cache
        dp, dv = F.attention_context_backward(d_out, c5)
        dp = step["dropout_backward"](dp, c4) if c4 is not None else dp
        ds = step["apply_mask_backward"](step["softmax_backward"](dp, c3), c2)
        dq, dk = step["attention_scores_backward"](ds, c1)
        return dq, dk, dv

    return forward, backward


def _sdpa_bug(key: str, direction: str, see: str) -> Bug:
    step = _STEP_BUG[key]
    fwd, bwd = sdpa_pair(key)
    return Bug(
        key,
        f"scaled_dot_product_attention_{direction}",
        f"Inside attention: {step.title[0].lower()}{step.title[1:]}",
        step.wrote,
        see,
        fwd if direction == "forward" else bwd,
        fwd,
    )


_STEP_LIST = [
    Bug(
        "softmax_diagonal",
        "softmax_backward",
        "The diagonal-only softmax backward dx = p(1-p)·dp",
        "`p * (1 - p) * dp`, the derivative of each p_i with respect to its own x_i only",
        "softmax couples a row: dp_i/dx_j = p_i(δ_ij - p_j). Use dx = p * (dp - sum(p * dp, axis=-1, keepdims=True)); "
        "a test: each row of dx sums to 0 in the correct backward, not in yours",
        softmax_backward_diagonal,
    ),
    Bug(
        "softmax_mean",
        "softmax_backward",
        "The softmax backward with an unweighted mean",
        "`p * (dp - dp.mean(-1))`, the mean of dp where the p-weighted sum Σ_j p_j dp_j belongs",
        "the subtracted term is E_p[dp], the average of dp under the weights p, not its plain mean. An all-ones dp "
        "cannot show it (both give 0 there); a random dp does",
        softmax_backward_mean,
    ),
    Bug(
        "softmax_nan",
        "softmax_forward",
        "A fully masked row gives NaN",
        "`e = exp(x - x.max(-1)); e / e.sum(-1)`: for a row of -inf, -inf - (-inf) = NaN",
        "mask a whole row and print it. Shift by 0 where the row max is not finite and divide by 1 where the sum is 0: "
        "a row with nothing to attend to gets weights 0",
        softmax_forward_nan,
    ),
    Bug(
        "scores_swapped_dq",
        "attention_scores_backward",
        "Swapped transpose in the scores backward: dQ computed from Sᵀ",
        "`dq = dS.T @ k` (and maybe `dk = dS @ q`)",
        "S = Q Kᵀ gives dQ = dS K (Lq×Lk @ Lk×d) and dK = dSᵀ Q. Your product only exists when Lq = Lk, and a unit "
        "check with an all-ones dS cannot see it (that dS equals its transpose): test Lq ≠ Lk with a random dS",
        scores_backward_swapped_dq,
    ),
    Bug(
        "scores_swapped_dk",
        "attention_scores_backward",
        "Swapped transpose in the scores backward: dK computed from S",
        "`dk = dS @ q` instead of `dS.T @ q`",
        "dK must be dSᵀ Q (Lk×Lq @ Lq×d); yours only exists when Lq = Lk. Test Lq ≠ Lk with a random upstream gradient",
        scores_backward_swapped_dk,
    ),
    Bug(
        "scores_no_scale",
        "attention_scores_backward",
        "Missing scale in the scores backward",
        "`dq = dS @ k; dk = dS.T @ q` without multiplying dS by the scale 1/√d",
        "your gradients are exactly √d times too large (the ratio to the reference is constant); multiply dS by the "
        "scale first",
        scores_backward_no_scale,
    ),
    Bug(
        "split_heads_reshape",
        "split_heads_forward",
        "split_heads by reshape without the transpose",
        "`x.reshape(B, H, L, d)` instead of `x.reshape(B, L, H, d).transpose(0, 2, 1, 3)`",
        "the shapes are right but head h then holds a mix of tokens: look at out[0, 0] next to x[0, :, :d]. A finite-"
        "difference check of this pair PASSES (reshape is linear): only a comparison with the reference catches it",
        split_heads_forward_reshape,
    ),
    Bug(
        "split_heads_reshape",
        "split_heads_backward",
        "split_heads backward by reshape without the transpose",
        "`d_out.reshape(B, L, E)`, the mirror of a reshape-only forward",
        "undo F2 (transpose back to (B, L, H, d)) before undoing F1 (reshape)",
        split_heads_backward_reshape,
    ),
    Bug(
        "merge_heads_reshape",
        "merge_heads_forward",
        "merge_heads by reshape without the transpose",
        "`x.reshape(B, L, H * d)` straight from (B, H, L, d)",
        "token l must get the d features of every head at position l: transpose to (B, L, H, d) first",
        merge_heads_forward_reshape,
    ),
    Bug(
        "merge_heads_reshape",
        "merge_heads_backward",
        "merge_heads backward by reshape without the transpose",
        "`d_out.reshape(B, H, L, d)`",
        "reshape to (B, L, H, d), then transpose to (B, H, L, d)",
        merge_heads_backward_reshape,
    ),
    Bug(
        "dropout_no_scale",
        "dropout_backward",
        "Dropout backward without the 1/(1-p)",
        "`d_out * keep_mask`",
        "your gradient is exactly (1-p) times the reference where kept; the forward multiplied "
        "by keep_mask / (1-p), so the backward multiplies by the same",
        dropout_backward_no_scale,
    ),
    Bug(
        "bias_batch_only",
        "linear_backward",
        "Bias gradient summed over the batch only",
        "`db = dy.sum(axis=0)`",
        "for x of shape (B, L, in) that leaves db with shape (L, out); b is added at every "
        "position of every batch element, so sum over every axis but the last: dy.reshape(-1, out).sum(0)",
        linear_backward_bias_batch_only,
    ),
    Bug(
        "embedding_fancy_add",
        "embedding_backward",
        "`+=` with repeated indices instead of np.add.at",
        "`d_table[ids] += d_out`",
        "with ids = [1, 1] NumPy keeps one of the two writes, so a repeated token's "
        "gradient is counted once; np.add.at(d_table, ids, d_out) accumulates every occurrence",
        embedding_backward_fancy_add,
    ),
    Bug(
        "mask_leak",
        "apply_mask_backward",
        "The mask backward lets gradient through blocked positions",
        "`return d_out` (the mask's backward as the identity)",
        "a blocked score was replaced by -inf, so it cannot change the output: its gradient is 0. Inside attention the "
        "softmax backward hides this (p = 0 there); a unit check with a random upstream gradient shows it",
        apply_mask_backward_leak,
    ),
]
_STEP_BUG = {b.key: b for b in _STEP_LIST if b.key in STEP_BUGS}

T4 = (  # what `.T` does to a batched array, said once for every function where it happens
    "`.T` on a 4-D array reverses all four axes ((B, H, L, d) becomes (d, L, H, B)), it does not swap the last "
    "two; NumPy then complains about shapes, not about the transpose. Use `x.swapaxes(-1, -2)`"
)
_MORE = [
    Bug(
        "linear_swapped_dw",
        "linear_backward",
        "Swapped transpose in dW: xᵀ dy instead of dyᵀ x",
        "`dW = x.T @ dy` (flattened to 2-D)",
        "y = x Wᵀ with W of shape (out, in), so dW = dyᵀ x is (out, in); xᵀ dy is its transpose, (in, out). Compare "
        "dW.shape with W.shape",
        linear_backward_swapped_dw,
    ),
    Bug(
        "linear_no_db",
        "linear_backward",
        "The bias gradient is missing",
        "`return dx, dW` (or db = None)",
        "b was added to every row of the output, so it is owed db = dy summed over every axis but the last "
        "(shape (out,)); return dx, dW, db in the forward's order",
        linear_backward_no_db,
    ),
    Bug(
        "linear_dot_t",
        "linear_backward",
        "`.T` on a 3-D or 4-D array in the linear backward",
        "`dW = dy.T @ x` with dy of shape (B, L, out)",
        T4 + ", or flatten first: dy.reshape(-1, out).T @ x.reshape(-1, in)",
        linear_backward_dot_t,
        linear_forward_keep_x,
        by_error=True,
    ),
    Bug(
        "scores_dot_t",
        "attention_scores_forward",
        "`.T` on a 4-D array in the scores",
        "`q @ k.T`",
        T4 + ": q @ k.swapaxes(-1, -2) is (B, H, Lq, Lk)",
        scores_forward_dot_t,
        by_error=True,
    ),
    Bug(
        "scores_dot_t",
        "attention_scores_backward",
        "`.T` on a 4-D array in the scores backward",
        "`dk = dS.T @ q`",
        T4 + ": dk = dS.swapaxes(-1, -2) @ q is (B, H, Lk, d)",
        scores_backward_dot_t,
        by_error=True,
    ),
    Bug(
        "context_dot_t",
        "attention_context_backward",
        "`.T` on a 4-D array in the context backward",
        "`dp = d_context @ v.T` (or `dv = p.T @ d_context`)",
        T4 + ": dp = d_context @ v.swapaxes(-1, -2), dv = p.swapaxes(-1, -2) @ d_context",
        context_backward_dot_t,
        by_error=True,
    ),
    Bug(
        "scores_divide",
        "attention_scores_forward",
        "The scores divided by the scale instead of multiplied",
        "`q @ k.swapaxes(-1, -2) / scale`",
        "scale is already 1/√d (0.5 means divide by 2): multiply by it. Your scores are exactly 1/scale² times the "
        "reference (the ratio is constant)",
        scores_forward_divide,
    ),
    Bug(
        "scores_divide",
        "attention_scores_backward",
        "The scores backward divides by the scale instead of multiplying",
        "`dS / scale`",
        "the forward multiplied q kᵀ by scale, so dq = (dS · scale) k and dk = (dS · scale)ᵀ q; your gradients are "
        "1/scale² times the reference",
        scores_backward_divide,
    ),
    Bug(
        "dropout_not_inverted",
        "dropout_forward",
        "Dropout not inverted: the survivors are not scaled by 1/(1-p)",
        "`x * keep_mask`",
        "inverted dropout keeps the expected value: out = x · keep_mask / (1-p), so nothing changes at inference. "
        "Yours is exactly (1-p) times the reference where kept",
        dropout_forward_not_inverted,
    ),
    Bug(
        "softmax_wrong_axis",
        "softmax_backward",
        "The softmax backward sums over the wrong axis",
        "`(p * dp).sum(axis=-2, keepdims=True)`",
        "the softmax normalises each row over its keys (the last axis), so the subtracted term is one number per row: "
        "sum(p * dp, axis=-1, keepdims=True). The rows of your dx do not sum to 0",
        softmax_backward_wrong_axis,
    ),
    Bug(
        "softmax_no_keepdims",
        "softmax_backward",
        "The softmax backward's row sum without keepdims",
        "`(p * dp).sum(axis=-1)`",
        "that sum has shape (..., Lq) and broadcasts against (..., Lq, Lk) along the wrong axis (or not at all, as "
        "here): keep the axis, sum(p * dp, axis=-1, keepdims=True) is (..., Lq, 1)",
        softmax_backward_no_keepdims,
        by_error=True,
    ),
    Bug(
        "cross_entropy_sum",
        "softmax_cross_entropy_forward",
        "Cross-entropy summed, not averaged",
        "`-log_p[target].sum()`",
        "the loss is the mean over the N = targets.size tokens; yours is exactly N times the reference",
        cross_entropy_forward_sum,
    ),
    Bug(
        "cross_entropy_no_mean",
        "softmax_cross_entropy_backward",
        "Cross-entropy backward without the 1/N",
        "`d_logits = p - onehot`",
        "the forward took the mean over the N = targets.size tokens, so d_logits = (p - onehot) · d_loss / N; yours is "
        "exactly N times the reference",
        cross_entropy_backward_no_mean,
    ),
    Bug(
        "mask_after_softmax",
        "scaled_dot_product_attention_forward",
        "The mask applied after the softmax",
        "`p = softmax(scores); p[~mask] = 0` (or `p * mask`)",
        "zeroing weights after the softmax leaves rows that no longer sum to 1 (the blocked keys took their share of "
        "the denominator). Mask the scores with -inf first, then take the softmax",
        sdpa_forward_mask_after_softmax,
    ),
    *[
        Bug(
            "layer_norm_" + key,
            "layer_norm_backward",
            f"LayerNorm backward without {what}",
            wrote,
            "x̂ = (x - μ)/σ, and μ and σ both depend on every x of the row: dx = (1/σ)(dx̂ - mean(dx̂) - x̂ · mean(dx̂ x̂)). "
            "Each row of the correct dx sums to 0 and is orthogonal to x̂",
            layer_norm_backward_terms(*terms),
        )
        for key, what, wrote, terms in [
            ("no_mean", "the mean term", "`dx = (dx_hat - x_hat * mean(dx_hat * x_hat)) / sigma`", (False, True)),
            ("no_var", "the variance term", "`dx = (dx_hat - mean(dx_hat)) / sigma`", (True, False)),
            ("no_means", "either mean term", "`dx = dx_hat / sigma` (as if μ and σ were constants)", (False, False)),
        ]
    ],
    Bug(
        "split_heads_off_by_one",
        "split_heads_forward",
        "Off-by-one in the head slices",
        "`x[..., h * d + 1 : (h + 1) * d + 1]` (or another slice one feature off)",
        "head h is features h·d to (h+1)·d - 1, i.e. x[..., h * d : (h + 1) * d]; one slice off makes one head shorter "
        "and np.stack refuses. Without a loop: x.reshape(B, L, H, d).transpose(0, 2, 1, 3)",
        split_heads_forward_off_by_one,
        by_error=True,
    ),
    Bug(
        "online_rescale_inverted",
        "online_softmax_update",
        "The running sums rescaled the wrong way round",
        "`alpha = exp(m_new - m)`",
        "the old sums were taken relative to m; relative to the larger m_new they shrink: alpha = exp(m - m_new) <= 1. "
        "Yours is >= 1, and inf at the first block (m = -inf), where inf · 0 gives NaN",
        online_update_rescale_inverted,
    ),
]
_NEW = [
    Bug(
        "rope_not_inverted",
        "rope_backward",
        "RoPE backward turns the same way as the forward",
        "`d_out * cos + rotate_half(d_out) * sin` (the forward applied to d_out)",
        "a rotation's transpose is its inverse, the turn by -θ: dx = d_out · cos - rotate_half(d_out) · sin (the sign "
        "of sin flips, since rotate_half is R with Rᵀ = -R). A rotated d_out has the right norm per pair, so look at "
        "the values, not their size",
        rope_backward_not_inverted,
    ),
    Bug(
        "rope_wrong_direction",
        "rope_forward",
        "RoPE turned by -θ",
        "`x * cos - rotate_half(x) * sin` (or rotate_half as [x2, -x1])",
        "out = x · cos + rotate_half(x) · sin with rotate_half([x1, x2]) = [-x2, x1], Hugging Face Llama's convention; "
        "position 0 (cos 1, sin 0) cannot show the sign: look at the last position",
        rope_forward_wrong_direction,
    ),
    Bug(
        "repeat_kv_tiled",
        "repeat_kv_forward",
        "repeat_kv in np.tile's order",
        "`np.tile(x, (1, n_rep, 1, 1))` (query head h reads k/v head h % Hkv)",
        "query head h reads k/v head h // n_rep (heads 0, 0, 0, 1, 1, 1 for n_rep = 3): np.repeat(x, n_rep, axis=1), "
        "as Hugging Face's repeat_kv and torch's enable_gqa",
        repeat_kv_forward_tiled,
    ),
    Bug(
        "repeat_kv_first_head",
        "repeat_kv_backward",
        "repeat_kv backward takes one query head of each group",
        "`d_out[:, ::n_rep]`",
        "each k/v head was read by n_rep query heads, so its gradient is the sum of their n_rep gradients: "
        "d_out.reshape(B, Hkv, n_rep, L, d).sum(axis=2)",
        repeat_kv_backward_first_head,
    ),
    Bug(
        "repeat_kv_mean",
        "repeat_kv_backward",
        "repeat_kv backward averages the group instead of summing it",
        "`d_out.reshape(B, Hkv, n_rep, L, d).mean(axis=2)`",
        "a copy's backward adds the gradients of every copy; yours is exactly 1/n_rep of the reference",
        repeat_kv_backward_mean,
    ),
    Bug(
        "repeat_kv_tiled",
        "repeat_kv_backward",
        "repeat_kv backward sums the wrong heads together",
        "`d_out.reshape(B, n_rep, Hkv, L, d).sum(axis=1)` (np.tile's grouping)",
        "the heads of one group are neighbours, h = g · n_rep + r: reshape to (B, Hkv, n_rep, L, d) and sum axis 2",
        repeat_kv_backward_tiled,
    ),
    Bug(
        "relative_bias_overwrite",
        "relative_position_bias_backward",
        "The relative-position scatter overwrites instead of accumulating",
        "`d_table[:, idx] += d` (or `d_table[:, idx] = d`)",
        "each column of the table is read by every (i, j) at that clipped distance; with repeated indices NumPy keeps "
        "one write. np.add.at(d_table, (slice(None), idx), d) adds them all",
        relative_bias_backward_overwrite,
    ),
    Bug(
        "soft_cap_no_divide",
        "soft_cap_forward",
        "Soft-cap without the division inside the tanh",
        "`cap * np.tanh(scores)`",
        "cap · tanh(scores / cap) is ≈ scores for small scores and flattens towards ±cap; yours flattens at ±1 · cap "
        "much sooner. Compare a small score with its capped value",
        soft_cap_forward_no_divide,
    ),
    Bug(
        "soft_cap_identity",
        "soft_cap_backward",
        "Soft-cap backward without tanh'",
        "`return d_out` (the cap's backward as the identity)",
        "d/ds [cap · tanh(s / cap)] = 1 - tanh²(s / cap): multiply d_out by it. Near 0 the two agree, so look at a "
        "large score, where your gradient should almost vanish",
        soft_cap_backward_identity,
    ),
    Bug(
        "soft_cap_times_cap",
        "soft_cap_backward",
        "Soft-cap backward with an extra factor cap",
        "`d_out * cap * (1 - t**2)`",
        "the chain rule gives cap · tanh'(s / cap) · (1 / cap): the two caps cancel. Yours is exactly cap times the "
        "reference",
        soft_cap_backward_times_cap,
        soft_cap_forward_keep_cap,
    ),
    Bug(
        "sink_ignored",
        "sink_softmax_forward",
        "The sink left out of the softmax",
        "a plain softmax of x",
        "the sink is one more logit in every row's denominator: p_j = exp(x_j) / (exp(sink) + Σ_k exp(x_k)); its "
        "weights sum to less than 1, and a fully masked row gives 0",
        sink_softmax_forward_ignored,
    ),
    Bug(
        "sink_no_gradient",
        "sink_softmax_backward",
        "The sink's gradient is missing",
        "`return dx` (or `dx, None`)",
        "the sink is learned, so it is owed d_sink: its dp is 0, so dS_sink = p_sink (0 - D) with D = Σ_j p_j dp_j, "
        "summed over every row that shares the sink (to the sink's shape)",
        sink_softmax_backward_no_d_sink,
    ),
    Bug(
        "sink_not_summed",
        "sink_softmax_backward",
        "The sink's gradient not summed to its shape",
        "`d_sink = -p_sink * D` (one entry per row)",
        "one sink logit per head was broadcast over every batch element and query: sum -p_sink · D over those axes, "
        "to the sink's shape (H, 1)",
        sink_softmax_backward_not_summed,
    ),
    Bug(
        "sink_sign",
        "sink_softmax_backward",
        "The sink's gradient with the wrong sign",
        "`d_sink = p_sink * D`",
        "the sink's entry of the softmax VJP is p_sink (dp_sink - D) with dp_sink = 0 (the sink has no value): minus "
        "p_sink · D",
        sink_softmax_backward_sign,
    ),
    Bug(
        "flash_rescale_inverted",
        "flash_attention_forward",
        "The running sums rescaled the wrong way round",
        "`alpha = exp(m_new - m)`",
        "relative to a larger max the old sums shrink: alpha = exp(m - m_new) <= 1. Yours is inf at the first tile "
        "(m = -inf) and inf · 0 gives NaN",
        flash_forward_rescale_inverted,
    ),
    Bug(
        "flash_masked_row_nan",
        "flash_attention_forward",
        "A row with no key allowed gives NaN",
        "`o = acc / l` with l = 0",
        "a fully masked row has ℓ = 0 and acc = 0: store inv_l = 0 there (np.where(l > 0, 1 / l, 0)) so that its "
        "context, and the weights the backward recomputes, are exactly 0",
        flash_forward_masked_row_nan,
    ),
    Bug(
        "flash_tile_D",
        "flash_attention_backward",
        "D taken from the current tile only",
        "`D = (P * dP).sum(-1)` inside the key-block loop",
        "D is the softmax VJP's row term Σ_j P_j dP_j over the row's keys, all tiles together: rowsum(dO ∘ O) gives it "
        "once, before the loop (a full Σ_j P_j dP_j is right too, but needs a pass of its own)",
        flash_backward_with(tile_D=True),
    ),
    Bug(
        "flash_unnormalised_P",
        "flash_attention_backward",
        "P recomputed without the final 1/ℓ",
        "`P = exp(S - m)`",
        "the softmax weights are exp(S - m) / ℓ with the row's final ℓ: multiply by the cache's inv_l. Yours are ℓ "
        "times too large (and the rows do not sum to 1)",
        flash_backward_with(normalise=False),
    ),
    Bug(
        "flash_no_scale",
        "flash_attention_backward",
        "dQ and dK without the scale",
        "`dQ += dS @ K_j; dK_j = dS.T @ Q`",
        "S = Q Kᵀ / √d, so dQ = dS K / √d and dK = dSᵀ Q / √d; yours are √d times the reference, dV is right",
        flash_backward_with(scaled=False),
    ),
]

_DELTA = [  # exercise 14: the gated delta rule's backward through time (checker.delta_rule)
    Bug(
        "delta_state_not_carried",
        "delta_rule_recurrent_backward",
        "The state's gradient is not carried back through time",
        "`dS = q_t do_tᵀ` at each token (a fresh dS per step)",
        "S_t is read by every later output, so its gradient is the sum of q_s do_sᵀ over s ≥ t carried back through "
        "R3…R1: start from dS = 0 (the final state's gradient) before the loop, add q_t do_tᵀ, and end each step with "
        "dS = a_t · dS̃, the gradient of S_{t−1}. dq is right, dk and dv of every token but the last are not",
        DR.delta_backward_with(carry=False),
    ),
    Bug(
        "delta_beta_without_error",
        "delta_rule_recurrent_backward",
        "β's gradient taken from v_t instead of the error u_t = v_t − S̃_tᵀk_t",
        "`d_beta_t = k_t · (dS @ v_t)`",
        "R3 writes β_t k_t u_tᵀ with u_t = v_t − S̃_tᵀk_t (what the memory got wrong), not β_t k_t v_tᵀ: "
        "dβ_t = k_tᵀ dS u_t. Every other gradient is right",
        DR.delta_backward_with(beta_error=False),
    ),
    Bug(
        "delta_decay_wrong_side",
        "delta_rule_recurrent_backward",
        "The decay applied to the gradient on the wrong side of the write",
        "`dS = a_t * dS` before the backward of R3 (the decay treated as coming after the write)",
        "R1 decays S_{t−1} before R2–R3 read and write it, so the write's gradients (dv_t, dβ_t, dk_t) come from dS "
        "undecayed and only dS̃ is multiplied by a_t on its way to S_{t−1}. Yours are a_t times too large there; dq "
        "and the carried state's gradient are right",
        DR.delta_backward_with(decay_after=False),
    ),
    Bug(
        "delta_key_read_missing",
        "delta_rule_recurrent_backward",
        "dk without the read of R2",
        "`dk_t = β_t dS u_t` only",
        "k_t is used twice: to write (R3, β_t dS u_t) and to read what the decayed memory predicts (R2, "
        "u_t = v_t − S̃_tᵀk_t, which gives −S̃_t du_t). Add both",
        DR.delta_backward_with(key_read=False),
    ),
]

BUGS: list[Bug] = [
    *_STEP_LIST,
    _sdpa_bug("softmax_diagonal", "backward", "check softmax_backward on its own (it sums to 0 over each row)"),
    _sdpa_bug("softmax_mean", "backward", "check softmax_backward on its own with a random upstream gradient"),
    _sdpa_bug("softmax_nan", "forward", "mask every key of one query and look at that row of the context"),
    _sdpa_bug("scores_swapped_dq", "backward", "check attention_scores_backward on its own with Lq ≠ Lk"),
    _sdpa_bug("scores_swapped_dk", "backward", "check attention_scores_backward on its own with Lq ≠ Lk"),
    _sdpa_bug("scores_no_scale", "backward", "dq and dk are √d times the reference; dv is right"),
    *[
        Bug(
            "self_attention_paths",
            "self_attention_backward",
            "The three self-attention paths not summed",
            f"dx = {' + '.join(f'd_{p}' for p in paths)}",
            "x is the query, the key and the value at once, so dx = d_query + d_key + d_value; a finite-difference "
            "check on x (perturb x everywhere it is used) shows the gap",
            self_attention_backward_paths(paths),
            R.self_attention_forward,
        )
        for paths in [("query",), ("key",), ("value",), ("query", "key"), ("query", "value"), ("key", "value")]
    ],
    Bug(
        "online_no_rescale",
        "online_softmax_update",
        "The running sums are not rescaled when the max grows",
        "`l + sum(exp(s - m_new))` and `acc + exp(s - m_new) @ v`",
        "l and acc were accumulated relative to the old max; multiply both by exp(m_old - m_new) before adding the new "
        "block. Scores that grow from block to block show it",
        online_update_no_rescale,
    ),
    Bug(
        "online_no_rescale",
        "online_softmax_update",
        "The running acc is not rescaled when the max grows (l is)",
        "`alpha * l + sum(exp(s - m_new))` but `acc + exp(s - m_new) @ v`",
        "acc was accumulated relative to the old max, as l was; multiply it by the same exp(m_old - m_new) before "
        "adding the new block. Scores that grow from block to block show it",
        online_update_acc_not_rescaled,
    ),
    Bug(
        "online_no_rescale",
        "online_softmax_update",
        "The running l is not rescaled when the max grows (acc is)",
        "`alpha * acc + exp(s - m_new) @ v` but `l + sum(exp(s - m_new))`",
        "l was accumulated relative to the old max, as acc was; multiply it by the same exp(m_old - m_new) before "
        "adding the new block. Scores that grow from block to block show it",
        online_update_l_not_rescaled,
    ),
    Bug(
        "online_nan",
        "online_softmax_update",
        "A row that has seen only -inf gives NaN",
        "`alpha = exp(m - m_new)` with m = m_new = -inf",
        "exp(-inf - (-inf)) = NaN: use 0 in place of a max that is "
        "not finite (the row's l and acc are still 0, so any finite shift is right)",
        online_update_nan,
    ),
    *_MORE,
    *_NEW,
    *_DELTA,
]
EXTRA: list[Bug] = [*_MORE, *_NEW, *_DELTA]  # diagnosed by the checker, not (yet) in notebook 10's gallery table


def find(key: str, function: str | None = None) -> Bug:
    """The bug ``key`` (for ``function`` when a key covers a forward and a backward)."""
    for bug in BUGS:
        if bug.key == key and (function is None or bug.function == function):
            return bug
    raise KeyError(key)


def for_function(function: str) -> list[Bug]:
    return [b for b in BUGS if b.function == function]


MODULE_BUGS = {  # key -> {the pair function it replaces: the buggy function}, for self_attention_pair
    "bias_batch_only": {"linear_backward": linear_backward_bias_batch_only},
    "split_heads_reshape": {
        "split_heads_forward": split_heads_forward_reshape,
        "split_heads_backward": split_heads_backward_reshape,
    },
    "merge_heads_reshape": {
        "merge_heads_forward": merge_heads_forward_reshape,
        "merge_heads_backward": merge_heads_backward_reshape,
    },
}


def self_attention_pair(*keys: str):
    """(forward, backward) of self-attention composed from the pairs, with the steps ``keys`` name buggy.

    forward(x, params, num_heads, mask=None, dropout_p=0.0, keep_mask=None) -> (out, cache), x (B, L, E);
    backward(d_out, cache) -> {"x", "W_q", ..., "b_o"}. Keys: those of STEP_BUGS and MODULE_BUGS, and
    "self_attention_paths" (dx keeps the query path only).
    """
    step = {"linear_backward": F.linear_backward, "split_heads_forward": F.split_heads_forward}
    step.update(split_heads_backward=F.split_heads_backward, merge_heads_forward=F.merge_heads_forward)
    step.update(merge_heads_backward=F.merge_heads_backward)
    for key in keys:
        step.update(MODULE_BUGS.get(key, {}))
    attend, attend_back = sdpa_pair(*(k for k in keys if k in STEP_BUGS))
    paths = ("query",) if "self_attention_paths" in keys else ("query", "key", "value")

    def forward(x, params, num_heads, mask=None, dropout_p=0.0, keep_mask=None):
        proj = {n: F.linear_forward(x, params[f"W_{n[0]}"], params[f"b_{n[0]}"]) for n in ("query", "key", "value")}
        heads = {n: step["split_heads_forward"](y, num_heads) for n, (y, _) in proj.items()}  # (B, H, L, d) each
        ctx, c_att = attend(*(h for h, _ in heads.values()), mask, None, dropout_p, keep_mask)  # (B, H, L, d)
        merged, c_merge = step["merge_heads_forward"](ctx)  # (B, L, E)
        out, c_out = F.linear_forward(merged, params["W_o"], params["b_o"])
        return out, (proj, heads, c_att, c_merge, c_out)

    def backward(d_out, cache):
        proj, heads, c_att, c_merge, c_out = cache
        grads = {}
        d_merged, grads["W_o"], grads["b_o"] = step["linear_backward"](d_out, c_out)
        d_heads = attend_back(step["merge_heads_backward"](d_merged, c_merge), c_att)  # dq, dk, dv
        dx = {}
        for (n, (_, c_proj)), d_h in zip(proj.items(), d_heads):
            d_y = step["split_heads_backward"](d_h, heads[n][1])  # (B, L, E)
            dx[n], grads[f"W_{n[0]}"], grads[f"b_{n[0]}"] = step["linear_backward"](d_y, c_proj)
        return {"x": sum(dx[p] for p in paths), **grads}

    return forward, backward
