"""Input checks shared by the public API.

Every check raises ``ValueError`` naming the offending argument and its shape *before* any
arithmetic happens, so a user never gets a broadcasting error from deep inside a matmul.
"""

from __future__ import annotations

import numpy as np


def as_float_array(x, name: str, ndim: int | None = None) -> np.ndarray:
    """Return ``x`` as a floating ndarray (no copy when it already is one) or raise ValueError."""
    if x is None:
        raise ValueError(f"{name} must be an array, got None")
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(
            f"{name} must be a floating-point array (float32 or float64), got dtype {arr.dtype} with shape {arr.shape}"
        )
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    return arr


def check_mask(mask, scores_shape: tuple[int, ...], name: str = "mask") -> np.ndarray | None:
    """Validate a mask against the score shape (B, H, Lq, Lk); return it as an ndarray.

    Accepted: ``None``; a boolean array (True = may attend); a floating array added to the scores.
    Integer masks are refused on purpose: 0/1 conventions differ between libraries
    (see ``docs/masks.md``) and must be converted explicitly with ``mha_numpy.masks``.
    """
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != np.bool_ and not np.issubdtype(m.dtype, np.floating):
        raise ValueError(
            f"{name} must be boolean (True = may attend) or floating (added to the scores), "
            f"got dtype {m.dtype} with shape {m.shape}; convert 0/1 masks with mha_numpy.masks "
            "(e.g. padding_mask(attention_mask=...))"
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
    return m


def check_dropout(shape: tuple[int, ...], dropout_p: float, rng, dropout_mask) -> np.ndarray | None:
    """Validate the dropout arguments of an attention forward; return the given keep-mask or None.

    dropout_p must lie in [0, 1); a given ``dropout_mask`` must be boolean with the scores' shape;
    dropout_p > 0 without a mask needs ``rng`` to draw one (which the caller then does).
    """
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_mask is not None:
        keep = np.asarray(dropout_mask)
        if keep.shape != tuple(shape) or keep.dtype != np.bool_:
            raise ValueError(f"dropout_mask must be boolean with shape {tuple(shape)}, got {keep.dtype} {keep.shape}")
        return keep
    if dropout_p > 0.0 and rng is None:
        raise ValueError("dropout with p > 0 needs rng (a numpy.random.Generator) or dropout_mask")
    return None
