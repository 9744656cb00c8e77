"""erf_float32 (mha_numpy/models/erf.py) against scipy.special.erf: exactness over every float32, and speed.

    python benchmarks/bench_erf.py                 # the sweep over all 2^32 float32 inputs, then the speed;
                                                   #   writes benchmarks/erf_results.md
    python benchmarks/bench_erf.py --no-sweep      # the speed alone, printed (the results file is left alone)

Exactness: every one of the 2^32 float32 bit patterns (in chunks of 2^22), ours against scipy's erf evaluated in
float64 on the same (exact) value and rounded to float32: the largest distance in float32 ulps, how many are not
the correctly rounded value, and that NaN is NaN exactly where the input is NaN.

Speed: wall time of one call, interleaved rounds in this one process (A, B, A, B, ...: the two see the same
machine), our time over scipy's as the median of the per-round ratios (min..max); erf alone, and GELU's forward
(``layers.gelu_forward`` against the same formula with scipy's erf, as it was before). Each on one thread, and on
two threads at once, each with its own array (``BertModel.__call__`` runs a batch as two bands on two threads:
an erf made of many NumPy calls must not wait for the other thread's, as an earlier blocked version did).
Inputs: BERT's FFN tensor shapes, (2, 256, 1536) and (16, 20, 1536) (all-MiniLM-L6-v2 at 4 × 256 in the two
bands of ``BertModel.__call__``, and 32 × 20), with GELU's input h ~ N(0, 1.1²) so that 80% of erf's argument
h/√2 lies below 1 in magnitude, as measured in that model's inference at 4 × 256; and a wider h ~ N(0, 3²) (36%
below 1), which sends more elements to the tail piece. The process keeps freed memory for the next arrays
(``allocator.keep_freed_memory()``, as bench_bert.py and the command line), so no side pays page faults.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_compare import interleaved, ratio_spread  # noqa: E402

from mha_numpy.allocator import keep_freed_memory  # noqa: E402
from mha_numpy.models import layers as LY  # noqa: E402
from mha_numpy.models.erf import erf_float32  # noqa: E402
from mha_numpy.threads import run_items  # noqa: E402

SHAPES = [(2, 256, 1536), (16, 20, 1536)]
SCALES = [1.1, 3.0]  # the standard deviation of GELU's input h
CHUNK = 1 << 22


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float32 ulps (+0 and -0 one value); pairs of NaN count 0."""

    def ordered(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.where(np.isnan(a) & np.isnan(b), 0, np.abs(ordered(a) - ordered(b)))


def sweep() -> dict:
    """Every float32 input: -> {max_ulp, not_rounded, nan_mismatch, worst (x, ours, scipy's), seconds}."""
    from scipy.special import erf as scipy_erf

    t0 = time.perf_counter()
    worst, max_ulp, not_rounded, nan_mismatch = None, -1, 0, 0
    for start in range(0, 1 << 32, CHUNK):
        x = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
        with np.errstate(invalid="ignore"):
            ours, ref = erf_float32(x), scipy_erf(x.astype(np.float64)).astype(np.float32)
        nan_mismatch += int(np.count_nonzero(np.isnan(ours) != np.isnan(x)))
        d = ulps(ours, ref)
        not_rounded += int(np.count_nonzero(d))
        i = int(np.argmax(d))
        if d[i] > max_ulp:
            max_ulp, worst = int(d[i]), (float(x[i]), float(ours[i]), float(ref[i]))
        if (start // CHUNK) % 128 == 127:
            print(f"  sweep {100 * (start + CHUNK) / 2**32:3.0f}%: max {max_ulp} ulp, {not_rounded} not correctly "
                  f"rounded so far", flush=True)  # fmt: skip
    return {"max_ulp": max_ulp, "not_rounded": not_rounded, "nan_mismatch": nan_mismatch, "worst": worst,
            "seconds": time.perf_counter() - t0}  # fmt: skip


def old_gelu(x: np.ndarray) -> np.ndarray:
    """GELU's forward as it was: layers.gelu_forward's formula with scipy's erf."""
    from scipy.special import erf as scipy_erf

    return x * (0.5 * (1.0 + scipy_erf(x / math.sqrt(2.0))))


def on_threads(fn, arrays):
    """One call of fn per array, each on its own thread of the library's pool, all at once (as a BERT call runs
    its bands): -> a function of no argument."""
    return lambda: run_items(fn, arrays, len(arrays))


def speed(rounds: int) -> list[dict]:
    from scipy.special import erf as scipy_erf

    rows = []
    for shape in SHAPES:
        for scale in SCALES:
            rng = np.random.default_rng(0)
            hs = [(rng.standard_normal(shape) * scale).astype(np.float32) for _ in range(2)]  # one per thread
            xs = [h / np.float32(math.sqrt(2.0)) for h in hs]  # erf's argument inside GELU
            below = float(np.mean(np.abs(xs[0]) < 1))
            for what, ours, theirs, args in [("erf", erf_float32, scipy_erf, xs),
                                             ("GELU forward", LY.gelu, old_gelu, hs)]:  # fmt: skip
                for threads in (1, 2):
                    if threads == 1:
                        fns = {"ours": lambda f=ours, a=args[0]: f(a), "scipy": lambda f=theirs, a=args[0]: f(a)}
                    else:
                        fns = {"ours": on_threads(ours, args), "scipy": on_threads(theirs, args)}
                    t = interleaved(fns, rounds)
                    med, lo, hi = ratio_spread(t["ours"], t["scipy"])
                    n = args[0].size * threads
                    ns = {name: 1e9 * min(seconds) / n for name, seconds in t.items()}  # the fastest round
                    row = {"what": what, "shape": shape, "scale": scale, "below_1": below, "threads": threads,
                           "ratio": (med, lo, hi), "ours_ns": ns["ours"], "scipy_ns": ns["scipy"]}  # fmt: skip
                    print(f"  {what:12s} {shape} h ~ N(0, {scale}²) {threads} thread(s): ours {row['ours_ns']:.1f} "
                          f"ns/value, scipy {row['scipy_ns']:.1f}; ours/scipy {med:.2f} ({lo:.2f}..{hi:.2f})",
                          flush=True)  # fmt: skip
                    rows.append(row)
    return rows


def markdown(result: dict | None, rows: list[dict], loads: tuple[str, str], rounds: int) -> str:
    import scipy

    machine = platform.processor() or platform.machine()
    lines = ["# erf_float32 against scipy.special.erf", "",
             f"`python benchmarks/bench_erf.py` on {machine}, NumPy {np.__version__}, SciPy {scipy.__version__}; "
             f"load average {loads[0]} before, {loads[1]} after.", ""]  # fmt: skip
    if result is not None:
        x, ours, ref = result["worst"]
        lines += ["## Every float32 input (2^32 bit patterns)", "",
                  f"- largest error: **{result['max_ulp']} ulp** of float32 against scipy's erf in float64 rounded "
                  f"to float32 (e.g. x = {x!r}: ours {ours!r}, scipy's {ref!r})",
                  f"- not the correctly rounded value: **{result['not_rounded']}** of 4294967296",
                  f"- NaN where the input is not NaN, or not NaN where it is: {result['nan_mismatch']}",
                  f"- the sweep took {result['seconds']:.0f} s", ""]  # fmt: skip
    lines += [f"## Speed: one call, {rounds} interleaved rounds, ours / scipy (median of the ratios, min..max)", "",
              "| what | shape | h | \\|h/√2\\| < 1 | threads | ours ns/value | scipy ns/value | ours / scipy |",
              "|---|---|---|---|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        med, lo, hi = r["ratio"]
        lines.append(f"| {r['what']} | {r['shape']} | N(0, {r['scale']}²) | {100 * r['below_1']:.0f}% | "
                     f"{r['threads']} | "
                     f"{r['ours_ns']:.1f} | {r['scipy_ns']:.1f} | {med:.2f} ({lo:.2f}..{hi:.2f}) |")  # fmt: skip
    lines += ["", "ns/value: the fastest round's time over the number of values (on two threads: over both arrays'"
              " values). GELU forward: `layers.gelu_forward` (float32, erf_float32 inside) against the same formula"
              " with scipy's erf.", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-sweep", action="store_true", help="only the speed; print, write nothing")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    keep_freed_memory()  # as bench_bert.py and the command line: fresh arrays reuse freed memory, no page faults
    load_before = " ".join(f"{v:.2f}" for v in os.getloadavg())
    result = None if args.no_sweep else sweep()
    if result:
        print(f"sweep: max {result['max_ulp']} ulp, {result['not_rounded']} not correctly rounded, "
              f"{result['nan_mismatch']} NaN mismatches, {result['seconds']:.0f} s", flush=True)  # fmt: skip
    rows = speed(args.rounds)
    loads = (load_before, " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"load average {loads[0]} before, {loads[1]} after")
    if result:
        (ROOT / "benchmarks" / "erf_results.md").write_text(markdown(result, rows, loads, args.rounds))
        print("wrote benchmarks/erf_results.md")


if __name__ == "__main__":
    main()
