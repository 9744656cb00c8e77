"""A user's score_mod against the built-in option (issue 36): the soft cap written as a FlexAttention score_mod,
forward + backward through the chunked kernel, against the same cap as the kernel's built-in mod (a benchmark,
never a test).

    python benchmarks/bench_flex.py --quick            # L = 1024, one round: seconds, into out/bench/
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/bench_flex.py --write-results  # L = 4096, 5 interleaved rounds: ~4 minutes idle

Three sides, each ``ChunkedKernel`` forward + backward of self-attention's core at B = 1, H = 8, d = 64, no mask
(every score passes through the mod: the mod's share of the work is the largest it can be):

    built-in   kernel.forward(q, k, v, score_mods=(ScoreMod.elementwise("softcap", soft_cap_forward(cap=30),
               soft_cap_backward),)) + kernel.backward: exactly what ``MultiHeadAttention(softcap=30)`` runs
    flex+vjp   flex_attention_forward(q, k, v, score_mod=30·tanh(s/30), score_mod_vjp=its VJP,
               kernel=ChunkedKernel()) + flex_attention_backward: the user's mod behind flex's checks
    flex+cs    the same without the VJP: its derivative by complex steps (and the probe that vets it)

All in this process, interleaved round by round (the order rotates, ``bench_compare.interleaved``): one warm-up
call each, then per round the best of ``--repeats`` calls. The table gives each side's median, the medians of
the per-round ratios flex / built-in with their spread (min..max), and each side's share of the GEMM peak measured
in this run at the same threads (``gemm_peak.py``) from the same useful FLOPs (``flops.attention_core`` over the
L² entries; the mod's tanh and the backward's recomputation count nothing). Writes flex_results.md and
flex_vs_builtin.png into ``--out`` (default out/bench/); ``--write-results`` writes the committed copies:
benchmarks/flex_results.md and docs/performance_flex_vs_builtin.png.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_compare import interleaved, ratio_spread  # noqa: E402
from flops import attention_core  # noqa: E402
from gemm_peak import gemm_peak, pct  # noqa: E402

from mha_numpy import functional as F  # noqa: E402
from mha_numpy.flex import flex_attention_backward, flex_attention_forward  # noqa: E402
from mha_numpy.kernels import ChunkedKernel, ScoreMod  # noqa: E402

CAP = 30.0
SIDES = ("built-in", "flex+vjp", "flex+cs")


def softcap(score, b, h, q_idx, kv_idx):
    """The user's mod: cap · tanh(score / cap), on any block of scores."""
    return CAP * np.tanh(score / CAP)


def softcap_vjp(score, b, h, q_idx, kv_idx, d_out):
    """Its VJP: d_out · (1 - tanh²(score / cap)); no parameters."""
    t = np.tanh(score / CAP)
    return d_out * (1.0 - t * t), {}


def sides(B: int, H: int, L: int, d: int, dtype) -> dict:
    """{side: a forward + backward call} on one set of (B, H, L, d) inputs in ``dtype``."""
    rng = np.random.default_rng(0)
    q, k, v, d_out = (rng.standard_normal((B, H, L, d)).astype(dtype) for _ in range(4))
    kern = ChunkedKernel()
    builtin = (ScoreMod.elementwise("softcap", partial(F.soft_cap_forward, cap=CAP), F.soft_cap_backward),)

    def built_in():
        out, cache = kern.forward(q, k, v, score_mods=builtin)
        return kern.backward(d_out, cache)

    def flex(vjp):
        out, cache = flex_attention_forward(q, k, v, score_mod=softcap, score_mod_vjp=vjp, kernel=ChunkedKernel())
        return flex_attention_backward(d_out, cache)

    return {"built-in": built_in, "flex+vjp": partial(flex, softcap_vjp), "flex+cs": partial(flex, None)}


def measure(B: int, H: int, L: int, d: int, dtype, rounds: int, repeats: int) -> dict:
    """One dtype's row: every side's per-round seconds, their medians, the ratios to the built-in and the FLOPs."""
    times = interleaved(sides(B, H, L, d, dtype), rounds, repeats)
    row = dict(dtype=np.dtype(dtype).name, B=B, H=H, L=L, d=d, rounds=rounds,
               flops=attention_core(B, H, d, L * L, True))  # fmt: skip
    for side in SIDES:
        row[side] = statistics.median(times[side])
    for side in SIDES[1:]:
        row[f"{side} ratio"] = ratio_spread(times[side], times["built-in"])  # (median, min, max)
    return row


