"""The vectorized kernel: ``functional``'s composition of pairs, batched over (B, H) by NumPy.

It builds the whole (B, H, Lq, Lk) score tensor, which is what makes it readable and what limits it
at long sequences (see ``chunked`` for the blocked version).
"""

from __future__ import annotations

from .. import functional as F
from .._checks import check_d_context
from .base import AttentionArgs, Kernel


class VectorizedKernel(Kernel):
    """softmax(q kᵀ · scale + bias + mask) v as ``functional.attention_steps_forward`` computes it."""

    name = "vectorized"

    def run(self, q, k, v, args: AttentionArgs):
        context, cache = F.attention_steps_forward(
            q, k, v, args.mask, args.scale, args.dropout_p, args.keep_mask(), args.bias
        )  # (B, H, Lq, dv)
        cache.kernel = self
        return context, cache

    def backward(self, d_context, cache: F.AttentionCache):
        p, v = cache.steps["context"]  # (B, H, Lq, Lk), (B, H, Lk, dv)
        d_context = check_d_context(d_context, (*p.shape[:-1], v.shape[-1]), v.dtype)  # (B, H, Lq, dv)
        return F.attention_steps_backward(d_context, cache)  # dq, dk, dv, d_bias
