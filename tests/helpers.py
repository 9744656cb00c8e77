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
