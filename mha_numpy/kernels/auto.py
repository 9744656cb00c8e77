"""``impl="auto"``: pick the kernel per call from the shape, so a user need not know which is faster.

The rule, from the interleaved measurements in docs/performance.md (2 cores, float32 and float64): the
vectorized kernel wins while the whole call is small (B·H·Lq·Lk below about 2¹⁸ scores: the chunked kernel's
thread hand-off and per-tile NumPy calls cost more than they save), the chunked kernel from there on: at long
sequences (fewer passes over memory, two threads, tiles skipped under a causal mask; the only one that fits)
and also at short sequences in a batch (B = 8, L = 128 or B = 32, L = 64), where it groups the heads of one
batch item into one work item and runs the items on two threads, while the vectorized kernel's batched
products over (B, H) run on one core (NumPy calls BLAS once per small matrix, and BLAS does not thread those).

Memory, too: a ``MultiHeadAttention`` on this kernel runs a call as ``recompute=True`` does (one head group at a
time, nothing of size L × E kept for the backward) when the default path would keep more than ``MEMORY_BUDGET``
(64 MiB) for its backward, as ``flow.kept_bytes`` counts it; ``memory_budget=`` on the module sets another budget
(bytes; for any kernel). At L = 16384, E = 256, H = 4, float32 that is 49 MiB beyond the output and the gradients
instead of 129 (docs/performance.md, "Memory"); the price is about a third more time, only at such shapes.
"""

from __future__ import annotations

from .._checks import as_int
from .base import AttentionArgs, Kernel
from .chunked import ChunkedKernel
from .vectorized import VectorizedKernel

MIN_CHUNKED_SCORES = 2**18  # B · H · Lq · Lk (scores of the whole call) from which the chunked kernel is used
MEMORY_BUDGET = 64 * 2**20  # bytes a call may keep for its backward before the module recomputes (flow.kept_bytes)


class AutoKernel(Kernel):
    """Delegates each call to the vectorized or the chunked kernel; the cache carries the one it chose."""

    name = "auto"
    default_memory_budget = MEMORY_BUDGET  # a module on this kernel recomputes a call that would keep more

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
