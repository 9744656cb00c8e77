"""Time and memory of today's variants (a benchmark, never a test):

1. Decoding N tokens one at a time (self-attention, GQA + RoPE): with a ``KVCache`` (each step projects one token
   and attends to the cached keys) against recomputing the full causal attention over the whole prefix each step
   (what a decoder without a cache does). Both give the same outputs; the ratio of their times is the cache's gain.
2. The chunked kernel with a causal sliding window of 256 against full causal attention at L = 16384: the kernel
   skips the key tiles outside the window, so its work grows as L·w instead of L²/2.

    python benchmarks/bench_variants.py --quick      # N = 256, L = 4096: a minute
    python benchmarks/bench_variants.py              # N = 1024, L = 16384: a few minutes on 2 cores

Times are the median of ``--repeats`` runs (decoding: one run each, it is long); memory is the tracemalloc peak of
NumPy allocations during the call (the (L, L) bool mask is built before and not counted). Writes
``variants_results.md`` into ``--out`` (default benchmarks/).
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_attention import median_time  # noqa: E402

from mha_numpy import KVCache, MultiHeadAttention, masks  # noqa: E402

MiB = 2**20


def timed(fn, repeats: int = 1) -> float:
    """Median wall time of ``repeats`` calls, no warm-up (``bench_attention.median_time``)."""
    return median_time(fn, repeats, warmup=0)


def peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / MiB
    finally:
        tracemalloc.stop()


def decoding(N: int, E: int, H: int, Hkv: int, dtype, every: int = 1) -> dict:
    """Seconds to decode N tokens with a KV cache and by recomputing the causal prefix; the max difference.

    every > 1 recomputes only the steps t = 0, every, 2·every, ... and multiplies their time by ``every`` (an
    estimate of the full loop, whose step cost grows smoothly with t); the difference is taken on those steps.
    """
    mha = MultiHeadAttention(E, H, num_kv_heads=Hkv, rope_theta=10000.0, dtype=dtype, rng=0)
    x = np.random.default_rng(1).standard_normal((1, N, E)).astype(dtype)
    out_cached = np.empty((1, N, E), dtype)
    out_full = np.empty((1, N, E), dtype)

    def with_cache():
        kv = KVCache()
        for t in range(N):
            xt = x[:, t : t + 1]
            out_cached[:, t] = mha.forward(xt, xt, xt, kv_cache=kv)[0][:, 0]
        return kv

    steps = range(0, N, every)

    def recompute():
        for t in steps:
            prefix = x[:, : t + 1]
            out_full[:, t] = mha.forward(prefix, prefix, prefix, mask=masks.causal_mask(t + 1))[0][:, -1]

    t_cache = timed(with_cache)
    t_full = timed(recompute) * every
    kv = with_cache()
    return dict(
        N=N,
        E=E,
        H=H,
        Hkv=Hkv,
        dtype=np.dtype(dtype).name,
        t_cache=t_cache,
        t_full=t_full,
        ratio=t_full / t_cache,
        max_diff=float(np.abs(out_cached[:, steps] - out_full[:, steps]).max()),
        every=every,
        kv_mib=kv.nbytes / MiB,
    )


def window(L: int, w: int, E: int, H: int, dtype, repeats: int) -> list[dict]:
    """Chunked forward and forward + backward, causal sliding window of w against full causal, at length L."""
    mha = MultiHeadAttention(E, H, impl="chunked", dtype=dtype, rng=0)
    x = np.random.default_rng(2).standard_normal((1, L, E)).astype(dtype)
    rows = []
    for name, mask in (("full causal", masks.causal_mask(L)), (f"window {w}", masks.sliding_window_mask(L, L, w))):

        def fwd(mask=mask):
            return mha.forward(x, x, x, mask=mask)

        def fwd_bwd(mask=mask):
            out, cache = mha.forward(x, x, x, mask=mask)
            return mha.backward(np.ones_like(out), cache)

        rows.append(
            dict(
                mask=name,
                L=L,
                t_fwd=timed(fwd, repeats),
                t_fwd_bwd=timed(fwd_bwd, repeats),
                peak_mib=peak_mib(fwd_bwd),
                allowed=float(mask.mean()),
            )
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="N = 256 decoding steps, L = 4096 for the window")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks", help="output directory (default benchmarks/)")
    p.add_argument("--repeats", type=int, default=1, help="repeats of the window timings (median)")
    p.add_argument("--every", type=int, default=None, help="recompute every k-th step only (default: 1 quick, 8 full)")
    args = p.parse_args(argv)
    N, L = (256, 4096) if args.quick else (1024, 16384)
    every = args.every or (1 if args.quick else 8)

    lines = ["# Today's variants: KV-cache decoding and sliding-window attention", ""]
    lines += ["Made by `python benchmarks/bench_variants.py" + (" --quick" if args.quick else "") + "`.", ""]
    lines += [f"## Decoding {N} tokens one at a time (E = 256, H = 8, RoPE, float64)", ""]
    if every > 1:
        lines += [f"Recomputation timed on every {every}th step and multiplied by {every} (an estimate).", ""]
    lines += ["| Hkv | with KVCache (s) | recompute causal prefix (s) | ratio | max abs diff | cache MiB |"]
    lines += ["| --- | --- | --- | --- | --- | --- |"]
    for Hkv in (8, 2):
        r = decoding(N, 256, 8, Hkv, np.float64, every)
        print(r, flush=True)
        lines.append(
            f"| {Hkv} | {r['t_cache']:.2f} | {r['t_full']:.2f} | {r['ratio']:.1f}× | {r['max_diff']:.1e} | "
            f"{r['kv_mib']:.2f} |"
        )
    lines += ["", f"## Chunked kernel at L = {L}: causal window of 256 vs full causal (E = 256, H = 4, float32)", ""]
    lines += ["| mask | allowed fraction | forward (s) | forward + backward (s) | peak MiB (fwd + bwd) |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for r in window(L, 256, 256, 4, np.float32, args.repeats):
        print(r, flush=True)
        lines.append(
            f"| {r['mask']} | {r['allowed']:.4f} | {r['t_fwd']:.2f} | {r['t_fwd_bwd']:.2f} | {r['peak_mib']:.0f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "variants_results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
