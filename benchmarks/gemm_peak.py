"""The distance to the physical limit: this machine's GEMM peak, measured in the run that uses it, and the share
of it a measured time reaches. Every "% peak" column of every benchmark table comes from here.

    peak = gemm_peak("float32", threads=2)   # measured once per run, dtype and thread count (then remembered)
    share(flops, seconds, peak)              # 100 · flops / seconds / (peak.gflops · 1e9): percent of the peak
    peak.line()                              # "GEMM peak 196.0 GFLOP/s (float32, 2 threads, ...)" above a table

The peak is the best of ``repeats`` (n × n) @ (n × n) products (2·n³ FLOPs each, n = 2048 by default) in NumPy's
own BLAS, its threads set to ``threads`` through threadpoolctl: the rate a program made of large products could
reach here. A kernel's share is its *useful* FLOPs (``flops.py``: the same count for ours and for torch in a row)
over its time, divided by that rate. torch links its own BLAS (MKL or OpenBLAS), so a torch row can pass 100%.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Peak:
    """A measured GEMM rate: GFLOP/s of (n × n) @ (n × n) in ``dtype`` with ``threads`` BLAS threads."""

    gflops: float
    dtype: str
    threads: int
    n: int = 2048
    repeats: int = 5

    def line(self) -> str:
        """One sentence for the header of a table: the peak, the dtype, the threads and how it was measured."""
        return (f"GEMM peak {self.gflops:.1f} GFLOP/s ({self.dtype}, {self.threads} BLAS thread"
                f"{'s' if self.threads != 1 else ''}; the best of {self.repeats} ({self.n} × {self.n}) @ "
                f"({self.n} × {self.n}) NumPy products, 2·n³ FLOPs each, measured in this run)")  # fmt: skip


_MEASURED: dict[tuple, Peak] = {}  # one measurement per run, dtype, threads and size


def gemm_peak(dtype, threads: int, n: int = 2048, repeats: int = 5) -> Peak:
    """This machine's GEMM rate in ``dtype`` at ``threads`` BLAS threads, measured on the first call of the run."""
    key = (np.dtype(dtype).name, int(threads), n, repeats)
    if key not in _MEASURED:
        from threadpoolctl import threadpool_limits

        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
        with threadpool_limits(limits=int(threads), user_api="blas"):
            a @ b  # warm-up: (n, n) @ (n, n) -> (n, n)
            best = float("inf")
            for _ in range(repeats):  # a peak: the best run, not the median
                t0 = time.perf_counter()
                a @ b  # (n, n) @ (n, n) -> (n, n)
                best = min(best, time.perf_counter() - t0)
        _MEASURED[key] = Peak(2.0 * n**3 / best / 1e9, key[0], key[1], n, repeats)
    return _MEASURED[key]


def share(flops: float, seconds: float, peak: Peak | float) -> float:
    """Percent of the GEMM peak that ``flops`` useful FLOPs done in ``seconds`` reach (peak: a Peak or GFLOP/s)."""
    gflops = peak.gflops if isinstance(peak, Peak) else float(peak)
    return 100.0 * flops / seconds / (gflops * 1e9)


def pct(flops: float | None, seconds: float | None, peak: Peak | float | None) -> str:
    """``share`` as a table cell: '71%', '3.4%', '0.052%' (two significant digits below 10%); empty when something
    is missing (a skipped row)."""
    if flops is None or not seconds or peak is None:
        return ""
    return percent(share(flops, seconds, peak))


def percent(s: float | None) -> str:
    """A share in percent as a cell: '71%', '3.4%', '0.052%'; '' for None."""
    if s is None:
        return ""
    return f"{s:.0f}%" if s >= 10 else f"{s:.1f}%" if s >= 1 else f"{s:.2g}%"


def peak_lines(rows, what: str = "benchmarks/flops.py") -> list[str]:
    """The lines above a table: each distinct ``Peak`` its rows (their ``"peak"``) divide by, then a blank line."""
    peaks = list(dict.fromkeys(r["peak"] for r in rows if isinstance(r.get("peak"), Peak)))
    lines = [f"% peak = useful FLOPs ({what}) / time / {p.line()}." for p in peaks]
    return [*lines, ""] if lines else []
