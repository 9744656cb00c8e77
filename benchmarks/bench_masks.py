"""Time and memory of the chunked kernel with a mask given by its entries (a dense bool (L, L) array) against the
same mask given by its rule (``masks.StructuredMask``): a causal sliding window of 1024 at L = 4096 ... 65536 and
full causal at L = 4096 ... 32768; and documents of 4096 tokens, causal within each, given by its entries against
FlexAttention's ``BlockMask`` (``create_block_mask(and_masks(document_mod, causal_mod), ...)``, BLOCK_SIZE 128 or
512: its blocks are the kernel's tiles) at L = 4096 ... 32768 (issue 36) (a benchmark, never a test).

Both give the same outputs and gradients, bit for bit (``tests/test_structured_masks.py``; checked here on the
outputs too); what differs is what the caller and the kernel must build, hold and read. With the entries the
caller builds the (L, L) mask (L² bytes: 4 GiB at L = 65536) and the kernel reads every tile of it once to find
the tiles to skip; with the rule nothing of size L² exists: the kernel asks the rule for a tile's state
(``classify``), builds the entries of only the tiles an edge crosses, and visits only the tiles the rule may
allow (``key_range`` / ``query_range``): with a window, O(L · w) work and O(L · d) memory.

    python benchmarks/bench_masks.py --quick            # L = 4096, 8192, one round: seconds, into out/bench/
    python benchmarks/bench_masks.py --write-results    # the full run, 3 interleaved rounds: ~8 minutes idle
    python benchmarks/bench_masks.py --write-results --families document document512  # masks_results_document_...

Each round times, for every mask and L, the dense and the structured mask one after the other on the same inputs,
alternating which goes first (interleaved, so a load that comes and goes hits both); a row whose first run takes
longer than ``--max-seconds`` gets that one round only. Times: building the mask, one forward and the backward
of ``ChunkedKernel()`` (its default 512 × 512 float32 tiles and threads, BLAS at ``--threads``) on q, k, v
(1, H, L, d) float32; reported: the best (min) over the rounds and the spread (max / min - 1), and per round the
ratio structured / dense of mask + forward + backward (median, min..max). Memory: the tracemalloc peak of building
the mask and the forward + backward (q, k, v and the upstream gradient made before; the output and the three
gradients, 4 (L, H·d) arrays, are counted), in a separate run since tracing slows allocation. The dense mask is
skipped where its L² bytes exceed ``--max-dense-gib`` or the memory free now (/proc/meminfo) is under 2.5 L².
Share of the GEMM peak: the useful FLOPs of forward + backward (``flops.attention_core`` over the mask's allowed
pairs: ``flops.window_entries`` / ``flops.causal_entries``, the same for the dense and the structured row) over
the best forward + backward time, divided by the float32 GEMM peak measured in the same run (``gemm_peak.py``).
Writes masks_results.md, masks_results.csv and masks_vs_L.png into ``--out`` (default out/bench/); only
``--write-results`` writes the committed copies: benchmarks/masks_results.{md,csv} and
docs/performance_masks_vs_L.png.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys
import time
import tracemalloc
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_attention import environment  # noqa: E402
from bench_report import MiB  # noqa: E402
from flops import attention_core, causal_entries, window_entries  # noqa: E402
from gemm_peak import gemm_peak, pct  # noqa: E402

from mha_numpy import kernels, masks  # noqa: E402
from mha_numpy.block_mask import and_masks, create_block_mask  # noqa: E402

GiB = 2**30
H, D, WINDOW, DOC = 2, 64, 1024, 4096
KINDS = ("dense", "structured")
FAMILIES = {  # name -> (title, the mask at L given as entries or as its rule, its lengths)
    "window": (f"causal sliding window of {WINDOW}",
               lambda L, structured: masks.sliding_window_mask(L, L, WINDOW, structured=structured),
               (4096, 8192, 16384, 32768, 65536)),
    "causal": ("causal", lambda L, structured: masks.causal_mask(L, structured=structured),
               (4096, 8192, 16384, 32768)),
    "document": (f"documents of {DOC}, causal in each: the structured row is a BlockMask, BLOCK_SIZE 128 (torch's "
                 "default; the kernel's tiles 128 × 128)", lambda L, structured: document_mask(L, structured, 128),
                 (4096, 8192, 16384, 32768)),
    "document512": (f"documents of {DOC}, causal in each: the structured row is a BlockMask, BLOCK_SIZE 512 (the "
                    "kernel's float32 tile)", lambda L, structured: document_mask(L, structured, 512),
                    (4096, 8192, 16384, 32768)),
}  # fmt: skip
ENTRIES = {"window": lambda L: window_entries(L, WINDOW), "causal": causal_entries,
           "document": lambda L: L // DOC * causal_entries(DOC)}  # allowed pairs at L  # fmt: skip
ENTRIES["document512"] = ENTRIES["document"]


def document_mask(L: int, block: bool, block_size: int):
    """Documents of DOC tokens packed to L, causal in each: the dense (L, L) bool, or the BlockMask of the mask_mods
    (``create_block_mask``, evaluated one block row at a time: no (L, L) array)."""
    lengths = [DOC] * (L // DOC)
    if not block:
        return masks.document_mask(lengths, causal=True)  # (L, L)
    mod = and_masks(masks.document_mod(lengths), masks.causal_mod)
    return create_block_mask(mod, None, None, L, L, BLOCK_SIZE=block_size)


def fwd_bwd_flops(family: str, L: int) -> float:
    """Useful FLOPs of one forward + backward of the core on (1, H, L, D) under the family's mask at L."""
    return attention_core(1, H, D, ENTRIES[family](L), backward=True)


