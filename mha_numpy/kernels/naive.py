"""The textbook kernel: a Python loop over batch and heads, each head its own small matmuls.

"Attention Is All You Need" read literally, one (batch item, head) at a time:

    head_h = softmax(mods(Q_h K_hᵀ · scale + bias_h) + mask_h) V_h

with the same composition of pairs as the vectorized kernel (``functional.attention_steps_forward``),
applied to 2-D (L, ·) arrays. It gives the same numbers and is the baseline of the benchmark: the
loop issues B·H small products instead of a few large ones. Use it to read, not to run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import check_d_context, check_d_lse
from .base import AttentionArgs, AttentionGrads, Kernel, add_score_params


@dataclass
class NaiveCache:
    """Per-head caches of ``functional.attention_steps_forward`` and the assembled (B, H, Lq, Lk) views."""

    scores: np.ndarray
    masked_scores: np.ndarray
    attn_weights: np.ndarray
    dropout_mask: np.ndarray | None
    heads: dict  # (b, h) -> that head's AttentionCache
    shapes: tuple  # of q, k, v and the context
    bias_shape: tuple | None
    kernel: object = None
    sinks: np.ndarray | None = None  # (H,) the heads' sink logits, or None
    score_mods: tuple = ()  # the call's score mods (their parameters get gradients)

    @property
    def lse(self) -> np.ndarray:
        """(B, H, Lq) float64 each row's log-sum-exp of the assembled masked scores; computed now."""
        return F.log_sum_exp(self.masked_scores, None if self.sinks is None else self.sinks[:, None])


def _per_head(x, shape, b: int, h: int):
    """Head (b, h) of an array broadcastable to ``shape`` = (B, H, Lq, Lk), or None."""
    return None if x is None else np.broadcast_to(x, shape)[b, h]  # (Lq, Lk) view, no copy


class NaiveKernel(Kernel):
    """One (batch item, head) at a time."""

    name = "naive"

    def run(self, q, k, v, args: AttentionArgs):
        """The same composition one (batch item, head) at a time; each head's mods get its (b, h)."""
        B, H, Lq, Lk = args.shape
        keep = args.keep_mask()  # (B, H, Lq, Lk) or None, drawn exactly as the vectorized kernel draws it
        mask = None if args.mask is None else np.asarray(args.mask)  # a StructuredMask's entries, built once
        context = np.empty((B, H, Lq, v.shape[3]), dtype=q.dtype)
        scores, masked, weights = (np.empty(args.shape, dtype=q.dtype) for _ in range(3))
        heads = {}
        for b in range(B):
            for h in range(H):
                context[b, h], c = F.attention_steps_forward(
                    q[b, h], k[b, h], v[b, h], _per_head(mask, args.shape, b, h), args.scale,
                    args.dropout_p, None if keep is None else keep[b, h], _per_head(args.bias, args.shape, b, h),
                    args.score_mods, sinks=None if args.sinks is None else args.sinks[h],  # the head's logit ()
                    index=args.index(b, h, np.arange(Lq), np.arange(Lk)),  # the score mods' (b, h, i, j)
                )  # fmt: skip  # (Lq, dv)
                scores[b, h], masked[b, h], weights[b, h], heads[b, h] = c.scores, c.masked_scores, c.attn_weights, c
        bias_shape = None if args.bias is None else np.shape(args.bias)
        shapes = (q.shape, k.shape, v.shape, context.shape)
        return context, NaiveCache(
            scores, masked, weights, keep, heads, shapes, bias_shape, self, args.sinks, args.score_mods
        )

    def backward(self, d_context, cache: NaiveCache, d_lse=None):
        """-> AttentionGrads: each head's backward; the bias, sinks and score terms summed in order."""
        dt = cache.scores.dtype
        d_context = check_d_context(d_context, cache.shapes[3], dt)  # (B, H, Lq, dv)
        d_lse = check_d_lse(d_lse, cache.scores.shape[:3], dt)  # (B, H, Lq) or None
        dq, dk, dv = (np.empty(shape, dtype=dt) for shape in cache.shapes[:3])  # (B, H, L, ·)
        d_bias = None if cache.bias_shape is None else np.empty(cache.scores.shape, dtype=dt)  # (B, H, Lq, Lk)
        d_sinks = None if cache.sinks is None else np.zeros_like(cache.sinks)  # (H,)
        d_params: dict = {}  # the score mods' parameters, summed over the heads in order
        for (b, h), c in cache.heads.items():
            row_lse = None if d_lse is None else d_lse[b, h]  # (Lq,)
            dq[b, h], dk[b, h], dv[b, h], db, ds, dp = F.attention_steps_backward(d_context[b, h], c, row_lse)
            add_score_params(d_params, dp)
            if d_bias is not None:
                d_bias[b, h] = db  # (Lq, Lk): this head's share of the broadcast bias
            if d_sinks is not None:
                d_sinks[h] += ds  # (): this head's sink, summed over the batch
        d_bias = None if d_bias is None else F.sum_to_shape(d_bias, cache.bias_shape)
        return AttentionGrads(dq, dk, dv, d_bias, d_sinks, d_params, cache.score_mods)
