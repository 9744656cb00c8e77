"""Peers: the same multi-head attention in HIPS autograd and in JAX on CPU (jit and op by op), verified, then timed.

    python benchmarks/bench_peers.py            # (1, 1024, 768, 12) and (8, 128, 768, 12), float64

Each peer is a plain NumPy-style MHA written once with the array module ``xp`` (autograd.numpy or jax.numpy), with
our module's parameters, differentiated by its framework. Before any timing, its output and every gradient (input
and parameters) must agree with ours (float64: 1e-10 relative to the largest entry); a peer that disagrees is
reported and not timed. Then ours (vectorized, chunked) and the peers run in interleaved rounds; the table gives
each peer's time over our best kernel's, with the spread over rounds, and every row's share of the GEMM peak
measured in the same run (``gemm_peak.py``; the same FLOPs for every row of a shape: ``flops.self_attention``).
Install the peers with
``pip install -r benchmarks/requirements.txt`` (benchmarks only: the package and its tests never import them).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_compare import interleaved, ratio_spread  # noqa: E402
from flops import self_attention  # noqa: E402
from gemm_peak import gemm_peak, pct, peak_lines  # noqa: E402

from mha_numpy import MultiHeadAttention  # noqa: E402

PARAMS = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
SHAPES = [(1, 1024, 768, 12), (8, 128, 768, 12)]


def mha_math(xp, x, P, H: int):
    """Self-attention written plainly with the array module xp: x (B, L, E), P by our parameter names -> (B, L, E)."""
    B, L, E = x.shape
    d = E // H

    def heads(t):  # (B, L, E) -> (B, H, L, d)
        return xp.transpose(xp.reshape(t, (B, L, H, d)), (0, 2, 1, 3))

    q, k, v = (heads(xp.dot(x, P[f"W_{n}"].T) + P[f"b_{n}"]) for n in "qkv")  # (B, H, L, d) each
    s = xp.matmul(q, xp.swapaxes(k, -1, -2)) / np.sqrt(d)  # (B, H, L, L)
    e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    p = e / xp.sum(e, axis=-1, keepdims=True)  # (B, H, L, L)
    ctx = xp.reshape(xp.transpose(xp.matmul(p, v), (0, 2, 1, 3)), (B, L, E))  # (B, L, E)
    return xp.dot(ctx, P["W_o"].T) + P["b_o"]


def autograd_peer(H: int):
    """-> fn(x, P, d) = (output, (dx, dP)) by HIPS autograd's reverse mode."""
    import autograd.numpy as anp
    from autograd import make_vjp

    def fn(x, P, d):
        vjp, out = make_vjp(lambda xp_: mha_math(anp, xp_[0], xp_[1], H))((x, P))
        return out, vjp(d)

    return fn