def load() -> float:
    return os.getloadavg()[0]


def mem_available() -> int:
    """Bytes the kernel says are free for a new allocation now (MemAvailable), or a large number if unknown."""
    try:
        return int(re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        return 1 << 62


def inputs(L: int):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((1, H, L, D)).astype(np.float32) for _ in range(4))  # q, k, v, d_ctx


def run(family: str, kind: str, L: int, qkvd) -> dict:
    """Seconds to build the mask, for the chunked forward and for its backward; the context and the tile count."""
    q, k, v, d_ctx = qkvd
    kern = kernels.ChunkedKernel()
    t0 = time.perf_counter()
    mask = FAMILIES[family][1](L, kind == "structured")
    t1 = time.perf_counter()
    ctx, cache = kern.forward(q, k, v, mask=mask)
    t2 = time.perf_counter()
    kern.backward(d_ctx, cache)
    t3 = time.perf_counter()
    return dict(t_mask=t1 - t0, t_fwd=t2 - t1, t_bwd=t3 - t2, tiles=len(cache.tile_states), ctx=ctx,
                mask_mib=mask.nbytes / MiB)  # fmt: skip


def peak_mib(family: str, kind: str, L: int, qkvd) -> float:
    """The tracemalloc peak (MiB) of building the mask and one forward + backward."""
    tracemalloc.start()
    try:
        run(family, kind, L, qkvd)
        return tracemalloc.get_traced_memory()[1] / MiB
    finally:
        tracemalloc.stop()


def dense_skip(L: int, max_gib: float) -> str | None:
    """Why the dense (L, L) mask is not built at L (None: it is)."""
    if L * L > max_gib * GiB:
        return f"not built: its {L * L / GiB:.0f} GiB exceed --max-dense-gib {max_gib:g}"
    if mem_available() < 2.5 * L * L:
        return f"not built: {mem_available() / GiB:.1f} GiB free, building it takes ~{2 * L * L / GiB:.0f} GiB"
    return None


def total(t: dict, r: int) -> float:
    """Mask + forward + backward of round r."""
    return t["t_mask"][r] + t["t_fwd"][r] + t["t_bwd"][r]


def best(xs) -> str:
    """'min (+spread%)' of a list of seconds."""
    lo = min(xs)
    return f"{lo:.3f}" if len(xs) == 1 else f"{lo:.3f} (+{100 * (max(xs) / lo - 1):.0f}%)"


def measure(args) -> tuple[dict, dict, list[float]]:
    """-> rows {(family, kind, L): times per round, peak, ...}, skipped {(family, L): reason}, loads while timing."""
    plan = [(f, L) for f in args.families for L in FAMILIES[f][2] if L <= args.max_len]
    rows, skipped, loads, slow = {}, {}, [], set()
    for r in range(args.rounds):
        for family, L in plan:
            if r > 0 and (family, L) in slow:
                continue
            qkvd, ctx = inputs(L), {}
            for kind in KINDS if r % 2 == 0 else KINDS[::-1]:  # alternating which goes first
                if kind == "dense" and r == 0 and (reason := dense_skip(L, args.max_dense_gib)):
                    skipped[family, L] = reason
                if kind == "dense" and (family, L) in skipped:
                    continue
                loads.append(load())
                res = run(family, kind, L, qkvd)
                ctx[kind] = res.pop("ctx")
                row = rows.setdefault((family, kind, L), dict(t_mask=[], t_fwd=[], t_bwd=[]))
                for key in ("t_mask", "t_fwd", "t_bwd"):
                    row[key].append(res[key])
                row.update(tiles=res["tiles"], mask_mib=res["mask_mib"])
                if r == 0 and res["t_fwd"] + res["t_bwd"] > args.max_seconds:
                    slow.add((family, L))
                print(f"round {r} {family} L={L} {kind}: mask {res['t_mask']:.3f} s, forward {res['t_fwd']:.3f} s, "
                      f"backward {res['t_bwd']:.3f} s (load {loads[-1]:.2f})", flush=True)  # fmt: skip
            if len(ctx) == 2:
                tiles = family.startswith("document")  # other tiles: the same numbers to float32 rounding
                same = partial(np.allclose, rtol=1e-5, atol=1e-6) if tiles else np.array_equal  # else bit for bit
                assert same(ctx["dense"], ctx["structured"]), (family, L)
    for (family, kind, L), row in rows.items():
        row["peak"] = peak_mib(family, kind, L, inputs(L))
        print(f"peak {family} L={L} {kind}: {row['peak']:.0f} MiB", flush=True)
    return rows, skipped, loads


