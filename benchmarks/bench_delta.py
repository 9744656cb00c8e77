"""The gated delta rule at long L (issue 37): ours, chunked (float32 and float64) and recurrent (small L only),
against transformers' ``torch_chunk_gated_delta_rule`` (float32, the dtype it computes in), forward + backward,
with each side's peak memory (a benchmark, never a test).

    python benchmarks/bench_delta.py --quick            # L = 1024, 4096, one round: a minute, into out/bench/
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/bench_delta.py --write-results  # L = 1024 … 65536: half an hour on a shared machine

The shape is Qwen3-Next's linear-attention layer cut to a few heads: B = 1, ``--heads`` value heads (default 2) and
half as many key heads (Qwen3-Next: 16 key, 32 value heads), d_k = d_v = 128, chunks of 64, q and k l2-normalised
inside (``use_qk_l2norm`` / ``use_qk_l2norm_in_kernel``, as the layer calls it), no initial state, random inputs
(g in [−0.1, −0.01], β in (0.1, 0.9)). Sides:

    chunked          gated_delta_rule_forward(..., impl="chunked") + gated_delta_rule_backward, float32 and float64
    recurrent        the same with impl="recurrent" (token by token), at L ≤ ``--recurrent-max`` only
    transformers     torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, use_qk_l2norm_in_kernel=True),
                     then o.backward(d_o): autograd for q, k, v, g, β (transformers without flash-linear-attention)

The same threads: NumPy's BLAS limited to ``--threads`` (threadpoolctl; our chunked form then runs that many bands
of heads on the house's pool, ``delta_chunked.head_bands``) and ``torch.set_num_threads(--threads)``.

Every side is called once at L = 128 before anything is measured (a first call's one-offs: imports, torch's
set-up). Per L, every side is called once first: the warm-up, which is also the memory measurement and the check (each
side's o and five gradients against ours in float64: the largest difference relative to the largest entry). Memory:
the growth of the process's peak resident set over the call (VmHWM reset by ``/proc/self/clear_refs``, Linux only;
the same measure for every side: torch's allocations are plain malloc on the CPU; glibc's ``malloc_trim`` first, so
that memory an earlier call freed does not hide this one's), and for ours also the peak of
tracemalloc (NumPy's allocations; the outputs included). Then ``--rounds`` interleaved rounds (the order rotating,
``bench_compare.interleaved``) of the best of ``--repeats`` calls; the table gives each side's median and the median
of the per-round ratios transformers / side (above 1: ours ahead), with their spread (min..max), and each side's
share of the GEMM peak measured in this run (``gemm_peak.py``) from the same useful FLOPs
(``flops.gated_delta_chunked``; the recurrent form gets the same count). Writes delta_results.md and
delta_vs_L.png into ``--out`` (default out/bench/); ``--write-results`` writes the committed copies:
benchmarks/delta_results.md and docs/performance_delta_vs_L.png.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tracemalloc
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_compare import interleaved, ratio_spread  # noqa: E402
from flops import gated_delta_chunked  # noqa: E402
from gemm_peak import gemm_peak, pct  # noqa: E402

from mha_numpy.recurrent import gated_delta_rule_backward, gated_delta_rule_forward  # noqa: E402

D, CHUNK = 128, 64
THEIRS = "transformers"
NAMES = ("q", "k", "v", "g", "beta")


def make(Hk: int, H: int, L: int, seed: int = 0) -> dict:
    """float64 inputs in our layout: q, k (1, Hk, L, D), v and d_o (1, H, L, D), g, β (1, H, L)."""
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((1, Hk, L, D)),
        "k": rng.standard_normal((1, Hk, L, D)),
        "v": rng.standard_normal((1, H, L, D)),
        "g": -rng.uniform(0.01, 0.1, (1, H, L)),
        "beta": rng.uniform(0.1, 0.9, (1, H, L)),
        "d_o": rng.standard_normal((1, H, L, D)),
    }


def ours(x: dict, impl: str):
    """Our forward + backward -> (o, {name: gradient}) in our layout."""
    (o, _), cache = gated_delta_rule_forward(*(x[n] for n in NAMES), chunk_size=CHUNK, impl=impl, use_qk_l2norm=True)
    return o, gated_delta_rule_backward(x["d_o"], cache)


def theirs(t: dict, convert: bool = False):
    """transformers' chunked function + autograd on (B, L, heads, ·) float32 tensors; ``convert``: the results
    in our layout as NumPy (for the check, outside the timed calls)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    leaves = {n: t[n].detach().requires_grad_() for n in NAMES}
    o, _ = torch_chunk_gated_delta_rule(*leaves.values(), chunk_size=CHUNK, use_qk_l2norm_in_kernel=True)
    o.backward(t["d_o"])  # o: (B, L, H, dv), as d_o
    if not convert:
        return None
    ours_layout = lambda a: np.swapaxes(a.detach().numpy(), 1, 2)  # noqa: E731  (B, L, heads, ·) -> (B, heads, L, ·)
    return ours_layout(o), {n: ours_layout(leaves[n].grad) for n in NAMES}


