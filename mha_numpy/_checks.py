"""Input checks shared by the public API.

Every check raises ``ValueError`` naming the offending argument and its shape *before* any
arithmetic happens, so a user never gets a broadcasting error from deep inside a matmul.
"""

from __future__ import annotations

import math
import operator

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # float16, longdouble: refused (no BLAS)


def as_float_array(x, name: str, ndim: int | None = None) -> np.ndarray:
    """Return ``x`` as a floating ndarray (no copy when it already is one) or raise ValueError."""
    if x is None:
        raise ValueError(f"{name} must be an array, got None")
    arr = as_array(x, name)
    if arr.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{name} must be a floating-point array (float32 or float64), got dtype {arr.dtype} with shape {arr.shape}"
        )
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    return arr


def check_mask(
    mask, scores_shape: tuple[int, ...], name: str = "mask", allow_bool: bool = True, dtype=None
) -> np.ndarray | None:
    """Validate a mask against the score shape (B, H, Lq, Lk); return it as an ndarray.

    Accepted: ``None``; a boolean array (True = may attend); a floating array added to the scores.
    Integer masks are refused on purpose: 0/1 conventions differ between libraries
    (see ``docs/masks.md``) and must be converted explicitly with ``mha_numpy.masks``.
    ``allow_bool=False`` (for a score bias) accepts floating arrays only, and with ``dtype`` (that of q, k, v) only
    in that dtype: a bias is differentiated, and its gradient would come back in another dtype than the call's.
    """
    if mask is None:
        return None
    m = as_array(mask, name)
    if not (m.dtype in FLOAT_DTYPES or (allow_bool and m.dtype == np.bool_)):
        kinds = "boolean (True = may attend) or floating (added to the scores)" if allow_bool else "float32 or float64"
        raise ValueError(
            f"{name} must be {kinds}, got dtype {m.dtype} with shape {m.shape}"
            + ("; convert 0/1 masks with mha_numpy.masks (e.g. padding_mask(attention_mask=...))" if allow_bool else "")
        )
    try:
        broadcast = np.broadcast_shapes(m.shape, scores_shape)
    except ValueError:
        broadcast = None
    if broadcast != tuple(scores_shape):
        raise ValueError(
            f"{name} with shape {m.shape} does not broadcast to the scores' shape "
            f"(B, H, Lq, Lk) = {tuple(scores_shape)}"
        )
    if dtype is not None and not allow_bool and m.dtype != dtype:
        raise ValueError(
            f"{name} has dtype {m.dtype} (shape {m.shape}) but q, k, v are {np.dtype(dtype)}; "
            f"convert it with .astype(np.{np.dtype(dtype).name})"
        )
    return m


def check_dropout(shape: tuple[int, ...], dropout_p: float, rng, dropout_mask) -> np.ndarray | None:
    """Validate the dropout arguments of an attention forward; return the given keep-mask or None.

    dropout_p must lie in [0, 1); a given ``dropout_mask`` must be boolean with the scores' shape;
    dropout_p > 0 without a mask needs ``rng`` to draw one (which the caller then does).
    """
    check_probability(dropout_p, "dropout_p")
    if dropout_mask is not None:
        keep = as_array(dropout_mask, "dropout_mask")
        if keep.shape != tuple(shape) or keep.dtype != np.bool_:
            raise ValueError(f"dropout_mask must be boolean with shape {tuple(shape)}, got {keep.dtype} {keep.shape}")
        return keep
    if dropout_p > 0.0 and rng is None:
        raise ValueError("dropout with p > 0 needs rng (a numpy.random.Generator) or dropout_mask")
    return None


def check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv) as floating arrays of one dtype, or ValueError."""
    q = as_float_array(q, "q", ndim=4)
    k = as_float_array(k, "k", ndim=4)
    v = as_float_array(v, "v", ndim=4)
    if q.shape[:2] != k.shape[:2] or q.shape[:2] != v.shape[:2]:
        raise ValueError(f"q, k, v must share (B, H): got q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dim d: got q {q.shape}, k {k.shape}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length Lk: got k {k.shape}, v {v.shape}")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k have head dim d = 0 (q {q.shape}): the scale 1/sqrt(d) is undefined")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype: got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    return q, k, v


def default_scale(head_dim: int, scale=None) -> float:
    """The score scale: 1/sqrt(d) unless given. A Python float, so float32 scores stay float32."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ValueError(f"scale must be a number or None, got {scale!r}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale!r}")
    return float(scale)