def ratio(rows: dict, family: str, L: int) -> str:
    """Median (min..max) over the rounds of structured / dense, mask + forward + backward."""
    d, s = rows.get((family, "dense", L)), rows.get((family, "structured", L))
    if d is None or s is None:
        return ""
    rs = [total(s, r) / total(d, r) for r in range(min(len(d["t_fwd"]), len(s["t_fwd"])))]
    return f"{statistics.median(rs):.2f}" + (f" ({min(rs):.2f}..{max(rs):.2f})" if len(rs) > 1 else "")


def report(args, env: dict, rows: dict, skipped: dict, loads: list, elapsed: float, peak=None) -> list[str]:
    """The markdown; ``peak``: the ``gemm_peak.Peak`` of the shares (default: this run's float32 peak)."""
    peak = peak or gemm_peak(np.float32, args.threads)
    cmd = "python benchmarks/bench_masks.py" + (" --quick" if args.quick else " --write-results" * args.write_results)
    cmd += "" if args.families == list(FAMILIES) else " --families " + " ".join(args.families)
    lines = [
        "# The chunked kernel with a dense mask vs a StructuredMask" + " (a BlockMask)" * ("document" in args.families),
        "",
    ]
    lines += [f"Made by `{cmd}` in {elapsed / 60:.1f} min: {args.rounds} interleaved round(s) (a row whose first "
              f"forward + backward took over {args.max_seconds:g} s: one round), then one tracemalloc run per row. "
              f"`ChunkedKernel()` (512 × 512 float32 tiles, a BlockMask's blocks; {env['threads']} threads), "
              f"q, k, v (1, {H}, L, {D}) "
              "float32. Times in seconds: the best of the rounds (+ the spread, max / min - 1); ratio: structured / "
              "dense of mask + forward + backward per round, median (min..max). Peak: tracemalloc of building the "
              "mask + forward + backward, MiB, and in units of one (L, H·d) float32 array (the output and the three "
              "gradients, 4 such arrays, are counted in it); mask: the bytes the mask object holds.", "",
              "% peak = useful FLOPs of forward + backward (flops.attention_core over the allowed pairs only, the "
              f"same for both rows of an L) / the best forward + backward time / {peak.line()}.", ""]  # fmt: skip
    lines += ["| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in env.items()]
    lines += [f"| load average while timing | {min(loads):.2f} .. {max(loads):.2f} (median "
              f"{statistics.median(loads):.2f}) |", f"| wall time | {elapsed / 60:.1f} min |", ""]  # fmt: skip
    for family in args.families:
        title, _, lengths = FAMILIES[family]
        lines += [f"## {title}", ""]
        lines += ["| L | mask | rounds | build mask (s) | forward (s) | backward (s) | mask + fwd + bwd (s) | "
                  "structured / dense | fwd + bwd % peak | peak MiB | peak / (L, H·d) | mask MiB | tiles classified |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: "
                  "| ---: |"]  # fmt: skip
        for L in (L for L in lengths if L <= args.max_len):
            for kind in KINDS:
                row = rows.get((family, kind, L))
                if row is None:
                    lines.append(f"| {L} | {kind} | 0 | {skipped.get((family, L), '')} | | | | | | | | | |")
                    continue
                n = len(row["t_fwd"])
                tot, rat = [total(row, r) for r in range(n)], ratio(rows, family, L) if kind == "structured" else ""
                fb = min(row["t_fwd"][r] + row["t_bwd"][r] for r in range(n))  # the best forward + backward
                lines.append(f"| {L} | {kind} | {n} | {best(row['t_mask'])} | {best(row['t_fwd'])} | "
                             f"{best(row['t_bwd'])} | {best(tot)} | {rat} | "
                             f"{pct(fwd_bwd_flops(family, L), fb, peak)} | "
                             f"{row['peak']:.0f} | {row['peak'] * MiB / (L * H * D * 4):.1f} | "
                             f"{row['mask_mib']:.2f} | {row['tiles']} |")  # fmt: skip
        lines.append("")
    return lines


def write_csv(path: Path, rows: dict, skipped: dict, families) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["family", "L", "mask", "rounds", "t_mask_min", "t_fwd_min", "t_bwd_min", "total_min", "total_max",
                    "peak_mib", "mask_mib", "tiles", "skipped"])  # fmt: skip
        for family in families:
            for L in FAMILIES[family][2]:
                for kind in KINDS:
                    row = rows.get((family, kind, L))
                    if row is None:
                        if (family, L) in skipped and kind == "dense":
                            w.writerow([family, L, kind, 0] + [""] * 8 + [skipped[family, L]])
                        continue
                    tot = [total(row, r) for r in range(len(row["t_fwd"]))]
                    mins = (f"{min(row[k]):.4f}" for k in ("t_mask", "t_fwd", "t_bwd"))
                    w.writerow([family, L, kind, len(tot), *mins,
                                f"{min(tot):.4f}", f"{max(tot):.4f}", f"{row['peak']:.1f}", f"{row['mask_mib']:.3f}",
                                row["tiles"], ""])  # fmt: skip


