"""The vectorized kernel: ``functional``'s composition of pairs, batched over (B, H) by NumPy.

It builds the whole (B, H, Lq, Lk) score tensor, which is what makes it readable and what limits it
at long sequences (see ``chunked`` for the blocked version).

NumPy runs a batched product over (B, H) as one BLAS call per (Lq × d) @ (d × Lk) matrix. When those are
small, BLAS's own threads only cost: OpenBLAS wakes and joins its threads for every one of the B·H tiny
products (measured at B = 8, L = 128, H = 12 in float64 on two cores: 5-9× slower than one thread, and far
worse on a busy machine). So below ``SMALL_HEAD_SCORES`` scores per head the kernel runs with BLAS on one
thread; larger products keep BLAS's threads.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .. import functional as F
from .._checks import check_d_context, check_d_lse
from ..threads import blas_single_threaded
from .base import AttentionArgs, AttentionGrads, Kernel

SMALL_HEAD_SCORES = 256 * 256  # Lq · Lk per head up to which BLAS runs on one thread here


def _blas_for(shape):
    """BLAS on one thread for the small products of scores of ``shape`` = (B, H, Lq, Lk); else as it is."""
    return blas_single_threaded() if shape[-2] * shape[-1] <= SMALL_HEAD_SCORES else contextlib.nullcontext()


class VectorizedKernel(Kernel):
    """softmax(mods(q kᵀ · scale + bias) + mask) v as ``functional.attention_steps_forward`` computes it."""

    name = "vectorized"

    def run(self, q, k, v, args: AttentionArgs):
        """``functional.attention_steps_forward`` on the whole (B, H, Lq, Lk) scores."""
        keep = args.keep_mask()
        with _blas_for(args.shape):
            sinks = None if args.sinks is None else args.sinks[:, None]  # (H, 1): each head's logit, every row
            index = args.index(*(np.arange(n) for n in args.shape)) if args.score_mods else None  # (b, h, i, j)
            context, cache = F.attention_steps_forward(
                q, k, v, args.mask, args.scale, args.dropout_p, keep, args.bias, args.score_mods, self, sinks, index
            )  # (B, H, Lq, dv)
        return context, cache

    def backward(self, d_context, cache: F.AttentionCache, d_lse=None):
        """-> AttentionGrads: the forward's steps reversed (``functional.attention_steps_backward``)."""
        p, v = cache.steps["context"]  # (B, H, Lq, Lk), (B, H, Lk, dv)
        d_context = check_d_context(d_context, (*p.shape[:-1], v.shape[-1]), v.dtype)  # (B, H, Lq, dv)
        d_lse = check_d_lse(d_lse, p.shape[:-1], v.dtype)  # (B, H, Lq) or None
        with _blas_for(p.shape):
            dq, dk, dv, d_bias, d_sinks, d_params = F.attention_steps_backward(d_context, cache, d_lse)
        d_sinks = None if d_sinks is None else d_sinks.reshape(-1)  # (H, 1) -> (H,)
        return AttentionGrads(dq, dk, dv, d_bias, d_sinks, d_params, cache.steps.get("score_mods", ((),))[0])