def torch_inputs(x: dict) -> dict:
    """Our float64 arrays as transformers takes them: float32 tensors in (B, L, heads, ·)."""
    import torch

    return {n: torch.from_numpy(np.ascontiguousarray(np.swapaxes(a, 1, 2), dtype=np.float32)) for n, a in x.items()}


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: now; VmHWM: the peak since the last reset)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def release_freed_memory() -> None:
    """glibc's malloc_trim(0): the pages of memory already freed go back to the system, so that the next call's
    peak resident set counts what it touches itself, not what an earlier call left in the heap (a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measured(fn, trace: bool):
    """One call of ``fn`` -> (its result, peak RSS growth in bytes or None, tracemalloc peak in bytes or None)."""
    gc.collect()
    release_freed_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS (Linux ≥ 4.0)
        base = status_kib("VmRSS")
    except OSError:
        base = None
    if trace:
        tracemalloc.start()
    try:
        result = fn()
        traced = tracemalloc.get_traced_memory()[1] if trace else None
    finally:
        tracemalloc.stop()
    rss = None if base is None else 1024 * (status_kib("VmHWM") - base)
    return result, rss, traced


def rel_diff(got, want) -> float:
    """The largest difference of o and the five gradients, each relative to its reference's largest entry."""
    (o, grads), (o_ref, ref) = got, want
    pairs = [(o, o_ref)] + [(grads[n], ref[n]) for n in NAMES]
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in pairs)


def sides(x: dict, L: int, recurrent_max: int) -> dict:
    """{(side, dtype): a forward + backward call} at this L; the reference (chunked, float64) first."""
    x32 = {n: a.astype(np.float32) for n, a in x.items()}
    out = {("chunked", "float64"): partial(ours, x, "chunked"), ("chunked", "float32"): partial(ours, x32, "chunked")}
    if L <= recurrent_max:
        out[("recurrent", "float64")] = partial(ours, x, "recurrent")
        out[("recurrent", "float32")] = partial(ours, x32, "recurrent")
    out[(THEIRS, "float32")] = partial(theirs, torch_inputs(x))
    return out


def measure(Hk: int, H: int, L: int, rounds: int, repeats: int, recurrent_max: int) -> list[dict]:
    """The rows of one L: the warm-up call (memory, check), then the interleaved rounds."""
    fns = sides(make(Hk, H, L), L, recurrent_max)
    rows, ref = {}, None
    for key, fn in fns.items():
        call = partial(fn, convert=True) if key[0] == THEIRS else fn
        result, rss, traced = measured(call, trace=key[0] != THEIRS)
        ref = result if ref is None else ref
        rows[key] = dict(side=key[0], dtype=key[1], L=L, H=H, Hk=Hk, rss=rss, traced=traced,
                         diff=rel_diff(result, ref), flops=gated_delta_chunked(1, H, L, D, D, CHUNK, True))  # fmt: skip
        del result
        print(rows[key], flush=True)
    del ref
    times = interleaved(fns, rounds, repeats, warm_up=False)
    for key, row in rows.items():
        row["seconds"] = statistics.median(times[key])
        row["ratio"] = ratio_spread(times[(THEIRS, "float32")], times[key])  # transformers / side: (median, min, max)
    return list(rows.values())


def mib(n) -> str:
    return "" if n is None else f"{n / 2**20:.0f}" if n >= 2**20 else f"{n / 2**20:.2f}"