def jax_peer(H: int, jit: bool):
    """-> fn(x, P, d) = (output, (dx, dP)) by jax.vjp, jitted or op by op; results are ready when it returns."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    def fwd_bwd(x, P, d):
        out, vjp = jax.vjp(lambda x_, P_: mha_math(jnp, x_, P_, H), x, P)
        return out, vjp(d)

    f = jax.jit(fwd_bwd) if jit else fwd_bwd

    def fn(x, P, d):
        out, grads = jax.block_until_ready(f(x, P, d))
        return out, grads

    return fn


def ours(impl: str, mha: MultiHeadAttention):
    def fn(x, P, d):
        out, cache = mha.forward(x, x, x)
        g = mha.backward(d, cache)
        return out, (g["query"] + g["key"] + g["value"], {n: g[n] for n in PARAMS})

    return fn


def worst_error(a, b) -> float:
    """max |a - b| over the output and every gradient, each relative to the largest entry of all of them
    (b_k's gradient is zero in theory: judged against the largest, not against its own rounding noise)."""
    (out_a, (dx_a, dP_a)), (out_b, (dx_b, dP_b)) = a, b
    pairs = [(out_a, out_b), (dx_a, dx_b)] + [(dP_a[n], dP_b[n]) for n in PARAMS]
    largest = max(float(np.abs(v).max()) for _, v in pairs)
    return max(float(np.abs(np.asarray(u) - v).max()) for u, v in pairs) / largest


def run(shapes=SHAPES, dtype=np.float64, rounds: int = 3, tol: float = 1e-10, threads: int | None = None) -> list:
    """Verify every peer against ours, then time ours and the verified peers interleaved -> rows (NumPy's BLAS at
    ``threads``, default min(2, cores); the GEMM peak measured at the same count)."""
    from threadpoolctl import threadpool_limits

    threads = threads or min(2, os.cpu_count() or 1)
    with threadpool_limits(limits=threads, user_api="blas"):
        return _run(shapes, dtype, rounds, tol, threads)


def _run(shapes, dtype, rounds: int, tol: float, threads: int) -> list[dict]:
    rows = []
    for B, L, E, H in shapes:
        mha = MultiHeadAttention(E, H, dtype=dtype, rng=0)
        # nonzero biases, so that their gradients and the broadcast are checked too
        for n in ("b_q", "b_k", "b_v", "b_o"):
            mha.params[n] = np.random.default_rng(2).standard_normal(E).astype(dtype) * 0.1
        rng = np.random.default_rng(1)
        x, d = (rng.standard_normal((B, L, E)).astype(dtype) for _ in range(2))
        P = {n: mha.params[n] for n in PARAMS}
        fns = {"vectorized": ours("vectorized", mha)}
        chunked = MultiHeadAttention(E, H, dtype=dtype, rng=0, impl="chunked")
        chunked.params = mha.params
        fns["chunked"] = ours("chunked", chunked)
        reference = fns["vectorized"](x, P, d)
        for name, make, extra in (("autograd", autograd_peer, ()), ("jax-jit", jax_peer, (True,)),
                                  ("jax-eager", jax_peer, (False,))):  # fmt: skip
            try:
                fn = make(H, *extra)
            except ImportError as e:
                print(f"  {name}: not installed ({e.name}); pip install -r benchmarks/requirements.txt")
                continue
            err = worst_error(fn(x, P, d), reference)
            print(f"  ({B}, {L}, {E}, {H}) {name}: agrees with ours to {err:.1e}", flush=True)
            if err > tol:
                print(f"  {name} disagrees (> {tol:.0e}): not timed")
                continue
            fns[name] = fn
        t = interleaved({name: (lambda f=f, x=x, P=P, d=d: f(x, P, d)) for name, f in fns.items()}, rounds)
        best = min(("vectorized", "chunked"), key=lambda n: min(t[n]))
        for name, times in t.items():
            ratio, lo, hi = ratio_spread(times, t[best])
            rows.append(dict(shape=(B, L, E, H), dtype=np.dtype(dtype).name, variant=name, ms=1e3 * min(times),
                             vs=best, ratio=ratio, lo=lo, hi=hi, flops=self_attention(B, L, E, H, True),
                             peak=gemm_peak(dtype, threads)))  # fmt: skip
            print(f"  ({B}, {L}, {E}, {H}) {name:<10} {1e3 * min(times):8.1f} ms  {ratio:5.2f}× ours ({best}) "
                  f"[{lo:.2f}..{hi:.2f}]", flush=True)  # fmt: skip
    return rows


def table(rows: list[dict]) -> list[str]:
    """Each peer's time over ours and every row's share of the GEMM peak (the same FLOPs per shape)."""
    lines = peak_lines(rows, "flops.self_attention, the same for every row of a shape")
    lines += ["| shape (B, L, E, H) | dtype | variant | fwd+bwd ms (best) | time / ours | spread | % peak |",
              "| --- | --- | --- | ---: | ---: | --- | ---: |"]  # fmt: skip
    lines += [f"| {r['shape']} | {r['dtype']} | {r['variant']} | {r['ms']:.1f} | {r['ratio']:.2f}× {r['vs']} | "
              f"{r['lo']:.2f}..{r['hi']:.2f} | {pct(r.get('flops'), r['ms'] / 1e3, r.get('peak'))} |"
              for r in rows]  # fmt: skip
    return lines


if __name__ == "__main__":
    print("\n".join(table(run())))