def plot(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4), dpi=90)
    colors = {"window": "tab:blue", "causal": "tab:orange", "document": "tab:green", "document512": "tab:red"}
    for family, (title, _, _) in FAMILIES.items():
        title = title.split(":")[0] + (" (BLOCK_SIZE 512)" if family == "document512" else "")
        for kind, style in (("dense", "o--"), ("structured", "s-")):
            Ls = sorted(L for (f, k, L) in rows if (f, k) == (family, kind))
            if not Ls:
                continue
            tot = [min(total(rows[family, kind, L], r) for r in range(len(rows[family, kind, L]["t_fwd"]))) for L in Ls]
            label = f"{title}, {kind}"
            ax_t.plot(Ls, tot, style, color=colors[family], ms=4, label=label)
            ax_m.plot(Ls, [rows[family, kind, L]["peak"] for L in Ls], style, color=colors[family], ms=4, label=label)
    Ls = sorted({L for (_, _, L) in rows})
    ax_m.plot(Ls, [L * L / MiB for L in Ls], "k:", label="L² bytes (the dense mask)")
    ax_m.plot(Ls, [4 * L * H * D * 4 / MiB for L in Ls], color="gray", ls="-.", label="output + 3 gradients")
    for ax, ylabel, title in ((ax_t, "seconds (best of the rounds)", "build mask + forward + backward"),
                              (ax_m, "MiB", "peak memory (tracemalloc)")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"chunked kernel, dense mask vs StructuredMask (H = {H}, d = {D}, float32)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="L = 4096, 8192 and one round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--max-seconds", type=float, default=12.0, help="one round only where forward + backward is slower")
    p.add_argument("--max-dense-gib", type=float, default=4.5, help="the largest dense mask to build (GiB)")
    p.add_argument("--max-len", type=int, default=65536, help="skip the lengths above this")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="BLAS threads")
    p.add_argument("--out", type=Path, default=None, help="output directory (default out/bench)")
    p.add_argument("--write-results", action="store_true", help="write benchmarks/ and docs/ (the committed copies)")
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES),
                   help="the masks to time (default all; a subset writes masks_results_<families>.*)")  # fmt: skip
    args = p.parse_args(argv)
    if args.write_results and (args.quick or args.out is not None):
        p.error("--write-results writes the committed results: not with --quick or --out")
    if args.quick:
        args.rounds, args.max_len = 1, min(args.max_len, 8192)
    return args


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits

    args = parse_args(argv)
    out = ROOT / "benchmarks" if args.write_results else (args.out or ROOT / "out" / "bench")
    part = "" if args.families == list(FAMILIES) else "_" + "_".join(args.families)  # a subset: files of its own
    figure = (
        (ROOT / "docs" / f"performance_masks{part}_vs_L.png") if args.write_results else out / f"masks{part}_vs_L.png"
    )
    results = f"masks_results{part}"
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with threadpool_limits(limits=args.threads, user_api="blas"):
        env = environment(args.threads)
        env.pop("torch", None)  # not used here
        print("\n".join(f"{k}: {v}" for k, v in env.items()), flush=True)
        print(gemm_peak(np.float32, args.threads).line(), flush=True)  # measured before the timings, used after
        rows, skipped, loads = measure(args)
    env["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = report(args, env, rows, skipped, loads, time.perf_counter() - start)
    (out / f"{results}.md").write_text("\n".join(lines))
    write_csv(out / f"{results}.csv", rows, skipped, args.families)
    plot(rows, figure)
    print("\n".join(lines))
    print(f"wrote {out / f'{results}.md'}, {out / f'{results}.csv'} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
