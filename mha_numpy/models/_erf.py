"""The error function erf in pure NumPy, accurate to a few ulp in float64.

BERT's GELU is the exact one, gelu(x) = x · Φ(x) = 0.5 · x · (1 + erf(x / √2)), and NumPy has no erf.
``math.erf`` is exact but scalar; the tanh approximation of GELU is off by ~1e-4, far more than the 1e-10
agreement with PyTorch we check in float64. So this is the Cephes rational approximation (S. L. Moshier,
Cephes Math Library, ``ndtr.c``; the same tables SciPy uses), vectorised:

    |x| <= 1 :  erf(x)  = x · T(x²) / U(x²)
    1 < |x|  :  erf(x)  = 1 - erfc(x),   erfc(x) = exp(-x²) · P(|x|) / Q(|x|)  for |x| < 8, R / S beyond,
                erfc(-x) = 2 - erfc(x)

T, P, R are polynomials; U, Q, S are polynomials with an implicit leading coefficient 1.
tests/test_bert.py checks it against ``math.erf`` on a dense grid.
"""

from __future__ import annotations

import numpy as np

_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3, 7.00332514112805075473e3,
      5.55923013010394962768e4)  # fmt: skip
_U = (3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3, 2.26290000613890934246e4,
      4.92673942608635921086e4)  # fmt: skip
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0, 4.86371970985681366614e1,
      1.96520832956077098242e2, 5.26445194995477358631e2, 9.34528527171957607540e2, 1.02755188689515710272e3,
      5.57535335369399327526e2)  # fmt: skip
_Q = (1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2, 9.75708501743205489753e2,
      1.82390916687909736289e3, 2.24633760818710981792e3, 1.65666309194161350182e3,
      5.57535340817727675546e2)  # fmt: skip
_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0, 6.16021097993053585195e0,
      7.40974269950448939160e0, 2.97886665372100240670e0)  # fmt: skip
_S = (2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1, 1.70814450747565897222e1,
      9.60896809063285878198e0, 3.36907645100081516050e0)  # fmt: skip


def _polevl(x: np.ndarray, coefs, leading_one: bool = False) -> np.ndarray:
    """Horner's rule: c0 xⁿ + ... + cn, or xⁿ⁺¹ + c0 xⁿ + ... + cn when ``leading_one``."""
    y = np.ones_like(x) if leading_one else np.zeros_like(x)
    for c in coefs:
        y = y * x + c
    return y


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf(x), computed in float64 and returned in x's floating dtype (float64 if not floating)."""
    x = np.asarray(x)
    out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    x = x.astype(np.float64)
    small = np.clip(x, -1.0, 1.0)  # |x| <= 1 branch, evaluated where it is valid
    z = small * small
    erf_small = small * _polevl(z, _T) / _polevl(z, _U, leading_one=True)
    a = np.clip(np.abs(x), 1.0, 27.0)  # 1 < |x| branch; erfc(27) underflows to 0 in float64
    ratio = np.where(
        a < 8.0,
        _polevl(a, _P) / _polevl(a, _Q, leading_one=True),
        _polevl(a, _R) / _polevl(a, _S, leading_one=True),
    )
    erfc_abs = np.exp(-a * a) * ratio  # erfc(|x|)
    erf_large = np.sign(x) * (1.0 - erfc_abs)  # erf is odd
    return np.where(np.abs(x) <= 1.0, erf_small, erf_large).astype(out_dtype, copy=False)
