"""The coefficients of ``mha_numpy.models.erf``: near-minimax polynomial fits of erf, computed once.

    python benchmarks/fit_erf.py          # prints the two tables to paste into mha_numpy/models/erf.py

Two pieces of |x| (float32 inputs):

    [0, 1)      erf(x) = x + x · R(x²)           R of degree 6 in s = x², R(0) = 2/√π - 1; float32 coefficients
    [1, 4]      erf(x) = 1 - exp(T(x - 2.5))     T ≈ log erfc, degree 7, float64; |x| is clamped to 4, where
                                                 erf(x) = 1 - 1.5e-8 rounds to 1 in float32

Each fit is Lawson's iteratively reweighted least squares (the weights converge to those of the minimax
solution) on 3000 Chebyshev points, in a basis scaled to [-1, 1] for conditioning, against mpmath's erf at 40
digits, weighted so that what is minimised is erf's relative error; the printed error is that of the final
coefficients (R's rounded to float32, as the code uses them) evaluated by Horner's rule in float64 against
mpmath on 20001 points. Needs mpmath (installed with torch / sympy); the library itself does not.
"""

from __future__ import annotations

import math

import numpy as np

SMALL = (1.0, 6)  # [0, 1), degree 6 in x²
TAIL = (1.0, 4.0, 2.5, 7)  # [start, end], centre, degree in x - centre


def _mp():
    import mpmath

    mpmath.mp.dps = 40
    return mpmath


def _lawson(A: np.ndarray, f: np.ndarray, iterations: int = 100) -> np.ndarray:
    """Weighted least squares of A c ≈ f, reweighted by the error each time (Lawson): -> near-minimax c."""
    w = np.ones(len(f))
    for _ in range(iterations):
        sw = np.sqrt(w)
        c = np.linalg.lstsq(A * sw[:, None], f * sw, rcond=None)[0]
        w = w * np.abs(A @ c - f)
        w = w / w.sum()
    return c


def _chebyshev_points(a: float, b: float, n: int = 3000) -> np.ndarray:
    return (a + b) / 2 + (b - a) / 2 * np.cos(np.pi * (np.arange(n) + 0.5) / n)


def _horner(coefficients, u: np.ndarray) -> np.ndarray:
    p = np.zeros_like(u)
    for c in coefficients[::-1]:
        p = p * u + c
    return p


def _erf(values) -> np.ndarray:
    mp = _mp()
    return np.array([float(mp.erf(mp.mpf(float(v)))) for v in values])


def fit_small(end: float, degree: int):
    """R with erf(x) ≈ x + x R(x²) on [0, end), R(0) = 2/√π - 1, float32 coefficients: -> (R, max rel. error)."""
    mp = _mp()
    c0 = float(np.float32(2 / math.sqrt(math.pi) - 1))
    s = _chebyshev_points(0.0, end * end)
    g = np.array([float(mp.erf(mp.sqrt(v)) / mp.sqrt(v) - 1) for v in s])  # R(s), the target
    h = (g - c0) / s  # (R(s) - c0) / s: the rest of R, of degree - 1
    weight = s / (1 + g)  # an error e in h is an error s e / (1 + R) in erf(x) / erf(x)
    A = np.vander(s / (end * end), degree, increasing=True)
    c = _lawson(A * weight[:, None], h * weight) / (end * end) ** np.arange(degree)
    c = np.concatenate([[c0], c]).astype(np.float32).astype(np.float64)  # as the code holds them
    x = np.linspace(0.0, end, 20001)[1:]
    return c, float(np.max(np.abs((x + x * _horner(c, x * x)) / _erf(x) - 1.0)))


def fit_tail(a: float, b: float, centre: float, degree: int):
    """T with erf(x) ≈ 1 - exp(T(x - centre)) on [a, b] (T ≈ log erfc): -> (T, max relative error of erf)."""
    mp = _mp()
    t = _chebyshev_points(a, b)
    log_erfc = np.array([float(mp.log(mp.erfc(v))) for v in t])
    weight = np.array([float(mp.erfc(v) / mp.erf(v)) for v in t])  # an error e in T is e · erfc/erf in erf, relative
    h = (b - a) / 2
    A = np.vander((t - centre) / h, degree + 1, increasing=True)
    c = _lawson(A * weight[:, None], log_erfc * weight) / h ** np.arange(degree + 1)
    x = np.linspace(a, b, 20001)
    return c, float(np.max(np.abs((1.0 - np.exp(_horner(c, x - centre))) / _erf(x) - 1.0)))


def main() -> None:
    c, err = fit_small(*SMALL)
    print(f"# [0, {SMALL[0]}): erf(x) = x + x R(x²), max relative error {err:.1e} (float32 coefficients)")
    print("SMALL = (" + ", ".join(repr(float(v)) for v in c) + ")")
    c, err = fit_tail(*TAIL)
    print(f"# [{TAIL[0]}, {TAIL[1]}]: erf(x) = 1 - exp(T(x - {TAIL[2]})), max relative error {err:.1e}")
    print(f"TAIL_CENTRE, TAIL = {TAIL[2]!r}, (" + ", ".join(repr(float(v)) for v in c) + ")")


if __name__ == "__main__":
    main()
