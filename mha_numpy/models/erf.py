"""erf for float32 arrays, within 1 ulp of float32 rounding, in NumPy alone: ``erf_float32(x)``.

``scipy.special.erf`` on a float32 array is a scalar loop (each value converted to float64, Cephes' rational
approximation, converted back) at ~15-20 ns a value: a sixth to a quarter of a float32 BERT's inference went
there, in GELU. This module evaluates erf with whole-array NumPy passes (~0.1 ns a value each in float32):

    |x| < 1     erf(x) = x + x · R(x²)          float32; R of degree 6, R(0) = 2/√π - 1: relative error 9.6e-9
    |x| >= 1    erf(x) = ±(1 - exp(T(t - 2.5)))  float64, t = min(|x|, 4), rounded once to float32;
                                                T ≈ log erfc of degree 7, relative error of erf 2.1e-11

Both are near-minimax fits against mpmath, computed once by ``benchmarks/fit_erf.py`` (which prints them).

Why the two halves differ. Below 1 the float32 passes are exact enough: the result is x plus a correction at
most 0.16 · |x|, so every rounding but the last add is shrunk by that factor (the float32 coefficients included:
``fit_erf.py`` checks the fit after rounding them). In the tail erf is 1 minus something small, and float32
polynomials there err by up to 2 ulp (the rounded coefficients alone are ~0.5 ulp off), so the tail is evaluated
in float64, on the gathered tail elements only (a fifth of BERT's GELU inputs), then rounded once.

Exactness (``benchmarks/bench_erf.py`` checks all 2^32 float32 inputs against scipy's erf evaluated in float64
and rounded to float32; ``tests/test_erf.py`` a strided sample and dense runs): at most 1 ulp everywhere, the
correctly rounded value for 94% of the inputs below 1 (a fifth of the float32s just below 1 are the neighbour)
and for 99.98% of those from 1 to 4: 97.1% of all 2^32. The first piece is IEEE multiplies
and adds only, the same bits on every CPU. -0.0 stays -0.0 (x + x · R with x = -0.0), NaN stays NaN (it fails
x² >= 1, so the first piece keeps it), ±inf gives ±1, and erf rounds to ±1 from |x| ≈ 3.92 on (clamped at 4).
"""

from __future__ import annotations

import numpy as np

# Coefficients printed by benchmarks/fit_erf.py (lowest power first).
SMALL = np.array([0.12837916612625122, -0.3761262595653534, 0.11283593624830246, -0.026854107156395912,
                  0.005188813898712397, -0.0008014048798941076, 7.865633233450353e-05], dtype=np.float32)  # fmt: skip
TAIL_CENTRE, TAIL = 2.5, (-7.806815303306008, -5.3526806084377485, -0.9438918241938654, -0.010853502441742765,
                          0.0021664586549779534, -0.0004310067558562218, 6.176448787702963e-05,
                          -2.1697591193839898e-05)  # fmt: skip
TAIL_START, SATURATION = 1.0, 4.0  # the pieces' boundary on |x|; erf(|x| >= 4) rounds to ±1


def small_piece(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x + x · R(x²) ≈ erf(x) for |x| < 1, in float32 (garbage elsewhere): x (...) -> (erf, x²), both fresh."""
    s = x * x  # (...) x², float32
    r = s * SMALL[-1]  # Horner's rule in s, two passes per degree, in place on one fresh array
    for c in SMALL[-2:0:-1]:
        r += c
        r *= s
    r += SMALL[0]  # R(x²)
    r *= x
    r += x  # x + x · R(x²): the one rounding that is not shrunk
    return r, s


def tail_piece(x: np.ndarray) -> np.ndarray:
    """±(1 - exp(T(min(|x|, 4) - 2.5))) ≈ erf(x) for |x| >= 1, in float64: x (m,) float32 -> (m,) float64."""
    t = np.abs(x).astype(np.float64)  # (m,) exactly
    np.minimum(t, SATURATION, out=t)
    t -= TAIL_CENTRE
    q = t * TAIL[-1]
    for c in TAIL[-2:0:-1]:
        q += c
        q *= t
    q += TAIL[0]  # ≈ log erfc(|x|)
    np.exp(q, out=q)  # erfc(|x|)
    np.subtract(1.0, q, out=q)
    return np.copysign(q, x, out=q)  # erf is odd


def erf_float32(x: np.ndarray) -> np.ndarray:
    """erf(x) elementwise for a float32 array, within 1 ulp of scipy's erf rounded to float32.

    x: (...) float32 (any shape, 0-d and empty included, any strides; never modified) -> (...) float32, fresh.
    The first piece sweeps every element; the second only those with |x| >= 1 (x² >= 1: x² rounds monotonically
    and 1 is a float32, so the test is exact), gathered, evaluated and scattered back.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"erf_float32 needs a float32 array x, got dtype {x.dtype} with shape {x.shape}")
    if x.ndim == 0:
        return erf_float32(x.reshape(1)).reshape(())  # the flat indexing below needs an array
    if not x.flags.c_contiguous:
        x = x.copy(order="C")  # so that the fresh arrays below are C-ordered and flat indices mean one thing
    with np.errstate(over="ignore", invalid="ignore"):  # the first piece at huge |x| or inf: replaced below
        out, s = small_piece(x)
    tail = np.flatnonzero(s >= TAIL_START)  # (m,) flat indices into the C-ordered fresh arrays
    if tail.size:
        flat_out = out.reshape(-1)  # (N,) a view: out is fresh and C-contiguous
        flat_out[tail] = tail_piece(x.reshape(-1)[tail])  # rounded to float32 here
    return out
