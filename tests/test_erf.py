"""erf_float32 (models/erf.py) against scipy.special.erf evaluated in float64 and rounded to float32 (within 1
ulp): a strided sample of all 2^32 float32 bit patterns, dense runs at every boundary of its pieces, special
values, dtypes, shapes and strides; and GELU in float32 (which uses it) against the float64 GELU. The sweep over
every float32 input is benchmarks/bench_erf.py's (its result: benchmarks/erf_results.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf as scipy_erf

from mha_numpy.models import erf as E
from mha_numpy.models import layers as LY

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_erf import ulps  # noqa: E402  (|a - b| in float32 ulps: the sweep's measure, one definition)


def float32_run(centre: float, n: int) -> np.ndarray:
    """The 2n consecutive float32 values around ``centre`` (n below, n from it up), both signs."""
    i = np.array(centre, dtype=np.float32).view(np.int32) + np.arange(-n, n, dtype=np.int32)
    pos = i[i >= 0].view(np.float32)
    return np.concatenate([pos, -pos])


def reference(x: np.ndarray) -> np.ndarray:
    """scipy's erf in float64 on the (exact) float64 copy of x, rounded once to float32."""
    return scipy_erf(x.astype(np.float64)).astype(np.float32)


def test_a_strided_sample_of_all_float32_inputs_is_within_one_ulp_and_almost_all_correctly_rounded():
    bits = np.arange(0, 2**32, 997, dtype=np.uint64).astype(np.uint32)  # 4.3M patterns: every sign and exponent
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore"):  # NaN patterns
        ours, ref = E.erf_float32(x), reference(x)
    assert np.array_equal(np.isnan(ours), np.isnan(x))
    d = ulps(ours, ref)
    assert d.max() <= 1
    assert np.count_nonzero(d) <= 0.05 * d.size  # almost always the rounded value: 2.9% are not in the full sweep


@pytest.mark.parametrize(
    "centre",
    [0.0, 1e-30, E.TAIL_START, 3.9, E.SATURATION, 0.5, 0.99, 2.5],
    ids=["zero", "tiny", "boundary", "rounds-to-1", "clamp", "0.5", "0.99", "2.5"],
)
def test_dense_runs_at_the_boundaries_and_the_saturation_point(centre):
    x = float32_run(centre, 50_000)
    d = ulps(E.erf_float32(x), reference(x))
    assert d.max() <= 1  # faithful (just below 1, where the correction x·R is largest, a fifth are the neighbour)


def test_saturation_and_tiny_values():
    x = float32_run(3.9, 100_000)  # erf(x) reaches 1 - 2^-25, the midpoint below 1, at x ≈ 3.9192
    ours = E.erf_float32(x)
    assert ulps(ours, reference(x)).max() <= 1
    far, near = np.abs(x) >= 3.92, np.abs(x) < 3.919
    assert np.all(ours[far] == np.sign(x[far])) and np.all(np.abs(ours[near]) < 1)
    assert np.all(E.erf_float32(np.array([4.0, 10.0, 1e30, np.finfo(np.float32).max], np.float32)) == 1.0)
    tiny = np.array([1e-45, 1e-40, 1.17549435e-38, 1e-20, 1e-8], np.float32)  # subnormals included
    expect = (tiny.astype(np.float64) * (2 / np.sqrt(np.pi))).astype(np.float32)  # erf(x) = 2x/√π + O(x³)
    assert ulps(E.erf_float32(tiny), expect).max() <= 1 and ulps(E.erf_float32(-tiny), -expect).max() <= 1
    assert np.array_equal(E.erf_float32(-tiny), -E.erf_float32(tiny))  # odd, bit for bit


def test_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0], np.float32)
    y = E.erf_float32(x)
    assert y[0] == 0 and not np.signbit(y[0]) and y[1] == 0 and np.signbit(y[1])  # -0.0 stays -0.0
    assert y[2] == 1.0 and y[3] == -1.0
    assert np.isnan(y[4]) and np.isnan(y[5])
    assert np.array_equal(y[6:], reference(x[6:]))


def test_dtype_shapes_strides_and_the_input_is_not_mutated():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 7, 40)) * 2).astype(np.float32)  # a third of it in the tail piece
    keep = x.copy()
    for view in (x, x[:, ::2, 1::3], x.transpose(2, 0, 1), x[0, 0, 5], x[:0], np.array(1.7, np.float32)):
        y = E.erf_float32(view)
        assert y.dtype == np.float32 and y.shape == np.shape(view)
        assert np.array_equal(y, E.erf_float32(np.array(view, order="C")))  # the same bits for any layout
        assert y.size == 0 or ulps(y, reference(np.asarray(view))).max() <= 1
    assert np.array_equal(x, keep)
    with pytest.raises(ValueError, match="float32.*float64"):
        E.erf_float32(np.zeros(3))


def test_layers_erf_dispatches_float32_to_the_fast_one_and_float64_to_scipy(monkeypatch):
    x = np.linspace(-5, 5, 1001)
    calls = []
    monkeypatch.setattr(LY, "erf_float32", lambda v: calls.append(v.dtype) or E.erf_float32(v))
    assert LY.gelu(x.astype(np.float32)).dtype == np.float32 and calls == [np.float32]  # GELU goes through it
    assert LY.erf(x).dtype == np.float64 and np.array_equal(LY.erf(x), scipy_erf(x))  # float64 keeps scipy's


def test_float32_gelu_against_the_float64_gelu_rounded():
    bits = np.arange(0, 2**32, 4093, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 1e30)]
    x64 = x.astype(np.float64)
    exact = 0.5 * x64 * (1 + scipy_erf(x64 / np.sqrt(2)))  # float64 GELU of the same inputs
    g = LY.gelu(x)
    assert g.dtype == np.float32
    # x >= -1: Φ(x) >= 0.16, no cancellation in 1 + erf: within 2 ulp of the float64 GELU rounded
    ok = x >= -1
    assert ulps(g[ok], exact[ok].astype(np.float32)).max() <= 2
    # below, 1 + erf cancels in float32 (as in torch's float32 GELU): within 4 ulps of |x|
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(g - exact) <= 4 * eps * np.abs(x64) + 1e-44)
