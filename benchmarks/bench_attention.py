"""Time and memory of multi-head attention: naive vs vectorized vs chunked (NumPy) vs PyTorch.

    python benchmarks/bench_attention.py --quick                          # < 1 minute, into out/bench/
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/bench_attention.py --write-results              # the full run (~20 min on 2 cores)
    python benchmarks/bench_attention.py --compare ../main . --case 1:2048:768:12:float32   # a change's ratio
    python benchmarks/bench_attention.py --compare impl=vectorized impl=chunked            # two settings

Self-attention (query = key = value, no mask), B = 1 over L = 128 ... 8192 plus BERT-base (B = 8, L = 128) and
MiniLM (B = 32, L = 64, E = 384, H = 12), E = 768 / H = 12 and E = 256 / H = 4, float32 and float64, forward and
forward + backward; then the causal rows (L = 4096, causal over unmasked), the memory row (L = 16384, E = 256,
H = 4, float32), the peers (``bench_peers.py``: HIPS autograd, JAX jit and op by op, float64) and the NumPy BERT
against transformers (``bench_bert.py``); the ratios there come from interleaved rounds with their spread.
``--compare`` (``bench_compare.py``) times two checkouts or two settings in alternating subprocesses. Variants:

    naive        mha_numpy impl="naive": a Python loop over batch and heads
    vectorized   mha_numpy impl="vectorized": batched over (B, H), builds the (B, H, L, L) scores
    chunked-t1   mha_numpy impl="chunked", num_threads=1: tiles in the calling thread, BLAS threads inside
    chunked-t2   mha_numpy impl="chunked", num_threads=2: a pool of two, BLAS at one thread per worker
    auto         mha_numpy impl="auto": the kernel picked by the rule in kernels/auto.py (rows with B > 1)
    torch-mha    torch.nn.MultiheadAttention(need_weights=False), same thread count
    torch-sdpa   torch linear projections + torch.nn.functional.scaled_dot_product_attention

Each time is the median of ``--repeats`` runs after one warm-up. GFLOP/s counts the model FLOPs
(``flops.self_attention``; the chunked backward's recomputation of QKᵀ is not counted), and "% peak" divides
by the float32 / float64 GEMM rate of this machine measured in the same run at the same thread count
(``gemm_peak.py``): in every table, for ours and for torch in the same row, with the same FLOP count (a causal
row counts the allowed half only, ``flops.causal_entries``); each table states the peak it divides by. Peak memory is
tracemalloc for NumPy (every NumPy allocation during forward + backward) and, for torch, the growth of
the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) in a child process.
Writes results.md, results.csv, time_vs_L.png and memory_vs_L.png into ``--out``, by default the scratch
folder out/bench/ (git ignores out/). Only ``--write-results`` writes benchmarks/, where results.md and
results.csv of the run shown in docs/performance.md are committed, so a quick run never overwrites them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_compare, bench_peers, bench_bert, also when loaded by path

from bench_compare import interleaved, ratio_spread  # noqa: E402
from bench_report import VARIANTS, MiB, score_bytes, write_outputs  # noqa: E402
from flops import causal_entries, self_attention  # noqa: E402
from gemm_peak import gemm_peak  # noqa: E402

from mha_numpy import MultiHeadAttention  # noqa: E402
from mha_numpy.masks import causal_mask  # noqa: E402

NUMPY_VARIANTS = VARIANTS[:5]
COMMITTED = ROOT / "benchmarks"  # results.md / results.csv of the run in docs/performance.md: --write-results only
SCRATCH = ROOT / "out" / "bench"  # every other run (git ignores out/)


# --------------------------------------------------------------------------- what is measured


def flops(B: int, L: int, E: int, H: int, backward: bool, causal: bool = False) -> float:
    """Model FLOPs of self-attention (``flops.self_attention``): 4 projections 2·B·L·E² each, QKᵀ and PV
    2·B·L²·E each; forward = 8·B·L·E² + 4·B·L²·E, forward + backward = 3 × forward; ``causal``: the core over
    the L(L+1)/2 allowed pairs only."""
    return self_attention(B, L, E, H, backward, entries=causal_entries(L) if causal else None)


def median_time(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --------------------------------------------------------------------------- the variants


def numpy_runner(variant: str, B: int, L: int, E: int, H: int, dtype, block_size=None, causal=False, recompute=False):
    """-> (forward(), forward_backward(), x, d_output, mha) for a NumPy variant (``causal``: a causal mask;
    ``recompute``: ``MultiHeadAttention(recompute=True)``, head by head keeping only the inputs)."""
    kw = {}
    if variant.startswith("chunked"):
        kw = dict(impl="chunked", num_threads=int(variant[-1]), block_size=block_size)
    elif variant in ("naive", "auto"):
        kw = dict(impl=variant)
    mha = MultiHeadAttention(E, H, dtype=dtype, rng=0, recompute=recompute, **kw)
    mask = causal_mask(L) if causal else None
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, L, E)).astype(dtype)
    d_output = rng.standard_normal((B, L, E)).astype(dtype)

    def forward():
        return mha.forward(x, x, x, mask=mask)

    def forward_backward():
        out, cache = mha.forward(x, x, x, mask=mask)
        return out, mha.backward(d_output, cache)

    return forward, forward_backward, x, d_output, mha


def torch_runner(variant: str, B: int, L: int, E: int, H: int, dtype, causal=False):
    """-> (forward(), forward_backward(), module, x) for torch-mha / torch-sdpa (``causal``: a causal mask)."""
    import torch

    tdtype = getattr(torch, np.dtype(dtype).name)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=tdtype)
    x = torch.randn(B, L, E, dtype=tdtype, requires_grad=True)
    d_output = torch.randn(B, L, E, dtype=tdtype)
    ignore = torch.ones(L, L, dtype=torch.bool).triu(1) if causal else None  # torch MHA: True = ignore

    def call():
        if variant == "torch-mha":
            return mha(x, x, x, attn_mask=ignore, need_weights=False, is_causal=causal)[0]
        q, k, v = torch.nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
        heads = [t.reshape(B, L, H, E // H).transpose(1, 2) for t in (q, k, v)]  # (B, H, L, d)
        ctx = torch.nn.functional.scaled_dot_product_attention(*heads, is_causal=causal)  # (B, H, L, d)
        return mha.out_proj(ctx.transpose(1, 2).reshape(B, L, E))

    def forward():
        with torch.no_grad():
            return call()

    def forward_backward():
        x.grad = None
        mha.zero_grad(set_to_none=True)  # gradients are allocated anew, as in NumPy
        out = call()
        out.backward(d_output)
        return out

    return forward, forward_backward, mha, x


def numpy_peak_mib(variant, B, L, E, H, dtype, block_size=None, fwd_bwd=None, recompute=False) -> dict:
    """tracemalloc peak of one forward + backward; also the part beyond its output and gradients."""
    if fwd_bwd is None:
        _, fwd_bwd, *_ = numpy_runner(variant, B, L, E, H, dtype, block_size, recompute=recompute)
    tracemalloc.start()
    try:
        out, grads = fwd_bwd()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    kept = out.nbytes + sum(g.nbytes for g in grads.values())  # output and gradients: returned, not overhead
    return dict(peak=peak / MiB, beyond=(peak - kept) / MiB)


def torch_memory_child(spec: dict) -> dict:
    """Run in a child process: peak RSS growth (MiB) of torch forward + backward per variant and L."""
    import torch

    torch.set_num_threads(spec["threads"])
    out = {}
    for variant in spec["variants"]:
        for L in spec["lengths"]:
            _, fwd_bwd, _, _ = torch_runner(variant, spec["B"], L, spec["E"], spec["H"], np.dtype(spec["dtype"]))
            fwd_bwd()  # warm-up: lazily created buffers
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            base = _proc_status("VmRSS")
            fwd_bwd()
            out[f"{variant}/{L}"] = (_proc_status("VmHWM") - base) / 1024
    return out


def _proc_status(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))  # kB


def torch_peaks_mib(variants, B, lengths, E, H, dtype, threads) -> dict:
    """Peak RSS growth per (variant, L) from a child with glibc's mmap threshold fixed, so that
    every large block is mapped on malloc and unmapped on free (RSS then follows the allocations)."""
    if not Path("/proc/self/clear_refs").exists():
        return {}
    spec = dict(variants=variants, B=B, lengths=lengths, E=E, H=H, dtype=np.dtype(dtype).name, threads=threads)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    r = subprocess.run(
        [sys.executable, __file__, "--torch-memory-child", json.dumps(spec)], env=env, capture_output=True, text=True
    )
    if r.returncode != 0:
        print(f"  (torch memory not measured: {r.stderr.strip().splitlines()[-1:]})", flush=True)
        return {}
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the run


def environment(threads: int) -> dict:
    from threadpoolctl import threadpool_info

    blas = [
        f"{i.get('internal_api')} {i.get('version')} (kernel {i.get('architecture')}, {i.get('num_threads')} threads)"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    cpu = platform.processor() or "?"
    try:
        info = Path("/proc/cpuinfo").read_text()
        fields = [re.search(rf"{k}\s*:\s*(.*)", info).group(1) for k in ("model name", "cpu family", "model")]
        cpu = f"{fields[0]} (family {fields[1]}, model {fields[2]})"
    except (OSError, AttributeError):
        pass
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": "; ".join(blas),
        "torch": torch_version,
        "threads": threads,
        "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE": " / ".join(
            os.environ.get(k, "unset") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
        ),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def cases(args):
    """(label, B, L, E, H) in run order."""
    out = []
    for E, H in args.shapes:
        out += [(f"E={E} H={H}", 1, L, E, H) for L in args.lengths]
    if args.small_batches:
        out += [("BERT-base B=8", 8, 128, 768, 12), ("MiniLM B=32", 32, 64, 384, 12)]
    return out


def skip_reason(variant, B, L, E, H, dtype, args) -> str | None:
    itemsize = np.dtype(dtype).itemsize
    if variant == "naive" and L > args.naive_max_len:
        why = "--quick" if args.quick else "minutes per run"
        return f"skipped: naive above L={args.naive_max_len} ({why})"
    if variant == "vectorized" and 4 * score_bytes(B, H, L, itemsize) > args.max_gib * 2**30:
        return f"skipped: needs > {4 * score_bytes(B, H, L, itemsize) / 2**30:.0f} GiB (4 score tensors)"
    if variant == "auto" and B == 1:
        return "skipped: at B = 1 auto is the vectorized or the chunked row (the rule in kernels/auto.py)"
    if variant == "chunked-t2" and args.threads < 2:
        return "skipped: needs 2 threads"
    if variant.startswith("torch") and not args.torch:
        return "skipped: torch not installed"
    return None


def run(args) -> list[dict]:
    rows = []
    too_slow: dict = {}  # (dtype, E, H, B, variant) -> reason: skip it at the larger L
    for dtype in args.dtypes:
        peak = gemm_peak(dtype, args.threads).gflops
        print(f"{np.dtype(dtype).name}: {gemm_peak(dtype, args.threads).line()}", flush=True)
        for label, B, L, E, H in cases(args):
            for variant in args.variants:
                row = dict(dtype=np.dtype(dtype).name, case=label, B=B, L=L, E=E, H=H, variant=variant, peak=peak)
                reason = skip_reason(variant, B, L, E, H, dtype, args)
                reason = reason or too_slow.get((dtype, E, H, B, variant))
                if reason is None:
                    if variant.startswith("torch"):
                        fwd, fwd_bwd, _, _ = torch_runner(variant, B, L, E, H, dtype)
                    else:
                        fwd, fwd_bwd, *_ = numpy_runner(variant, B, L, E, H, dtype)
                    t0 = time.perf_counter()
                    # a first (warm-up) run: under tracemalloc for NumPy; decides how many repeats fit
                    if variant in NUMPY_VARIANTS and args.memory:
                        mem = numpy_peak_mib(variant, B, L, E, H, dtype, fwd_bwd=fwd_bwd)
                        row["peak_mib"], row["beyond_mib"] = mem["peak"], mem["beyond"]
                    else:
                        fwd_bwd()
                    once = time.perf_counter() - t0
                    reps = max(1, min(args.repeats, int(args.max_seconds / max(once, 1e-9))))
                    row["fwd_s"] = median_time(fwd, reps, warmup=0)
                    row["fwd_bwd_s"] = median_time(fwd_bwd, reps, warmup=0)
                    row["repeats"] = reps
                    for mode, key in (("fwd", "fwd_s"), ("fwd_bwd", "fwd_bwd_s")):
                        row[f"{mode}_gflops"] = flops(B, L, E, H, mode == "fwd_bwd") / row[key] / 1e9
                        row[f"{mode}_pct_peak"] = 100 * row[f"{mode}_gflops"] / peak
                    msg = (
                        f"fwd {row['fwd_s'] * 1e3:9.1f} ms  fwd+bwd {row['fwd_bwd_s'] * 1e3:9.1f} ms  "
                        f"{row['fwd_bwd_gflops']:6.1f} GFLOP/s ({row['fwd_bwd_pct_peak']:4.1f}% peak)"
                    )
                    if "peak_mib" in row:
                        msg += f"  peak {row['peak_mib']:8.1f} MiB"
                else:
                    row["skipped"] = msg = reason
                print(f"  {row['dtype']:<8} {label:<14} L={L:<5} {variant:<11} {msg}", flush=True)
                rows.append(row)
            done = [r for r in rows if (r["dtype"], r["case"], r["L"]) == (row["dtype"], label, L) and "fwd_bwd_s" in r]
            best = min((r["fwd_bwd_s"] for r in done), default=None)
            for r in done:  # a variant this much slower than the best is not run at the larger L
                if r["fwd_bwd_s"] > args.slow_ratio * best and L >= 512:
                    ratio = r["fwd_bwd_s"] / best
                    too_slow[(dtype, E, H, B, r["variant"])] = f"skipped: {ratio:.0f}× the fastest at L={L}"
                elif 4 * r["fwd_bwd_s"] > args.max_projected_seconds:  # L² work: 4× per doubling of L
                    too_slow[(dtype, E, H, B, r["variant"])] = (
                        f"skipped: ~{4 * r['fwd_bwd_s']:.0f} s per run projected from L={L} (time budget)"
                    )
        if args.torch and args.memory:
            for E, H in args.shapes:
                tv = [v for v in args.variants if v == "torch-mha"]
                lengths = [L for L in args.lengths if L <= args.torch_memory_max_len]
                peaks = torch_peaks_mib(tv, 1, lengths, E, H, dtype, args.threads) if tv else {}
                for row in rows:
                    key = f"{row['variant']}/{row['L']}"
                    if row["dtype"] == np.dtype(dtype).name and row["E"] == E and row["B"] == 1 and key in peaks:
                        row["peak_mib"] = peaks[key]
    return rows


def block_sweep(args) -> list[dict]:
    """chunked forward + backward at E=768, H=12, L=2048 (1024 with --quick) over block sizes, with the
    default threads (the main table compares num_threads=1 and 2 at the default block size)."""
    L = 1024 if args.quick else 2048
    out = []
    for dtype in args.dtypes:
        for bs in args.blocks:
            for nt in (min(2, args.threads),):
                _, fwd_bwd, *_ = numpy_runner(f"chunked-t{nt}", 1, L, 768, 12, dtype, block_size=bs)
                t = median_time(fwd_bwd, 1 if args.quick else 2)
                out.append(dict(dtype=np.dtype(dtype).name, L=L, block_size=bs, num_threads=nt, fwd_bwd_s=t,
                                flops=flops(1, L, 768, 12, True), peak=gemm_peak(dtype, args.threads)))  # fmt: skip
                print(f"  block sweep {np.dtype(dtype).name} L={L} block={bs:<5} threads={nt}: {t * 1e3:8.1f} ms")
    return out


def causal_rows(args) -> list[dict]:
    """Forward + backward with a causal mask over the unmasked time, interleaved rounds, float32, L = 4096
    (1024 with --quick): the chunked kernel skips the tiles above the diagonal; torch-mha for reference."""
    L = 1024 if args.quick else 4096
    out = []
    for E, H in args.shapes:
        for variant in ["chunked-t2" if args.threads >= 2 else "chunked-t1"] + (["torch-mha"] if args.torch else []):
            run_ = torch_runner if variant.startswith("torch") else numpy_runner
            fns = {c: run_(variant, 1, L, E, H, np.float32, causal=c)[1] for c in (False, True)}
            t = interleaved(fns, rounds=2 if args.quick else 3)
            ratio, lo, hi = ratio_spread(t[True], t[False])
            out.append(dict(L=L, E=E, H=H, variant=variant, full_ms=1e3 * min(t[False]), causal_ms=1e3 * min(t[True]),
                            ratio=ratio, lo=lo, hi=hi, full_flops=flops(1, L, E, H, True),
                            causal_flops=flops(1, L, E, H, True, causal=True),
                            peak=gemm_peak(np.float32, args.threads)))  # fmt: skip
            print(f"  causal L={L} E={E} H={H} {variant}: {out[-1]['causal_ms']:.0f} ms causal vs "
                  f"{out[-1]['full_ms']:.0f} ms unmasked: {ratio:.2f}× [{lo:.2f}..{hi:.2f}]", flush=True)  # fmt: skip
    return out


def ratio_rows(args) -> list[dict]:
    """The targets' ratios, interleaved: chunked / torch-mha at L = 1024 and 2048 (B = 1, both shapes, both
    dtypes) and auto / torch-mha at the two small batches (float32); 3 rounds each, median and spread."""
    if not args.torch or args.quick:
        return []
    chunked = "chunked-t2" if args.threads >= 2 else "chunked-t1"
    todo = [(dt, (f"E={E} H={H}", 1, L, E, H), chunked) for dt in args.dtypes for E, H in args.shapes
            for L in (1024, 2048)]  # fmt: skip
    todo += [
        (np.dtype(np.float32), c, "auto")
        for c in (("BERT-base B=8", 8, 128, 768, 12), ("MiniLM B=32", 32, 64, 384, 12))
    ]
    out = []
    for dtype, (label, B, L, E, H), ours in todo:
        fns = {
            ours: numpy_runner(ours, B, L, E, H, dtype)[1],
            "torch-mha": torch_runner("torch-mha", B, L, E, H, dtype)[1],
        }
        t = interleaved(fns, rounds=3)
        ratio, lo, hi = ratio_spread(t[ours], t["torch-mha"])
        ms = {name: 1e3 * min(times) for name, times in t.items()}
        out.append(dict(dtype=np.dtype(dtype).name, case=label, B=B, L=L, E=E, H=H, variant=ours, ours_ms=ms[ours],
                        torch_ms=ms["torch-mha"], ratio=ratio, lo=lo, hi=hi, flops=flops(B, L, E, H, True),
                        peak=gemm_peak(dtype, args.threads)))  # fmt: skip
        print(
            f"  ratio {out[-1]['dtype']} {label} L={L} {ours} / torch-mha: {ratio:.2f} [{lo:.2f}..{hi:.2f}]", flush=True
        )
    return out


def memory_target(args) -> dict:
    """chunked forward + backward at B=1, L=16384, E=256, H=4, float32: tracemalloc peak beyond the
    output and gradients (the inputs and parameters exist before tracing starts); by default, with
    ``recompute=True`` (head by head, the cache keeping only the inputs), and ``impl="auto"`` with no other
    argument (its memory budget turns recompute on by itself: kernels/auto.py)."""
    L = 4096 if args.quick else 16384
    variant = "chunked-t2" if args.threads >= 2 else "chunked-t1"
    mem = numpy_peak_mib(variant, 1, L, 256, 4, np.float32)
    lean = numpy_peak_mib(variant, 1, L, 256, 4, np.float32, recompute=True)
    auto = numpy_peak_mib("auto", 1, L, 256, 4, np.float32)  # no flag: the kernel's memory budget decides
    res = dict(L=L, **mem, recompute_peak=lean["peak"], recompute_beyond=lean["beyond"], auto_peak=auto["peak"],
               auto_beyond=auto["beyond"])  # fmt: skip
    res.update(score_tensor_mib=score_bytes(1, 4, L, 4) / MiB)
    if args.torch:  # the same measure for torch: RSS growth minus its output and gradients
        torch_peak = torch_peaks_mib(["torch-mha"], 1, [L], 256, 4, np.float32, args.threads).get(f"torch-mha/{L}")
        if torch_peak is not None:
            kept = (2 * L * 256 + 4 * 256 * 256 + 4 * 256) * 4 / MiB  # output, d query, weight and bias gradients
            res.update(torch_peak=torch_peak, torch_beyond=torch_peak - kept)
            print(
                f"  torch-mha at the same shape: peak RSS growth {torch_peak:.1f} MiB, {torch_peak - kept:.1f} beyond"
            )
    print(
        f"memory target: chunked fwd+bwd at L={L}, E=256, H=4, float32: peak {mem['peak']:.1f} MiB, "
        f"{mem['beyond']:.1f} MiB beyond output and gradients; with recompute=True: peak {lean['peak']:.1f} MiB, "
        f"{lean['beyond']:.1f} MiB beyond; impl='auto' with no flag: peak {auto['peak']:.1f} MiB, "
        f"{auto['beyond']:.1f} MiB beyond; one score tensor: {res['score_tensor_mib']:.0f} MiB"
    )
    return res


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="\n\n".join(__doc__.split("\n\n")[:2]), formatter_class=argparse.RawDescriptionHelpFormatter
    )  # the commands, unwrapped
    p.add_argument("--quick", action="store_true", help="a reduced run that finishes in under a minute")
    p.add_argument("--out", type=Path, default=None, help=f"directory for results.md, results.csv and the plots "
                   f"(default: the scratch folder {SCRATCH.relative_to(ROOT)})")  # fmt: skip
    p.add_argument("--write-results", action="store_true", help=f"write into {COMMITTED.relative_to(ROOT)}/, "
                   "replacing the committed results (a full run only: not with --quick)")  # fmt: skip
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="BLAS and torch threads")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (median)")
    p.add_argument("--lengths", type=int, nargs="+", default=None)
    p.add_argument("--dtypes", nargs="+", default=None, choices=["float32", "float64"])
    p.add_argument("--shapes", nargs="+", default=None, help="E:H pairs, e.g. 768:12 256:4")
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--blocks", type=int, nargs="+", default=None, help="block sizes of the chunked sweep")
    p.add_argument("--naive-max-len", type=int, default=2048, help="skip naive above this L")
    p.add_argument("--max-gib", type=float, default=3.0, help="skip vectorized when 4 score tensors exceed this")
    p.add_argument("--max-seconds", type=float, default=10.0, help="fewer repeats when one run is this slow")
    p.add_argument("--max-projected-seconds", type=float, default=40.0, help="skip when 4× the last L is slower")
    p.add_argument("--slow-ratio", type=float, default=2.5, help="skip a variant at larger L when this much slower")
    p.add_argument("--torch-memory-max-len", type=int, default=4096, help="torch-mha memory only up to this L")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory measurements")
    p.add_argument("--no-peers", dest="peers", action="store_false", help="skip autograd and JAX")
    p.add_argument("--no-bert", dest="bert", action="store_false", help="skip the NumPy BERT against transformers")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="time two checkouts or settings interleaved and print B / A (see bench_compare.py); "
                   "sides: 'impl=chunked,block_size=256', 'DIR', 'DIR@impl=auto', 'torch'")  # fmt: skip
    p.add_argument("--case", nargs="+", default=None, help="--compare cases B:L:E:H:dtype[:causal]")
    p.add_argument("--rounds", type=int, default=5, help="--compare rounds (sides alternate)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="--compare: wall time or CPU time")
    p.add_argument("--torch-memory-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    if args.write_results and (q or args.out is not None):
        p.error("--write-results replaces the committed full-run results: not with --quick or --out")
    args.out = COMMITTED if args.write_results else (args.out or SCRATCH)
    args.repeats = args.repeats or 3
    args.lengths = args.lengths or ([128, 512, 1024] if q else [128, 256, 512, 1024, 2048, 4096, 8192])
    args.dtypes = [np.dtype(d) for d in (args.dtypes or (["float32"] if q else ["float32", "float64"]))]
    args.shapes = [tuple(map(int, s.split(":"))) for s in (args.shapes or (["256:4"] if q else ["768:12", "256:4"]))]
    args.blocks = args.blocks or ([256, 512] if q else [128, 256, 512, 1024])
    args.small_batches = not q
    if q:
        args.naive_max_len, args.max_seconds = min(args.naive_max_len, 512), 2.0
    try:
        import torch

        torch.set_num_threads(args.threads)
        args.torch = True
    except ImportError:
        args.torch = False
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.torch_memory_child:
        print(json.dumps(torch_memory_child(json.loads(args.torch_memory_child))))
        return 0
    if args.compare:
        import bench_compare

        cases = args.case or bench_compare.DEFAULT_CASES
        bench_compare.compare(*args.compare, cases, args.rounds, args.repeats, args.threads, args.clock)
        return 0
    from threadpoolctl import threadpool_limits

    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if var in os.environ:
            print(f"warning: {var}={os.environ[var]} is set and can slow OpenBLAS; see docs/performance.md", flush=True)
    start = time.perf_counter()
    with threadpool_limits(limits=args.threads, user_api="blas"):
        env = environment(args.threads)
        print("\n".join(f"{k}: {v}" for k, v in env.items()), flush=True)
        rows = run(args)
        sweep = block_sweep(args)
        extra = {"ratios": ratio_rows(args), "causal": causal_rows(args)}
        mem = memory_target(args) if args.memory else None
        if args.peers and not args.quick:
            import bench_peers

            print("peers (float64):", flush=True)
            extra["peers"] = bench_peers.run(threads=args.threads)
        if args.bert and args.torch and not args.quick:
            import bench_bert

            print("the NumPy BERT against transformers:", flush=True)
            extra["bert"] = bench_bert.run(threads=args.threads)
    write_outputs(args.out, env, rows, sweep, mem, extra, time.perf_counter() - start)
    print(f"wrote {args.out}/results.md, results.csv, time_vs_L.png, memory_vs_L.png "
          f"in {time.perf_counter() - start:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
