"""Compare a student's arrays with the expected ones, and name the known bug they match.

``compare`` judges a whole tensor by its absolute error against the largest expected entry of the
case (a quantity that is zero in theory is never judged against its own rounding noise);
``matching_bug`` runs every buggy variant of ``bugs.BUGS`` for the function on the same inputs and
returns the one the student's output reproduces, among those that differ from the correct answer there;
``crash_bug`` names the variant that raises the error the student's function raised.
"""

from __future__ import annotations

import numpy as np

from . import bugs

RTOL = 1e-6  # max |got - expected| / (largest |expected| of the case); float64 round-off is ~1e-15


def scale_of(arrays) -> float:
    """The largest finite |entry| over ``arrays`` (1.0 if there is none): the yardstick for every error."""
    finite = [np.abs(a[np.isfinite(a)]).max() for a in map(np.asarray, arrays) if np.isfinite(a).any() and a.size]
    return float(max(finite, default=0.0)) or 1.0


def compare(name: str, got, expected, scale: float, rtol: float = RTOL) -> str | None:
    """None when ``got`` matches ``expected`` to rtol·scale (NaN only where ``expected`` is NaN), else one line."""
    expected = np.asarray(expected, dtype=np.float64)
    if got is None:
        return f"{name}: returned None, expected shape {expected.shape}"
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"{name}: shape {got.shape}, expected {expected.shape}"
    if not np.issubdtype(got.dtype, np.number):
        return f"{name}: dtype {got.dtype}, expected a float array"
    with np.errstate(invalid="ignore"):
        return _worst(name, got.astype(np.float64), expected, scale, rtol)


def _worst(name, got, expected, scale, rtol):
    both_nan = np.isnan(got) & np.isnan(expected)
    err = np.where(both_nan, 0.0, np.abs(got - expected))
    err = np.where(np.isnan(err), np.inf, err)  # NaN on one side only: the worst possible error
    err = np.where(np.isinf(got) & (got == expected), 0.0, err)  # -inf where -inf is expected (a masked score)
    if not err.size or err.max() <= rtol * scale:
        return None
    i = np.unravel_index(np.argmax(err), err.shape)
    idx = tuple(int(j) for j in i)
    head = f"{name} {got.shape}: worst at {idx}, got {got[i]:.6g}, expected {expected[i]:.6g}"
    if np.isinf(err[i]):
        nan = np.isnan(got) != np.isnan(expected)
        return f"{head} ({int(nan.sum())} entries NaN on one side only, or infinite)"
    return f"{head} (max abs err {err.max():.1e}, {err.max() / scale:.1e} of the largest entry)"


def matches(got: dict, variant: dict, scale: float) -> bool:
    """True when every array in ``got`` equals the variant's array of the same name (same shape, same NaNs);
    None (a gradient not returned) equals None only."""
    common = [n for n in got if n in variant]
    return bool(common) and all(_same(n, got[n], variant[n], scale) for n in common)


def _same(name: str, got, variant, scale: float) -> bool:
    if got is None or variant is None:
        return got is None and variant is None
    return compare(name, got, variant, scale) is None


def matching_bug(function: str, got: dict, run_variant, scale: float, expected: dict) -> bugs.Bug | None:
    """The first bug of ``function`` whose output (``run_variant(bug) -> dict``) the student's ``got`` reproduces.

    Only a variant that differs from ``expected`` (the correct answer) on this case can be named: one that equals
    it here (a mask leak where nothing is masked) tells nothing about the student's mistake.
    """
    for bug in bugs.for_function(function):
        try:
            with np.errstate(all="ignore"):
                variant = run_variant(bug)
        except Exception:  # noqa: BLE001 - a variant undefined on this case (e.g. Sᵀ with Lq != Lk) matches nothing
            continue
        if matches(got, variant, scale) and not matches(expected, variant, scale):
            return bug
    return None


def crash_bug(function: str, same_error, run_variant) -> bugs.Bug | None:
    """The first bug of ``function`` known by its error (``Bug.by_error``) whose variant raises, on the same inputs,
    the error the student's function raised (``same_error(variant's exception)`` says whether it is that one).

    NumPy's message for ``k.T @ q`` on 4-D arrays names shapes, not the transpose; the same message from the
    variant that wrote ``.T`` names the mistake. A variant that does not raise here matches nothing.
    """
    for bug in (b for b in bugs.for_function(function) if b.by_error):
        try:
            with np.errstate(all="ignore"):
                run_variant(bug)
        except Exception as exc:  # noqa: BLE001 - the variant's crash is what is compared
            if same_error(exc):
                return bug
    return None