def table(rows: list[dict], peaks: dict) -> list[str]:
    """The markdown table: one row per (L, side, dtype)."""
    r0 = rows[0]
    lines = [f"## B = 1, H = {r0['H']} value heads ({r0['Hk']} key heads), d_k = d_v = {D}, chunks of {CHUNK}: "
             "forward + backward", ""]  # fmt: skip
    lines += ["% peak = useful FLOPs (flops.gated_delta_chunked, the same for every side) / median time / the "
              "dtype's " + "; ".join(p.line() for p in peaks.values()) + ". transformers / side: the median of "
              "the per-round ratios (min..max), above 1 when the side is faster. RSS: the growth of the peak "
              "resident set over one call; tracemalloc: NumPy's allocations at their peak (ours only), and that "
              "per token. Difference: o and the five gradients against ours in float64, the largest relative to "
              "each one's largest entry.", ""]  # fmt: skip
    lines += ["| L | side | dtype | forward + backward (s) | transformers / side | % peak | RSS peak (MiB) "
              "| tracemalloc peak (MiB) | tracemalloc / token (KiB) | difference to float64 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        ratio = "{:.2f}× ({:.2f}..{:.2f})".format(*r["ratio"])
        per_token = "" if r["traced"] is None else f"{r['traced'] / r['L'] / 1024:.1f}"
        lines.append(f"| {r['L']} | {r['side']} | {r['dtype']} | {r['seconds']:.3g} | {ratio} "
                     f"| {pct(r['flops'], r['seconds'], peaks[r['dtype']])} | {mib(r['rss'])} | {mib(r['traced'])} "
                     f"| {per_token} | {r['diff']:.1e} |")  # fmt: skip
    return lines


def plot(rows: list[dict], path: Path) -> None:
    """Two panels against L (log–log): the median time of every side, and the peak memory (RSS growth; ours'
    tracemalloc dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = list(dict.fromkeys((r["side"], r["dtype"]) for r in rows))
    for i, key in enumerate(keys):
        rs = [r for r in rows if (r["side"], r["dtype"]) == key]
        Ls, color, label = [r["L"] for r in rs], f"C{i}", f"{key[0]} {key[1]}"
        ax_t.plot(Ls, [r["seconds"] for r in rs], "o-", color=color, label=label)
        if all(r["rss"] for r in rs):
            ax_m.plot(Ls, [r["rss"] / 2**20 for r in rs], "o-", color=color, label=f"{label} (RSS)")
        if all(r["traced"] for r in rs):
            ax_m.plot(Ls, [r["traced"] / 2**20 for r in rs], "s--", color=color, label=f"{label} (tracemalloc)")
    for ax, what in ((ax_t, "forward + backward, median (s)"), (ax_m, "peak memory of one call (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("L (tokens)")
        ax.set_ylabel(what)
        ax.grid(True, which="major", alpha=0.3)
    ax_t.legend(fontsize=8)
    ax_m.legend(fontsize=7)
    r0 = rows[0]
    fig.suptitle(f"gated delta rule, forward + backward: ours vs transformers' torch chunked path "
                 f"(H={r0['H']}, d={D}, chunks of {CHUNK})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="L = 1024, 4096, one round (a smoke run, into out/bench/)")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="the L (default 1024 4096 16384 65536)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick 1)")
    p.add_argument("--long-rounds", type=int, default=1, help="rounds at L > 16384 (default 1: minutes a call)")
    p.add_argument("--repeats", type=int, default=1, help="calls per side per round, the best kept")
    p.add_argument("--heads", type=int, default=2, help="value heads H, even (key heads: H / 2; default 2)")
    p.add_argument("--recurrent-max", type=int, default=1024, help="the recurrent form at L up to this")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="BLAS and torch threads")
    p.add_argument("--out", type=Path, default=None, help="output directory (default out/bench)")
    p.add_argument("--write-results", action="store_true", help="write benchmarks/ and docs/ (the committed copies)")
    args = p.parse_args(argv)
    if args.write_results and (args.quick or args.out is not None):
        p.error("--write-results writes the committed results: not with --quick or --out")
    counts = (args.repeats, args.long_rounds, args.threads, args.heads, args.rounds or 1, *(args.lengths or [1]))
    if min(counts) < 1 or args.heads % 2:
        p.error("--rounds, --long-rounds, --repeats, --threads, --lengths must be positive; --heads even")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    lengths = args.lengths or ([1024, 4096] if args.quick else [1024, 4096, 16384, 65536])
    rounds = args.rounds or (1 if args.quick else 3)
    load0 = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    rows = []
    with threadpool_limits(limits=args.threads, user_api="blas"):
        peaks = {t: gemm_peak(t, args.threads) for t in ("float32", "float64")}
        for fn in sides(make(args.heads // 2, args.heads, 2 * CHUNK), 2 * CHUNK, args.recurrent_max).values():
            fn()  # the one-offs of a first call (torch's lazy set-up, imports) kept out of the first L's memory
        for L in sorted(lengths):
            n = rounds if L <= 16384 else min(rounds, args.long_rounds)
            rows += measure(args.heads // 2, args.heads, L, n, args.repeats, args.recurrent_max)
    cmd = "python benchmarks/bench_delta.py" + (" --quick" if args.quick else " --write-results" * args.write_results)
    cmd += f" --rounds {rounds}" if args.rounds else ""
    cmd += f" --lengths {' '.join(map(str, lengths))}" if args.lengths else ""
    lines = ["# The gated delta rule at long L against transformers' torch chunked path (issue 37)", ""]
    lines += [f"Made by `{cmd}` with {args.threads} threads (NumPy's BLAS and torch), torch {torch.__version__}, "
              f"in one process: per L one warm-up call per side (memory, check), then {rounds} interleaved "
              f"round{'s' * (rounds > 1)} ({min(rounds, args.long_rounds)} at L > 16384) of the best of "
              f"{args.repeats} call{'s' * (args.repeats > 1)}. Load average {load0:.2f} at the start.", ""]  # fmt: skip
    lines += table(rows, peaks)
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.2f}."]
    out = ROOT / "benchmarks" if args.write_results else (args.out or ROOT / "out" / "bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "delta_results.md").write_text("\n".join(lines) + "\n")
    figure = ROOT / "docs" / "performance_delta_vs_L.png" if args.write_results else out / "delta_vs_L.png"
    plot(rows, figure)
    print("\n".join(lines))
    print(f"wrote {out / 'delta_results.md'} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
