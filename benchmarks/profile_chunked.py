"""Where the chunked kernel's float32 forward + backward goes, and how far it is from torch's (issue 27, item 4).

    python benchmarks/profile_chunked.py            # the tile profile and the one-thread comparison
    python benchmarks/profile_chunked.py --rounds 9 --cases 768x12x1024,768x12x2048,256x4x1024,256x4x2048

Everything runs on ONE thread (BLAS limited to one, torch.set_num_threads(1), the kernel's pool of 1) and is timed
with ``time.thread_time``, the CPU time of the calling thread: a loaded machine (other jobs on the cores) delays a
call but adds little to its CPU time, so these ratios hold on a shared machine where wall-clock ratios do not
(docs/performance.md, "Engineering choices in chunked"). The target itself (two threads, wall clock, idle machine)
is measured by bench_attention.py.

1. The tile profile: the NumPy calls of one forward tile and one backward tile of ``chunked._forward_rows`` and
   ``chunked._backward_keys`` (512 × 512, d = 64), each timed on its own, summed over a head's tiles: the share of
   the products (seven per tile), of the two exps and of the other passes. Then the real kernel on the same number
   of tiles, against that bare sequence: what the kernel adds (Python, the row bookkeeping, colder data).
2. Kernel against kernel: ``ChunkedKernel`` run + backward on (1, H, L, d) against torch's
   ``scaled_dot_product_attention`` forward + backward (its CPU flash kernel), and module against module:
   ``MultiHeadAttention(impl="chunked")`` against ``torch.nn.MultiheadAttention``, interleaved rounds, the median
   of the per-round ratios with their spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mha_numpy import MultiHeadAttention  # noqa: E402
from mha_numpy.kernels import ChunkedKernel, check_args  # noqa: E402

clock = time.thread_time  # CPU time of this thread: everything below runs in it


def tile_ops(n: int = 512, d: int = 64) -> dict:
    """The NumPy calls of one forward and one backward tile (as in chunked.py, without the bookkeeping)."""
    rng = np.random.default_rng(0)
    q, k = (0.3 * rng.standard_normal((1, n, d)).astype(np.float32) for _ in range(2))  # (1, n, d) each
    v1 = np.concatenate([rng.standard_normal((1, n, d)), np.ones((1, n, 1))], 2).astype(np.float32)  # [V, 1]
    da = np.concatenate([rng.standard_normal((1, n, d)), np.ones((1, n, 1))], 2).astype(np.float32)  # [dO, -D] / ℓ
    m = np.zeros((1, n, 1), np.float32)  # the rows' max
    s, dp = np.empty((1, n, n), np.float32), np.empty((1, n, n), np.float32)  # the score tile, the dP tile
    acc, dq, dk, dv = np.zeros((1, n, d + 1), np.float32), *(np.zeros((1, n, d), np.float32) for _ in range(3))
    kt = k.swapaxes(1, 2)  # (1, d, n)
    return {
        "fwd QKᵀ": lambda: np.matmul(q, kt, out=s),  # (1, n, d) @ (1, d, n) -> (1, n, n)
        "fwd argmax": lambda: s.argmax(axis=2),
        "fwd S - m": lambda: np.subtract(s, m, out=s),
        "fwd exp": lambda: np.exp(s, out=s),
        "fwd P[V, 1]": lambda: acc.__iadd__(s @ v1),  # (1, n, n) @ (1, n, d + 1) -> (1, n, d + 1)
        "bwd QKᵀ": lambda: np.matmul(q, kt, out=s),
        "bwd S - m": lambda: np.subtract(s, m, out=s),
        "bwd exp": lambda: np.exp(s, out=s),
        "bwd dP": lambda: np.matmul(da, v1.swapaxes(1, 2), out=dp),  # (1, n, d + 1) @ (1, d + 1, n) -> (1, n, n)
        "bwd dV": lambda: dv.__iadd__(s.swapaxes(1, 2) @ da[..., :d]),  # (1, n, n) @ (1, n, d) -> (1, n, d)
        "bwd E∘dP": lambda: np.multiply(dp, s, out=dp),
        "bwd dQ": lambda: dq.__iadd__(dp @ k),  # (1, n, n) @ (1, n, d) -> (1, n, d)
        "bwd dK": lambda: dk.__iadd__(dp.swapaxes(1, 2) @ q),  # (1, n, n) @ (1, n, d) -> (1, n, d)
    }


def tile_profile(rounds: int, H: int = 4, L: int = 1024, d: int = 64) -> None:
    ops, tiles = tile_ops(), H * (L // 512) ** 2
    best = dict.fromkeys(ops, float("inf"))
    for _ in range(rounds):
        spent = dict.fromkeys(ops, 0.0)
        for _ in range(tiles):
            for name, op in ops.items():
                t0 = clock()
                op()
                spent[name] += clock() - t0
        best = {name: min(best[name], spent[name]) for name in ops}
    total = sum(best.values())
    gemm = sum(t for name, t in best.items() if not name.endswith(("argmax", "S - m", "exp", "E∘dP")))
    exps = best["fwd exp"] + best["bwd exp"]
    print(f"tile profile, 512 × 512 float32, d = {d}, one thread (the best of {rounds} sweeps over {tiles} tiles):")
    print("  " + "  ".join(f"{name} {1e6 * t / tiles:.0f} µs" for name, t in best.items()))
    print(f"  a forward + backward tile: {1e6 * total / tiles:.0f} µs; the 7 products {gemm / total:.0%}, "
          f"the 2 exps {exps / total:.0%}, the other passes {(total - gemm - exps) / total:.0%}")  # fmt: skip
    rng = np.random.default_rng(1)
    q, k, v, do = (0.3 * rng.standard_normal((1, H, L, d)).astype(np.float32) for _ in range(4))  # (1, H, L, d)
    args, kernel = check_args((1, H, L, L), d, dtype=np.float32), ChunkedKernel(num_threads=1)
    real = []
    for _ in range(rounds):
        t0 = clock()
        kernel.backward(do, kernel.run(q, k, v, args)[1])
        real.append(clock() - t0)
    print(f"  the kernel on the same {tiles} tiles (H = {H}, L = {L}): {1e3 * min(real):.1f} ms, "
          f"{min(real) / total:.2f}× the bare calls")  # fmt: skip


def against_torch(cases: list[tuple[int, int, int]], rounds: int) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for E, H, L in cases:
            report_case(torch, E, H, L, rounds)
    finally:
        torch.set_num_threads(threads)


def report_case(torch, E: int, H: int, L: int, rounds: int) -> None:
    """Print the CPU times of one case and the two ratios (median of the per-round ratios [min..max])."""
    spent = interleaved(case_functions(torch, E, H, L), rounds)

    def ratio(a, b):
        rs = [x / y for x, y in zip(spent[a], spent[b])]
        return f"{statistics.median(rs):.2f}× [{min(rs):.2f}..{max(rs):.2f}]"

    ms = "  ".join(f"{name} {1e3 * min(t):.0f}" for name, t in spent.items())
    print(f"E={E} H={H} L={L}, one thread, CPU ms (best of {rounds}): {ms}")
    print(f"  kernel chunked / sdpa {ratio('chunked', 'sdpa')}   module ours / torch-mha "
          f"{ratio('ours-mha', 'torch-mha')}   load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip


def case_functions(torch, E: int, H: int, L: int) -> dict:
    """{name: forward + backward} for the chunked kernel, torch's SDPA, our module and torch's, at (1, L, E), H."""
    d, rng = E // H, np.random.default_rng(1)
    x, dy = (rng.standard_normal((1, L, E)).astype(np.float32) for _ in range(2))  # (1, L, E)
    q, k, v, do = (rng.standard_normal((1, H, L, d)).astype(np.float32) for _ in range(4))  # (1, H, L, d)
    args, kernel = check_args((1, H, L, L), d, dtype=np.float32), ChunkedKernel(num_threads=1)
    mha = MultiHeadAttention(E, H, dtype=np.float32, rng=0, impl=kernel)
    torch.manual_seed(0)
    tmha = torch.nn.MultiheadAttention(E, H, batch_first=True)
    tx, tdy, tdo = (torch.from_numpy(a.copy()) for a in (x, dy, do))
    tx.requires_grad_(True)
    tq, tk, tv = (torch.from_numpy(a.copy()).requires_grad_(True) for a in (q, k, v))

    def chunked():
        kernel.backward(do, kernel.run(q, k, v, args)[1])

    def sdpa():
        for t in (tq, tk, tv):
            t.grad = None
        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv).backward(tdo)

    def ours_module():
        out, cache = mha.forward(x, x, x)
        mha.backward(dy, cache)

    def torch_module():
        tx.grad = None
        tmha.zero_grad(set_to_none=True)
        tmha(tx, tx, tx, need_weights=False)[0].backward(tdy)

    return {"chunked": chunked, "sdpa": sdpa, "ours-mha": ours_module, "torch-mha": torch_module}


def interleaved(fns: dict, rounds: int) -> dict:
    """{name: [CPU seconds per round]}: one warm-up call each, then rounds in a rotating order."""
    for fn in fns.values():
        fn()
    spent, names = {name: [] for name in fns}, list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = clock()
            fns[name]()
            spent[name].append(clock() - t0)
    return spent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--cases", default="768x12x1024,256x4x2048", help="E x H x L, comma-separated")
    parser.add_argument("--no-torch", action="store_true", help="the tile profile only")
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # BLAS on one thread: every product runs in this thread, so thread_time counts it
        print(f"load average {os.getloadavg()[0]:.2f}")
        tile_profile(args.rounds)
        if not args.no_torch:
            against_torch([tuple(int(n) for n in c.split("x")) for c in args.cases.split(",")], args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
