"""Mask converters for torch tensors at the edge: each framework's convention <-> ours, via ``mha_numpy.masks``.

Ours: bool True = may attend, or a float added to the scores. torch MHA: bool True = ignore. SDPA: bool
True = attend (ours). Hugging Face: ``attention_mask`` 1 = keep, or a 4-D additive extended mask.
The ``from`` side takes tensors or arrays; the ``to`` side returns torch tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from .._checks import as_array, as_int
from ._lazy import require as _require
from ._lazy import to_numpy as _to_numpy

if TYPE_CHECKING:  # for the annotations only: never imported at run time here
    import torch


def mask_from_torch_mha(key_padding_mask=None, attn_mask=None, num_heads: int | None = None) -> np.ndarray | None:
    """torch MHA masks (bool True = **ignore**, or float added) -> one mask of ours (True = may attend).

    key_padding_mask (B, Lk); attn_mask (Lq, Lk) or (B*H, Lq, Lk) (needs ``num_heads``). Tensors or arrays.
    """
    parts = []
    if key_padding_mask is not None:
        parts.append(M.from_torch_key_padding_mask(_to_numpy(key_padding_mask, "key_padding_mask")))  # (B, 1, 1, Lk)
    if attn_mask is not None:
        parts.append(M.from_torch_attn_mask(_to_numpy(attn_mask, "attn_mask"), num_heads))  # (Lq, Lk) or (B, H, Lq, Lk)
    return M.combine_masks(*parts)


def mask_to_torch_mha(
    mask, batch_size: int, num_heads: int, query_len: int | None = None, key_len: int | None = None, dtype=None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Our mask -> ``(key_padding_mask, attn_mask)`` torch tensors that ``torch.nn.MultiheadAttention`` accepts.

    ``mask``: bool (True = may attend) or float (added), any shape that broadcasts to (B, H, Lq, Lk).
    A key padding mask (..., 1, 1, Lk) becomes ``key_padding_mask`` (B, Lk); a mask shared by the batch and
    the heads becomes a 2-D ``attn_mask`` (Lq, Lk); anything else a (B*H, Lq, Lk) ``attn_mask``. Size-1
    dimensions are expanded to the exact shapes torch requires (it accepts no other): ``query_len`` / ``key_len``
    are needed when the mask broadcasts along them (a per-head key mask (B, H, 1, Lk) needs ``query_len``), and
    a ValueError names the one missing; otherwise they default to the mask's own size. Bool True = may attend
    becomes True = ignore; float masks are kept, cast to ``dtype`` when given (torch wants the query's dtype).
    Integer masks are refused (torch refuses them too; convert 0/1 masks with ``mha_numpy.masks``).
    """
    torch = _require("torch")
    if mask is None:
        return None, None
    m, full = _checked_mask(mask, batch_size, num_heads, query_len, key_len, dtype)
    if m.shape[1:3] == (1, 1):  # a key padding mask
        kpm = M.to_torch_key_padding_mask(np.broadcast_to(m[:, 0, 0, :], (full[0], full[3])))  # (B, Lk)
        return torch.from_numpy(np.array(kpm)), None  # np.array: a writeable, contiguous copy
    if m.shape[:2] == (1, 1):  # shared by the batch and the heads
        attn = M.to_torch_attn_mask(np.broadcast_to(m[0, 0], full[2:]))  # (Lq, Lk)
        return None, torch.from_numpy(np.array(attn))
    attn = M.to_torch_attn_mask(np.broadcast_to(m, full), full[0], full[1])  # (B*H, Lq, Lk)
    return None, torch.from_numpy(np.array(attn))


