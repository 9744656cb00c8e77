"""The four dtypes of the case matrix, by name, and rounding to them in NumPy (bfloat16 without ml_dtypes).

NumPy has float64, float32 and float16; bfloat16 is not a NumPy dtype. Here a bfloat16 array is *held* as a
float32 array whose every entry is a bfloat16 number (``round_to(x, "bfloat16")``: round to nearest, ties to
even, on the top 16 bits of the float32); the adapters hand it to torch or JAX as their bfloat16, and to a
NumPy function as ``ml_dtypes.bfloat16`` when that package is installed (it comes with JAX).
"""

from __future__ import annotations

import numpy as np

DTYPES = ("float64", "float32", "float16", "bfloat16")
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}  # spacing at 1.0
HELD = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.float32}
FINFO_MIN = {"float64": np.finfo(np.float64).min, "float32": float(np.finfo(np.float32).min),
             "float16": float(np.finfo(np.float16).min), "bfloat16": -3.3895313892515355e38}  # fmt: skip


def check_dtype(name) -> str:
    """``name`` as one of ``DTYPES`` (a NumPy dtype is taken by its name), or ValueError naming it."""
    name = getattr(name, "name", name)
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r:.60}")
    return name


def _round_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 number (ties to even), held as float32; NaN stays NaN, overflow is inf."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), np.float32(np.nan), rounded.view(np.float32))


def round_to(x, name: str) -> np.ndarray:
    """``x`` rounded to the dtype ``name``, held as ``HELD[name]`` (a new array)."""
    x = np.asarray(x)
    if name == "bfloat16":
        with np.errstate(over="ignore"):
            return _round_bfloat16(x.astype(np.float32))
    with np.errstate(over="ignore"):
        return x.astype(HELD[name])


def as_numpy_dtype(x: np.ndarray, name: str) -> np.ndarray:
    """A held array as a NumPy array of the dtype itself, for a NumPy function (bfloat16 needs ml_dtypes)."""
    if name != "bfloat16":
        return x
    try:
        import ml_dtypes
    except ModuleNotFoundError:
        raise NotImplementedError("bfloat16 for a NumPy function needs the package ml_dtypes") from None
    return x.astype(ml_dtypes.bfloat16)
