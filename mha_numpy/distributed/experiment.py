"""One measured run of the ring, forward and backward, on every rank: what ``python -m mha_numpy ring`` and
benchmarks/bench_ring.py run.

``RingConfig`` names the problem; ``run(comm, config)`` (called by every rank) makes the same whole inputs on every
rank from the seed (float64, then cast to the run's dtype), takes the rank's shard, runs ``ring_attention_forward``
and ``ring_attention_backward`` with a random upstream gradient, and measures per rank the time, the bytes sent
and the peak memory the two passes allocate beyond their inputs (``tracemalloc``, which sees NumPy's arrays). With
``check``, rank 0 gathers the shards and compares the context and dq, dk, dv with the vectorized kernel on the whole
sequence in float64 (``whole_sequence``): the error of a float32 ring is its error against exact arithmetic.
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from .. import functional as F
from ..kernels import get_kernel
from .comm import Ring
from .ring import ring_attention_backward, ring_attention_forward
from .shards import Sharding


@dataclass(frozen=True)
class RingConfig:
    """One ring-attention run: sizes (L, B, H, Hkv, d), shard layout, mask, dtype, kernel, merge order, seed."""

    length: int = 1024
    batch: int = 1
    heads: int = 4
    kv_heads: int | None = None  # None = heads
    head_dim: int = 32
    layout: str = "zigzag"
    causal: bool = True
    padding: int = 0  # the last ``padding`` keys of the last batch item are padding
    dtype: str = "float64"
    kernel: str = "vectorized"
    order: str = "sequential"
    seed: int = 0
    check: bool = True

    def kv_bytes(self, size: int) -> int:
        """The bytes of one rank's K and V: B · Hkv · L/P · 2d · itemsize."""
        hkv = self.kv_heads or self.heads
        return self.batch * hkv * (self.length // size) * 2 * self.head_dim * np.dtype(self.dtype).itemsize

    def bytes_formula(self, size: int) -> int:
        """What one rank sends: (P - 1) K, V blocks forward, (P - 1) K, V and P dK, dV blocks backward."""
        return 0 if size == 1 else (3 * size - 2) * self.kv_bytes(size)


def whole_inputs(config: RingConfig):
    """q (B, H, L, d), k, v (B, Hkv, L, d), d_context (B, H, L, d) float64, key_valid (B, L) bool or None."""
    c = config
    rng = np.random.default_rng(c.seed)
    hkv = c.kv_heads or c.heads
    q = rng.standard_normal((c.batch, c.heads, c.length, c.head_dim))
    k = rng.standard_normal((c.batch, hkv, c.length, c.head_dim))
    v = rng.standard_normal((c.batch, hkv, c.length, c.head_dim))
    d_context = rng.standard_normal((c.batch, c.heads, c.length, c.head_dim))
    key_valid = None
    if c.padding:
        key_valid = np.ones((c.batch, c.length), dtype=bool)
        key_valid[-1, c.length - c.padding :] = False
    return q, k, v, d_context, key_valid


def whole_sequence(q, k, v, d_context, key_valid, causal):
    """The single-process result: context, dq, dk, dv by the vectorized kernel on the whole sequence."""
    n_rep = q.shape[1] // k.shape[1]
    k_rep, rep_k = F.repeat_kv_forward(k, n_rep)  # (B, H, L, d)
    v_rep, rep_v = F.repeat_kv_forward(v, n_rep)
    L = q.shape[2]
    allowed = np.tril(np.ones((L, L), dtype=bool)) if causal else np.ones((L, L), dtype=bool)  # (L, L)
    allowed = allowed[None, None] if key_valid is None else allowed & key_valid[:, None, None, :]  # (B or 1, 1, L, L)
    kernel = get_kernel("vectorized")
    context, cache = kernel.forward(q, k_rep, v_rep, mask=allowed)
    dq, dk, dv, _, _ = kernel.backward(d_context, cache)
    return context, dq, F.repeat_kv_backward(dk, rep_k), F.repeat_kv_backward(dv, rep_v)


def max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (an error judged against the largest entry, not its own rounding)."""
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), np.finfo(float).tiny))


def run(comm, config: RingConfig) -> dict | None:
    """Every rank: one forward + backward. Rank 0 -> {"ranks": [per-rank stats], "errors": {...} or None};
    the other ranks -> None."""
    c = config
    ring = Ring(comm)
    sharding = Sharding(ring.size, c.layout)
    sharding.check_length(c.length)
    q, k, v, d_context, key_valid = whole_inputs(c)
    mine = [np.ascontiguousarray(sharding.shard(x, ring.rank)).astype(c.dtype) for x in (q, k, v, d_context)]
    comm.Barrier()
    tracemalloc.start()
    start_bytes = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    (context, _), cache = ring_attention_forward(*mine[:3], ring, sharding, c.causal, key_valid, kernel=c.kernel,
                                                 order=c.order)  # fmt: skip
    t1 = time.perf_counter()
    dq, dk, dv = ring_attention_backward(mine[3], cache, ring)
    t2 = time.perf_counter()
    peak = tracemalloc.get_traced_memory()[1] - start_bytes
    tracemalloc.stop()
    stats = {"rank": ring.rank, "forward_s": t1 - t0, "backward_s": t2 - t1, "bytes_sent": ring.bytes_sent,
             "peak_bytes": peak, "chunks": sharding.chunks(ring.rank, c.length)}  # fmt: skip
    del cache
    gathered = comm.gather((stats, (context, dq, dk, dv) if c.check else None), root=0)
    if ring.rank != 0:
        return None
    result = {"ranks": [g[0] for g in gathered], "errors": None}
    if c.check:
        got = [sharding.unshard([g[1][j] for g in gathered]) for j in range(4)]
        want = whole_sequence(q, k, v, d_context, key_valid, c.causal)
        result["errors"] = {n: max_relative_error(g, w) for n, g, w in zip(("context", "dq", "dk", "dv"), got, want)}
    return result
