"""Run under ``mpiexec -n P python tests/ring_cases.py``: ring attention against the single-process kernel.

Every case: the same whole inputs on every rank (one seed), each rank takes its shard, runs the ring's forward and
backward with random upstream gradients (of the context and of the lse), and rank 0 gathers the shards and compares
the context, the lse and dq, dk, dv with the vectorized kernel on the whole sequence (float64: 1e-12 of the
largest entry). Rank 0 prints one line a case and "ALL OK <n> cases"; any mismatch exits 1 (tests/test_ring.py).
"""

from __future__ import annotations

import sys

import numpy as np

from mha_numpy import functional as F
from mha_numpy.distributed import Ring, Sharding, ring_attention_backward, ring_attention_forward
from mha_numpy.distributed.mpi import world
from mha_numpy.kernels import get_kernel

# (layout, causal, padding, H, Hkv, per-rank kernel, merge order, dtype); B = 2, d = 4, dv = 3, L/P = 4 per chunk
CASES = [
    ("contiguous", False, False, 2, 2, "vectorized", "sequential", np.float64),
    ("contiguous", True, False, 2, 2, "vectorized", "sequential", np.float64),
    ("zigzag", True, False, 2, 2, "vectorized", "sequential", np.float64),
    ("zigzag", True, True, 4, 2, "vectorized", "tree", np.float64),
    ("zigzag", False, False, 2, 2, "vectorized", "sequential", np.float64),
    ("contiguous", True, True, 4, 2, "vectorized", "sequential", np.float64),  # padding + GQA
    ("zigzag", True, True, 4, 1, "vectorized", "sequential", np.float64),  # padding + multi-query
    ("zigzag", False, True, 4, 2, "chunked", "sequential", np.float64),  # the chunked kernel per piece
    ("contiguous", False, True, 2, 1, "vectorized", "flat", np.float64),
    ("zigzag", True, False, 2, 2, "vectorized", "sequential", np.float32),  # float32 stays float32
]


def whole_inputs(seed, B, H, Hkv, L, d, dv, padding, dtype):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, d)) * 2
    k = rng.standard_normal((B, Hkv, L, d)) * 2
    v = rng.standard_normal((B, Hkv, L, dv))
    d_ctx = rng.standard_normal((B, H, L, dv))
    d_lse = rng.standard_normal((B, H, L))
    key_valid = None
    if padding:  # item 0 all real; item 1 real from 2 to 3/8 of L: whole chunks and pieces of pure padding, and
        key_valid = np.ones((B, L), dtype=bool)  # with a causal mask its queries 0 and 1 see no key (lse -inf)
        key_valid[1, :2] = False
        key_valid[1, (3 * L) // 8 :] = False
    return [x.astype(dtype) for x in (q, k, v, d_ctx)] + [d_lse, key_valid]


def reference(q, k, v, d_ctx, d_lse, key_valid, causal):
    """The single-process kernel on the whole sequence: context, lse, dq, dk, dv."""
    n_rep = q.shape[1] // k.shape[1]
    k_rep, rk = F.repeat_kv_forward(k, n_rep)
    v_rep, rv = F.repeat_kv_forward(v, n_rep)
    L = q.shape[2]
    allowed = np.ones((1, 1, L, L), dtype=bool)
    if causal:
        allowed = allowed & np.tril(np.ones((L, L), dtype=bool))
    if key_valid is not None:
        allowed = allowed & key_valid[:, None, None, :]
    kernel = get_kernel("vectorized")
    ctx, cache = kernel.forward(q, k_rep, v_rep, mask=allowed)
    dq, dk, dv, _, _ = kernel.backward(d_ctx, cache, d_lse=d_lse)
    return ctx, cache.lse, dq, F.repeat_kv_backward(dk, rk), F.repeat_kv_backward(dv, rv)


def relative_error(got, want):
    if got.shape != want.shape or got.dtype != want.dtype:
        return np.inf
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(want[~finite], got[~finite]):
        return np.inf  # -inf lse rows (a batch item's queries that see no real key) must be -inf here too
    scale = max(1.0, float(np.abs(want[finite]).max(initial=0.0)))
    return float(np.abs(got[finite] - want[finite]).max(initial=0.0)) / scale


def main() -> int:
    comm = world()
    ring = Ring(comm)
    P, rank = ring.size, ring.rank
    failures = 0
    for i, (layout, causal, padding, H, Hkv, kernel, order, dtype) in enumerate(CASES):
        sharding = Sharding(P, layout)
        L = 4 * sharding.n_chunks
        q, k, v, d_ctx, d_lse, key_valid = whole_inputs(i, 2, H, Hkv, L, 4, 3, padding, dtype)
        mine = [sharding.shard(x, rank) for x in (q, k, v, d_ctx, d_lse)]
        (ctx, lse), cache = ring_attention_forward(*mine[:3], ring, sharding, causal, key_valid, kernel=kernel,
                                                   order=order)  # fmt: skip
        dq, dk, dv = ring_attention_backward(mine[3], cache, ring, d_lse=mine[4])
        parts = comm.gather((ctx, lse, dq, dk, dv), root=0)
        if rank != 0:
            continue
        got = [sharding.unshard([p[j] for p in parts]) for j in range(5)]
        want = reference(q, k, v, d_ctx, d_lse.astype(dtype), key_valid, causal)
        names = ("context", "lse", "dq", "dk", "dv")
        errors = {name: relative_error(g, w) for name, g, w in zip(names, got, want)}
        tol = 1e-12 if dtype == np.float64 else 1e-5
        ok = all(e <= tol for e in errors.values())
        failures += not ok
        worst = max(errors, key=errors.get)
        case = f"P={P} {layout:10} causal={causal!s:5} padding={padding!s:5} H={H} Hkv={Hkv} {kernel:10} {order:10}"
        verdict = "ok  " if ok else "FAIL"
        print(f"{verdict} {case} {np.dtype(dtype).name}: worst {worst} {errors[worst]:.1e} (tol {tol:.0e})")
    if rank == 0:
        print(f"ALL OK {len(CASES)} cases" if failures == 0 else f"{failures} of {len(CASES)} cases FAILED")
    return int(comm.bcast(failures, root=0) > 0)


if __name__ == "__main__":
    sys.exit(main())
