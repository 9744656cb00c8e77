"""The kernel protocol and the preamble every kernel shares.

A kernel computes softmax(q kᵀ · scale + bias + mask) v on (B, H, L, d) arrays, and its backward:

    context, cache = kernel.forward(q, k, v, mask=None, scale=None, dropout_p=0.0, rng=None,
                                    dropout_mask=None, bias=None)
    dq, dk, dv, d_bias = kernel.backward(d_context, cache)      # d_bias is None without a bias

``forward`` checks its arguments once (``check_qkv`` and ``check_args``) and calls ``run``, which
a kernel implements on checked arguments; ``MultiHeadAttention`` checks early (before any arithmetic)
and calls ``run`` itself. Every cache carries its kernel (``cache.kernel``), so a backward never
dispatches on a name, and exposes ``attn_weights`` (B, H, Lq, Lk), after softmax and before dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import as_generator, check_dropout, check_mask, check_qkv, default_scale


@dataclass(frozen=True)
class AttentionArgs:
    """The checked arguments of one attention call (shapes broadcast to (B, H, Lq, Lk)).

    mask: None, bool (True = may attend) or float (added).   bias: None or float (added, differentiable).
    dropout_p: in [0, 1).   keep: a given bool keep-mask (B, H, Lq, Lk), or None.   rng: draws the rest.
    """

    shape: tuple[int, int, int, int]
    scale: float
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    dropout_p: float = 0.0
    keep: np.ndarray | None = None
    rng: np.random.Generator | None = None

    @property
    def dropout(self) -> bool:
        return self.keep is not None or self.dropout_p > 0.0

    def keep_mask(self) -> np.ndarray | None:
        """The whole (B, H, Lq, Lk) keep-mask: the given one, or drawn now as ``dropout_forward`` draws it."""
        if self.keep is not None or self.dropout_p == 0.0:
            return self.keep
        return self.rng.random(self.shape) >= self.dropout_p  # (B, H, Lq, Lk) True = keep

    def seed(self) -> int | None:
        """A seed for kernels that draw their keep-mask tile by tile (None without sampled dropout)."""
        if self.keep is not None or self.dropout_p == 0.0:
            return None
        return int(self.rng.integers(2**63))


def check_args(shape, head_dim: int, mask=None, scale=None, dropout_p=0.0, rng=None, dropout_mask=None, bias=None):
    """Validate everything but q, k, v for scores of ``shape`` = (B, H, Lq, Lk) -> AttentionArgs."""
    shape = tuple(int(n) for n in shape)
    mask = check_mask(mask, shape)
    bias = check_mask(bias, shape, name="bias", allow_bool=False)
    keep = check_dropout(shape, dropout_p, rng, dropout_mask)
    rng = None if rng is None else as_generator(rng)
    return AttentionArgs(shape, default_scale(head_dim, scale), mask, bias, float(dropout_p), keep, rng)


class Kernel:
    """Base of every kernel: ``forward`` = checks + ``run``; subclasses implement ``run`` and ``backward``."""

    name = "kernel"

    def forward(self, q, k, v, mask=None, scale=None, dropout_p=0.0, rng=None, dropout_mask=None, bias=None):
        """q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv) -> context (B, H, Lq, dv), cache."""
        q, k, v = check_qkv(q, k, v)
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return self.run(q, k, v, check_args(shape, q.shape[-1], mask, scale, dropout_p, rng, dropout_mask, bias))

    def run(self, q, k, v, args: AttentionArgs):  # pragma: no cover - the protocol
        raise NotImplementedError

    def choose(self, shape) -> Kernel:
        """The kernel that runs a call with scores of ``shape`` (B, H, Lq, Lk): itself (``auto`` picks one)."""
        return self

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (N, K) @ b (K, M) for the module's projections around this kernel: on the threads its tiles use
        (``MultiHeadAttention`` passes it to ``functional.linear_*``). Here BLAS's own threads."""
        return a @ b  # (N, K) @ (K, M) -> (N, M)

    def backward(self, d_context, cache):  # pragma: no cover - the protocol
        """d_context (B, H, Lq, dv) -> dq (B, H, Lq, d), dk (B, H, Lk, d), dv (B, H, Lk, dv), d_bias or None."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
