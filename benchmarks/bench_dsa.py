"""Time and memory of attention over each query's selected keys (``sparse.SparseKernel``'s pair, DeepSeek Sparse
Attention) against dense attention with the same selection as a mask (the chunked kernel, its default tiles, with
the selection's (L, L) bool entries), forward + backward (a benchmark, never a test; issue 39).

    python benchmarks/bench_dsa.py --quick            # L = 4096, k = 512: seconds, into out/bench/
    python benchmarks/bench_dsa.py --write-results    # L = 4096 ... 32768, k = 2048: benchmarks/dsa_results.md

The selection: query t keeps every key when t < k, else k keys spread evenly over 0 ... t (causal, no key twice):
what a top-k of the indexer holds, without the indexer's (L, L) scores. Heads: H query heads sharing one key/value
head (Hk = 1, as MLA's latent is shared by every head in DeepSeek's absorbed decoding) for the sparse pair; the
dense kernel gets K, V repeated to H heads (same arithmetic, it has no shared-key mode). float32, d = dv = 64.
Times: one run each, wall seconds and the process's CPU seconds (every thread: the chunked kernel runs two, the
sparse pair one BLAS thread), since on a shared machine the wall time follows the load. Memory: the tracemalloc
peak of forward + backward (q, k, v, the upstream gradient and the selection's int32 index made before; for the
dense row, its (L, L) mask and the ``TopKSelection``'s copy of the index made inside). The dense row is skipped
above ``--dense-max-L``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mha_numpy import kernels  # noqa: E402
from mha_numpy.sparse.sparse_attention import sparse_attention_backward, sparse_attention_forward  # noqa: E402
from mha_numpy.sparse.topk import TopKSelection  # noqa: E402

MiB = 2**20
H, D = 4, 64


def spread_selection(L: int, k: int) -> np.ndarray:
    """(1, L, min(k, L)) int32: every key 0 ... t for t < k, else k keys spread evenly over 0 ... t."""
    k = min(k, L)
    t = np.arange(L)[:, None]  # (L, 1)
    j = np.arange(k)[None, :]  # (1, k)
    spread = (j * t) // max(k - 1, 1)  # (L, k): distinct for t >= k - 1, 0 ... t
    return np.where(t >= k, spread, np.where(j <= t, j, -1)).astype(np.int32)[None]


def measured(run) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the process, every thread, tracemalloc peak MiB) of ``run()``."""
    tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1] / MiB
    tracemalloc.stop()
    return seconds, cpu, peak


def one_length(L: int, k: int, dense: bool, rng) -> dict:
    """The sparse pair's and (``dense``) the chunked kernel's forward + backward at L."""
    q = rng.standard_normal((1, H, L, D)).astype(np.float32)
    kk, v = (rng.standard_normal((1, 1, L, D)).astype(np.float32) for _ in range(2))
    d_out = rng.standard_normal((1, H, L, D)).astype(np.float32)
    index = spread_selection(L, k)

    def sparse():
        context, cache = sparse_attention_forward(q, kk, v, index)
        sparse_attention_backward(d_out, cache)

    row = {"L": L, "k": min(k, L)}
    row["sparse s"], row["sparse cpu"], row["sparse MiB"] = measured(sparse)
    if dense:
        kr, vr = np.repeat(kk, H, axis=1), np.repeat(v, H, axis=1)  # (1, H, L, D)

        def dense_run():
            mask = np.asarray(TopKSelection(index, L))  # (1, 1, L, L) bool: the selection's entries
            kernel = kernels.get_kernel("chunked")
            context, cache = kernel.forward(q, kr, vr, mask=mask)
            kernel.backward(d_out, cache)

        row["dense s"], row["dense cpu"], row["dense MiB"] = measured(dense_run)
    return row


def table(rows: list[dict], load: float) -> list[str]:
    """The markdown table: wall and CPU seconds, peaks, the ratios dense / sparse."""
    lines = [
        "DSA's attention over the selected keys (sparse) vs dense attention with the selection as a mask (the "
        f"chunked kernel, the (L, L) bool entries), forward + backward, float32, H = {H} query heads sharing one key "
        f"head, d = {D}. One run each on a shared {os.cpu_count()}-core machine (load average {load:.1f} at the "
        "start): wall time follows the load; CPU time (the process's, every thread) less so. Peak: tracemalloc; "
        "the selection's int32 index (L · k · 4 bytes) is made before and not counted (the sparse pair reads it "
        "uncopied), the dense row's (L, L) mask and its TopKSelection's copy of the index are.",
        "",
        "| L | k | sparse wall s | sparse CPU s | sparse peak MiB | dense wall s | dense CPU s | dense peak MiB | "
        "dense / sparse wall | dense / sparse CPU |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cells = [r["L"], r["k"], f"{r['sparse s']:.1f}", f"{r['sparse cpu']:.1f}", f"{r['sparse MiB']:.0f}"]
        if "dense s" in r:
            cells += [f"{r['dense s']:.1f}", f"{r['dense cpu']:.1f}", f"{r['dense MiB']:.0f}",
                      f"{r['dense s'] / r['sparse s']:.1f}x", f"{r['dense cpu'] / r['sparse cpu']:.1f}x"]  # fmt: skip
        else:
            cells += ["not run", "", "", "", ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="L = 4096, k = 512")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--dense-max-L", type=int, default=32768, help="no dense row above this L")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    p.add_argument("--write-results", action="store_true", help="write benchmarks/dsa_results.md")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.k = [4096], 512
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    rows = []
    for L in args.lengths:
        rows.append(one_length(L, args.k, L <= args.dense_max_L, rng))
        print(rows[-1], flush=True)
    out = ROOT / "benchmarks" if args.write_results else args.out
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(table(rows, load)) + "\n"
    (out / "dsa_results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