def as_generator(rng, name: str = "rng") -> np.random.Generator:
    """An int seed, None or a numpy Generator -> a Generator; anything else is a ValueError naming ``name``."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0):
        return np.random.default_rng(rng)
    raise ValueError(f"{name} must be None, a non-negative int seed or a numpy.random.Generator, got {rng!r}")


def check_probability(p, name: str) -> float:
    """A dropout probability in [0, 1) as a float, or ValueError naming ``name``."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1) (a number), got {p!r}")
    return float(p)


def as_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """float32 or float64 (anything ``np.dtype`` reads as one) as an ``np.dtype``, or ValueError naming ``name``."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"{name} must be np.float32 or np.float64, got {dtype!r}") from None
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be np.float32 or np.float64, got {dtype}")
    return dtype


def check_like(grad, name: str, shape: tuple[int, ...], dtype, like: str) -> np.ndarray:
    """An upstream gradient ``name`` with exactly the ``shape`` and ``dtype`` of what it is the gradient of (``like``):
    no silent broadcast, no dtype mix."""
    grad = np.asarray(grad)
    if grad.shape != tuple(shape) or grad.dtype != dtype:
        raise ValueError(
            f"{name} must have the shape {tuple(shape)} and dtype {np.dtype(dtype)} of {like}, "
            f"got shape {grad.shape} and dtype {grad.dtype}"
        )
    return grad


def check_d_context(d_context, shape: tuple[int, ...], dtype) -> np.ndarray:
    """d_context must have the context's shape and dtype (no silent broadcast, no dtype mix)."""
    d_context = as_float_array(d_context, "d_context", ndim=4)
    if d_context.shape != tuple(shape) or d_context.dtype != dtype:
        raise ValueError(
            f"d_context has shape {d_context.shape} and dtype {d_context.dtype}; expected {tuple(shape)} and "
            f"{np.dtype(dtype)} like the context"
        )
    return d_context


def check_d_lse(d_lse, shape: tuple[int, ...], dtype) -> np.ndarray | None:
    """None, or the gradient of a kernel's lse (B, H, Lq): exactly that shape (no silent broadcast), float32 or float64
    (the lse is float64, the kernel's arithmetic in ``dtype``) -> as ``dtype``."""
    if d_lse is None:
        return None
    d_lse = as_float_array(d_lse, "d_lse")
    if d_lse.shape != tuple(shape):
        raise ValueError(f"d_lse has shape {d_lse.shape}; expected {tuple(shape)} (B, H, Lq) like the lse")
    return d_lse.astype(dtype, copy=False)


def as_int(value, name: str, minimum: int | None = None) -> int:
    """An integer argument as a Python int, or ValueError naming ``name``.

    Accepted: an int, a NumPy integer, a 0-d integer array. Refused: bools (``True`` is not a size), floats even
    when whole (``2.0``: an int was meant, or a computation went wrong), strings, None. ``minimum``: 1 for a size,
    0 for a count that may be empty, None for an offset of any sign.
    """
    kind = {None: "an int", 0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be {kind}, got the bool {value!r}")
    try:
        n = operator.index(value)  # int, np.integer and 0-d integer arrays; floats and strings raise TypeError
    except TypeError:
        raise ValueError(f"{name} must be {kind}, got {value!r:.60} of type {type(value).__name__}") from None
    if minimum is not None and n < minimum:
        raise ValueError(f"{name} must be {kind}, got {n}")
    return n


def as_number(value, name: str, minimum: float | None = None, positive: bool = False) -> float:
    """A finite real number (int or float, NumPy's too; not a bool, not a string) as a Python float, at least
    ``minimum`` or, with ``positive``, above 0; otherwise ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r:.60} of type {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x) or (positive and not x > 0) or (minimum is not None and not x >= minimum):
        bound = " > 0" if positive else (f" >= {minimum}" if minimum is not None else "")
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return x


def as_bool(value, name: str) -> bool:
    """A flag (bool or NumPy bool) as a Python bool; 0, 1, "yes" or None are refused (ValueError naming ``name``)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r:.60} of type {type(value).__name__}")
    return bool(value)


def as_array(x, name: str) -> np.ndarray:
    """``np.asarray(x)`` with NumPy's own errors (a ragged nested list, an object that is not array-like) turned
    into a ValueError naming ``name``."""
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{name} is not a rectangular array ({type(x).__name__}): {e}") from None


def positive_int_or_none(value, name: str) -> int | None:
    """A positive int (e.g. ``num_threads``, ``block_size``), or None for "the default"."""
    return None if value is None else as_int(value, name, minimum=1)