def _checked_mask(mask, batch_size, num_heads, query_len, key_len, dtype) -> tuple[np.ndarray, tuple]:
    """``mask_to_torch_mha``'s arguments checked (ValueError naming the one at fault) -> (the mask 4-D, each size 1 or
    the full one, in ``dtype`` when float; the full shape (B, H, Lq, Lk))."""
    m = as_array(mask, "mask")
    if m.dtype != np.bool_ and not np.issubdtype(m.dtype, np.floating):
        raise ValueError(
            f"mask must be bool (True = may attend) or floating (added), got dtype {m.dtype} with shape {m.shape}; "
            "convert 0/1 masks with mha_numpy.masks (e.g. padding_mask(attention_mask=...))"
        )
    if not 1 <= m.ndim <= 4:
        raise ValueError(f"mask must have 1 to 4 dimensions (broadcast to (B, H, Lq, Lk)), got shape {m.shape}")
    batch_size, num_heads = as_int(batch_size, "batch_size", minimum=1), as_int(num_heads, "num_heads", minimum=1)
    query_len, key_len = (None if n is None else as_int(n, name, minimum=1) for name, n in
                          (("query_len", query_len), ("key_len", key_len)))  # fmt: skip
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # (b, h, lq, lk), each 1 or the full size
    # torch checks attn_mask's (Lq, Lk) and key_padding_mask's Lk exactly, and a size-1 axis does not tell them
    for axis, name, given, needed in (
        (2, "query_len", query_len, m.shape[1:3] != (1, 1)),
        (3, "key_len", key_len, True),
    ):
        if needed and given is None and m.shape[axis] == 1:
            raise ValueError(
                f"mask with shape {np.shape(mask)} is the same for every {name[:-4]}: pass {name} (torch MHA "
                f"accepts only the exact shapes (Lq, Lk) or (B*H, Lq, Lk) for attn_mask, (B, Lk) for key_padding_mask)"
            )
    full = (batch_size, num_heads, query_len or m.shape[2], key_len or m.shape[3])
    try:
        ok = np.broadcast_shapes(m.shape, full) == full
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask with shape {np.shape(mask)} does not broadcast to (batch_size, num_heads, Lq, Lk) = {full}"
        )
    return _in_dtype(m, dtype), full


def _in_dtype(m: np.ndarray, dtype) -> np.ndarray:
    """A float mask in ``dtype`` (a floating dtype, or ValueError naming it); a bool mask, or dtype None: as it is."""
    if dtype is None or m.dtype == np.bool_:
        return m
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "f":  # an int would turn -inf into INT_MIN: torch adds it to the scores
        raise ValueError(f"dtype must be a floating dtype for a float mask, got {dtype!r}")
    return m.astype(dtype)


def mask_from_sdpa(attn_mask) -> np.ndarray | None:
    """SDPA ``attn_mask`` (bool True = attend, float added) -> ours (the same convention)."""
    return None if attn_mask is None else M.from_sdpa_mask(_to_numpy(attn_mask, "attn_mask"))


def mask_to_sdpa(mask) -> torch.Tensor | None:
    """Our mask -> an SDPA ``attn_mask`` tensor (the same convention)."""
    torch = _require("torch")
    return None if mask is None else torch.from_numpy(np.ascontiguousarray(M.to_sdpa_mask(mask)))


def mask_from_hf(attention_mask) -> np.ndarray | None:
    """A Hugging Face mask -> ours (bool, True = may attend). Three forms:

    - ``attention_mask`` (B, Lk), what a user passes to a model: 1 = keep, 0 = padding -> (B, 1, 1, Lk);
    - the 4-D additive mask eager attention adds (0 = keep, ``finfo.min`` = blocked) -> (B, 1, Lq, Lk);
    - the 4-D **bool** mask transformers 5 hands to its SDPA attention (e.g. Llama with
      ``attn_implementation="sdpa"``): causal and padding combined, (B, 1, Lq, Lk), True = attend, which is
      SDPA's convention and ours, so it is copied as it is. (transformers passes None instead when nothing is
      padded and it lets SDPA apply ``is_causal``: then the mask is ``masks.causal_mask``, not None.)
    """
    if attention_mask is None:
        return None
    am = _to_numpy(attention_mask, "attention_mask")
    if am.ndim == 4:
        return M.from_sdpa_mask(am) if am.dtype == np.bool_ else M.from_hf_extended_mask(am)
    return M.from_hf_attention_mask(am)  # (B, 1, 1, Lk)


def mask_to_hf(mask) -> torch.Tensor | None:
    """Our key padding mask (B, 1, 1, Lk) -> HF ``attention_mask`` (B, Lk) int64 tensor, 1 = keep."""
    torch = _require("torch")
    return None if mask is None else torch.from_numpy(M.to_hf_attention_mask(mask))