def table(rows: list[dict], peaks: dict) -> list[str]:
    """The markdown table: medians (ms), the two ratios with their spreads, each side's share of its dtype's peak."""
    r0 = rows[0]
    lines = [f"## Soft cap 30 at B = {r0['B']}, H = {r0['H']}, L = {r0['L']}, d = {r0['d']}, no mask: forward + "
             "backward, chunked kernel", ""]  # fmt: skip
    lines += ["% peak = useful FLOPs (flops.attention_core over the L² entries, the same for the three sides) / "
              "time / the dtype's " + "; ".join(p.line() for p in peaks.values()) + ".", ""]  # fmt: skip
    lines += ["| dtype | built-in (ms) | flex + VJP (ms) | flex, complex step (ms) | flex + VJP / built-in "
              "| complex step / built-in | built-in % peak | flex + VJP % peak | complex step % peak |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        peak, fl = peaks[r["dtype"]], r["flops"]
        ms = " | ".join(f"{1e3 * r[s]:.0f}" for s in SIDES)
        ratios = " | ".join("{:.2f}× ({:.2f}..{:.2f})".format(*r[f"{s} ratio"]) for s in SIDES[1:])
        shares = " | ".join(pct(fl, r[s], peak) for s in SIDES)
        lines.append(f"| {r['dtype']} | {ms} | {ratios} | {shares} |")
    return lines


def plot(rows: list[dict], path: Path) -> None:
    """Bars: each side's median time per dtype, the ratio to the built-in written over the flex bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    for i, side in enumerate(SIDES):
        xs = [j + (i - 1) * width for j in range(len(rows))]
        ys = [r[side] for r in rows]
        bars = ax.bar(xs, ys, width, label=side)
        if i:
            labels = [f"{r[f'{side} ratio'][0]:.2f}×" for r in rows]
            ax.bar_label(bars, labels=labels, fontsize=8)
    r0 = rows[0]
    ax.set_xticks(range(len(rows)), [r["dtype"] for r in rows])
    ax.set_ylabel("forward + backward, median (s)")
    ax.set_title(f"soft cap: user's score_mod vs built-in (B={r0['B']}, H={r0['H']}, L={r0['L']}, d={r0['d']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="L = 1024, one round (a smoke run, into out/bench/)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; --quick 1)")
    p.add_argument("--repeats", type=int, default=2, help="calls per side per round, the best kept")
    p.add_argument("--heads", type=int, default=8, help="H (default 8)")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="BLAS threads")
    p.add_argument("--out", type=Path, default=None, help="output directory (default out/bench)")
    p.add_argument("--write-results", action="store_true", help="write benchmarks/ and docs/ (the committed copies)")
    args = p.parse_args(argv)
    if args.write_results and (args.quick or args.out is not None):
        p.error("--write-results writes the committed results: not with --quick or --out")
    if args.rounds is not None and args.rounds < 1 or args.repeats < 1 or args.heads < 1 or args.threads < 1:
        p.error("--rounds, --repeats, --heads and --threads must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from threadpoolctl import threadpool_limits

    L = 1024 if args.quick else 4096
    rounds = args.rounds or (1 if args.quick else 5)
    load0 = os.getloadavg()[0]
    dtypes = (np.float32, np.float64)
    with threadpool_limits(limits=args.threads, user_api="blas"):
        peaks = {np.dtype(t).name: gemm_peak(t, args.threads) for t in dtypes}
        rows = []
        for t in dtypes:
            rows.append(measure(1, args.heads, L, 64, t, rounds, args.repeats))
            print(rows[-1], flush=True)
    cmd = "python benchmarks/bench_flex.py" + (" --quick" if args.quick else " --write-results" * args.write_results)
    cmd += f" --rounds {rounds}" if args.rounds else ""
    lines = ["# FlexAttention's score_mod against the built-in soft cap (issue 36)", ""]
    lines += [f"Made by `{cmd}` with {args.threads} BLAS threads, in one process: one warm-up call per side, then "
              f"{rounds} interleaved round{'s' * (rounds > 1)} of the best of {args.repeats} "
              f"call{'s' * (args.repeats > 1)}; ratios: the median of the per-round ratios (min..max). "
              f"Load average {load0:.2f} at the start.", ""]  # fmt: skip
    lines += table(rows, peaks)
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.2f}."]
    out = ROOT / "benchmarks" if args.write_results else (args.out or ROOT / "out" / "bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "flex_results.md").write_text("\n".join(lines) + "\n")
    figure = ROOT / "docs" / "performance_flex_vs_builtin.png" if args.write_results else out / "flex_vs_builtin.png"
    plot(rows, figure)
    print("\n".join(lines))
    print(f"wrote {out / 'flex_results.md'} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
