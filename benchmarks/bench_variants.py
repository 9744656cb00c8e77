"""Time and memory of today's variants (a benchmark, never a test):

1. Decoding N tokens one at a time (self-attention, GQA + RoPE): with a ``KVCache`` (each step projects one token
   and attends to the cached keys) against recomputing the full causal attention over the whole prefix each step
   (what a decoder without a cache does). Both give the same outputs; the ratio of their times is the cache's gain.
2. The chunked kernel with a causal sliding window of 256 against full causal attention at L = 16384: the kernel
   skips the key tiles outside the window, so its work grows as L·w instead of L²/2.

    python benchmarks/bench_variants.py --quick      # N = 256, L = 4096: a minute
    python benchmarks/bench_variants.py              # N = 1024, L = 16384: a few minutes on 2 cores

Times are the median of ``--repeats`` runs (decoding: one run each, it is long); memory is the tracemalloc peak of
NumPy allocations during the call (the (L, L) bool mask is built before and not counted). "% peak": useful FLOPs
over the time over the GEMM peak measured in the same run at ``--threads`` (``gemm_peak.py``): decoding counts
``flops.kv_decoding`` for both rows (recomputing does the same useful work, and more); the window table counts
``flops.self_attention`` over each mask's allowed pairs only. Writes ``variants_results.md`` into ``--out``
(default benchmarks/).
"""

from __future__ import annotations

import argparse
import os
import sys
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_attention import median_time  # noqa: E402
from flops import causal_entries, kv_decoding, self_attention, window_entries  # noqa: E402
from gemm_peak import gemm_peak, pct  # noqa: E402

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
                entries=causal_entries(L) if name == "full causal" else window_entries(L, w),
            )
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="N = 256 decoding steps, L = 4096 for the window")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks", help="output directory (default benchmarks/)")
    p.add_argument("--repeats", type=int, default=1, help="repeats of the window timings (median)")
    p.add_argument("--every", type=int, default=None, help="recompute every k-th step only (default: 1 quick, 8 full)")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="BLAS threads")
    args = p.parse_args(argv)
    from threadpoolctl import threadpool_limits

    load0 = os.getloadavg()[0]
    with threadpool_limits(limits=args.threads, user_api="blas"):
        lines = tables(args, load0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "variants_results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def tables(args, load0: float) -> list[str]:
    """Measure both parts -> the markdown lines."""
    N, L = (256, 4096) if args.quick else (1024, 16384)
    every = args.every or (1 if args.quick else 8)

    lines = ["# Today's variants: KV-cache decoding and sliding-window attention", ""]
    cmd = "python benchmarks/bench_variants.py" + (" --quick" if args.quick else "")
    lines += [f"Made by `{cmd}` with {args.threads} BLAS threads; load average {load0:.2f} at the start.", ""]
    decode_rows = []
    for Hkv in (8, 2):
        decode_rows.append(decoding(N, 256, 8, Hkv, np.float64, every))
        print(decode_rows[-1], flush=True)
    peak64 = gemm_peak(np.float64, args.threads)
    lines += decoding_table(decode_rows, peak64)
    window_rows = window(L, 256, 256, 4, np.float32, args.repeats)
    print(window_rows, flush=True)
    lines += ["", *window_table(window_rows, gemm_peak(np.float32, args.threads))]
    return lines + ["", f"Load average at the end: {os.getloadavg()[0]:.2f}."]


def decoding_table(rows: list[dict], peak) -> list[str]:
    """KV cache against recomputing: times, ratio, and both shares of the peak from the same ``flops.kv_decoding``."""
    r0 = rows[0]
    lines = [f"## Decoding {r0['N']} tokens one at a time (E = {r0['E']}, H = {r0['H']}, RoPE, {r0['dtype']})", ""]
    if r0["every"] > 1:
        lines += [f"Recomputation timed on every {r0['every']}th step and multiplied by {r0['every']} (an estimate).",
                  ""]  # fmt: skip
    lines += ["% peak = the useful FLOPs of decoding (flops.kv_decoding: per step one token's projections and its "
              f"attention over the keys so far; the same for both columns) / time / {peak.line()}.", ""]  # fmt: skip
    lines += ["| Hkv | with KVCache (s) | recompute causal prefix (s) | ratio | max abs diff | cache MiB "
              "| KVCache % peak | recompute % peak |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        fl = kv_decoding(r["N"], r["E"], r["H"], r["Hkv"])
        lines.append(
            f"| {r['Hkv']} | {r['t_cache']:.2f} | {r['t_full']:.2f} | {r['ratio']:.1f}× | {r['max_diff']:.1e} | "
            f"{r['kv_mib']:.2f} | {pct(fl, r['t_cache'], peak)} | {pct(fl, r['t_full'], peak)} |"
        )
    return lines


def window_table(rows: list[dict], peak, E: int = 256, H: int = 4) -> list[str]:
    """Window against full causal: times, memory, and each row's share of the peak over its allowed pairs."""
    L = rows[0]["L"]
    lines = [f"## Chunked kernel at L = {L}: causal window of 256 vs full causal (E = {E}, H = {H}, float32)", ""]
    lines += ["% peak = useful FLOPs (flops.self_attention over the row's allowed pairs only) / time / "
              f"{peak.line()}.", ""]  # fmt: skip
    lines += ["| mask | allowed fraction | forward (s) | forward + backward (s) | peak MiB (fwd + bwd) "
              "| forward % peak | fwd + bwd % peak |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        fwd, both = (self_attention(1, r["L"], E, H, b, entries=r["entries"]) for b in (False, True))
        lines.append(
            f"| {r['mask']} | {r['allowed']:.4f} | {r['t_fwd']:.2f} | {r['t_fwd_bwd']:.2f} | {r['peak_mib']:.0f} | "
            f"{pct(fwd, r['t_fwd'], peak)} | {pct(both, r['t_fwd_bwd'], peak)} |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
