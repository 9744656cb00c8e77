"""``impl="auto"``: pick the kernel per call from the shape, so a user need not know which is faster.

The rule, from the measurements in docs/performance.md (2 cores, float32 and float64, E = 256 and 768):
the vectorized kernel wins while a head's score matrix is small (Python overhead per tile dominates the
chunked kernel), the chunked kernel from about 512 × 512 scores per head on (fewer passes over memory,
two threads, tiles skipped under a causal mask), and it is the only one that fits at long sequences.
"""

from __future__ import annotations

from .base import AttentionArgs, Kernel
from .chunked import ChunkedKernel
from .vectorized import VectorizedKernel

MIN_CHUNKED_SCORES = 512 * 512  # Lq · Lk per head from which the chunked kernel is used


class AutoKernel(Kernel):
    """Delegates each call to the vectorized or the chunked kernel; the cache carries the one it chose."""

    name = "auto"

    def __init__(self, min_chunked_scores: int = MIN_CHUNKED_SCORES):
        self.min_chunked_scores = int(min_chunked_scores)
        self.vectorized, self.chunked = VectorizedKernel(), ChunkedKernel()

    def choose(self, shape) -> Kernel:
        """The kernel for scores of ``shape`` = (B, H, Lq, Lk)."""
        Lq, Lk = shape[2], shape[3]
        return self.chunked if Lq * Lk >= self.min_chunked_scores else self.vectorized

    def run(self, q, k, v, args: AttentionArgs):
        return self.choose(args.shape).run(q, k, v, args)  # its cache names the chosen kernel

    def backward(self, d_context, cache):
        return cache.kernel.backward(d_context, cache)
