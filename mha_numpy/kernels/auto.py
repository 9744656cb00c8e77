"""``impl="auto"``: pick the kernel per call from the shape, so a user need not know which is faster.

The rule, from the interleaved measurements in docs/performance.md (2 cores, float32 and float64): the
vectorized kernel wins while the whole call is small (B·H·Lq·Lk below about 2¹⁸ scores: the chunked kernel's
thread hand-off and per-tile NumPy calls cost more than they save), the chunked kernel from there on: at long
sequences (fewer passes over memory, two threads, tiles skipped under a causal mask; the only one that fits)
and also at short sequences in a batch (B = 8, L = 128 or B = 32, L = 64), where it groups the heads of one
batch item into one work item and runs the items on two threads, while the vectorized kernel's batched
products over (B, H) run on one core (NumPy calls BLAS once per small matrix, and BLAS does not thread those).
"""

from __future__ import annotations

from .._checks import as_int
from .base import AttentionArgs, Kernel
from .chunked import ChunkedKernel
from .vectorized import VectorizedKernel

MIN_CHUNKED_SCORES = 2**18  # B · H · Lq · Lk (scores of the whole call) from which the chunked kernel is used


class AutoKernel(Kernel):
    """Delegates each call to the vectorized or the chunked kernel; the cache carries the one it chose."""

    name = "auto"

    def __init__(self, min_chunked_scores: int = MIN_CHUNKED_SCORES):
        self.min_chunked_scores = min_chunked_scores
        self.vectorized, self.chunked = VectorizedKernel(), ChunkedKernel()

    @property
    def min_chunked_scores(self) -> int:
        """B · H · Lq · Lk from which a call runs on the chunked kernel (0: every call); checked when set."""
        return self._min_chunked_scores

    @min_chunked_scores.setter
    def min_chunked_scores(self, value) -> None:
        self._min_chunked_scores = as_int(value, "min_chunked_scores", minimum=0)  # int("abc"), int(2.7): no

    def choose(self, shape) -> Kernel:
        """The kernel for scores of ``shape`` = (B, H, Lq, Lk)."""
        B, H, Lq, Lk = shape
        return self.chunked if B * H * Lq * Lk >= self.min_chunked_scores else self.vectorized

    def run(self, q, k, v, args: AttentionArgs):
        return self.choose(args.shape).run(q, k, v, args)  # its cache names the chosen kernel

    def backward(self, d_context, cache, d_lse=None):
        return cache.kernel.backward(d_context, cache, d_lse)
