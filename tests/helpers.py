"""Small helpers for the tests (not fixtures: plain functions, imported explicitly)."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy.gradcheck import check_function


def require_torch():
    """Import torch or skip the calling test with a clear reason (a failure under CI)."""
    return pytest.importorskip("torch", reason="torch is not installed: pip install -r requirements-dev.txt")


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if b.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


RTOL_TARGET = 1e-7  # the project's target for the max relative error of a float64 gradient


def grad_check(forward, backward, inputs, names, seed=0, allow_zero=True):
    """Random upstream gradient, analytic backward, central differences; every row <= RTOL_TARGET.

    ``allow_zero=False`` also fails a row whose true gradient is 0 (a check that could not fail there).
    """
    rng = np.random.default_rng(seed)
    out, cache = forward(**inputs)
    d_out = rng.standard_normal(out.shape)
    grads = backward(d_out, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    report = check_function(lambda **kw: forward(**kw)[0], dict(zip(names, grads)), inputs, d_out)
    assert report.passed, str(report)
    for row in report.rows:
        assert (allow_zero or not row.zero_gradient) and row.max_rel_err <= RTOL_TARGET, str(report)
    return report


def cpu_ticks() -> dict[int, int]:
    """{thread id: user + system clock ticks} of every thread of this process (Linux /proc)."""
    import os  # noqa: PLC0415 - only the thread tests need it

    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that just ended
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def helper_share(n: int = 2000) -> float:
    """The share of an (n, n) @ (n, n) float64 product's CPU time spent in threads other than the caller's (BLAS's
    own workers). With BLAS on two threads each computes about half of the product (OpenBLAS cuts it in equal
    parts, so the share does not depend on how busy the machine is: a loaded machine slows both alike); on one
    thread it is 0. Per-thread CPU time sees what a thread count reported by threadpool_info() may not.
    First a pause: after a threaded product OpenBLAS's workers spin for about 0.1 s (OPENBLAS_THREAD_TIMEOUT)
    before they sleep, and that spinning would count as their share of the next product."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    a = np.random.default_rng(0).random((n, n))
    time.sleep(0.5)
    before = cpu_ticks()
    a @ a  # (n, n) @ (n, n) -> (n, n)
    after = cpu_ticks()
    spent = {t: after[t] - before.get(t, 0) for t in after}
    return 1.0 - spent.get(threading.get_native_id(), 0) / max(1, sum(spent.values()))


def alibi_by_hand(H, Lq, Lk):
    """ALiBi (H, Lq, Lk) from the paper: slopes 2^(-8 (h + 1) / H), -m_h |i + (Lk - Lq) - j| (queries last)."""
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    i, j = np.arange(Lq)[:, None] + (Lk - Lq), np.arange(Lk)[None, :]
    return -slopes[:, None, None] * np.abs(i - j)


def rel_bias_by_hand(table, Lq, Lk):
    """T5-style (H, Lq, Lk): table[h, clip(j - i, -R, R) + R]."""
    R = (table.shape[1] - 1) // 2
    rows = [[[table[h, min(max(j - i, -R), R) + R] for j in range(Lk)] for i in range(Lq)] for h in range(len(table))]
    return np.array(rows)
