"""Mask converters for torch tensors at the edge: each framework's convention <-> ours, via ``mha_numpy.masks``.

Ours: bool True = may attend, or a float added to the scores. torch MHA: bool True = ignore. SDPA: bool
True = attend (ours). Hugging Face: ``attention_mask`` 1 = keep, or a 4-D additive extended mask.
The ``from`` side takes tensors or arrays; the ``to`` side returns torch tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
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
        parts.append(M.from_torch_key_padding_mask(_to_numpy(key_padding_mask)))  # (B, 1, 1, Lk)
    if attn_mask is not None:
        parts.append(M.from_torch_attn_mask(_to_numpy(attn_mask), num_heads))  # (Lq, Lk) or (B, H, Lq, Lk)
    return M.combine_masks(*parts)


def mask_to_torch_mha(mask, batch_size: int, num_heads: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Our mask -> ``(key_padding_mask, attn_mask)`` torch tensors for ``torch.nn.MultiheadAttention``.

    A key padding mask (B, 1, 1, Lk) becomes ``key_padding_mask`` (B, Lk); a mask shared by the batch
    ((Lq, Lk) or (1, 1, Lq, Lk)) becomes a 2-D ``attn_mask``; anything else a (B*H, Lq, Lk) ``attn_mask``.
    Bool True = may attend becomes True = ignore; float masks are kept.
    """
    torch = _require("torch")
    if mask is None:
        return None, None
    m = np.asarray(mask)
    if m.ndim == 4 and m.shape[1:3] == (1, 1):
        kpm = M.to_torch_key_padding_mask(np.broadcast_to(m, (batch_size, 1, 1, m.shape[3])))  # (B, Lk)
        return torch.from_numpy(np.ascontiguousarray(kpm)), None
    if m.ndim == 4 and m.shape[:2] == (1, 1):
        m = m[0, 0]  # (Lq, Lk)
    if m.ndim == 2:
        return None, torch.from_numpy(np.ascontiguousarray(M.to_torch_attn_mask(m)))  # (Lq, Lk)
    if m.ndim != 4:
        raise ValueError(f"mask must be (Lq, Lk) or 4-D broadcastable to (B, H, Lq, Lk), got shape {m.shape}")
    attn = M.to_torch_attn_mask(m, batch_size, num_heads)  # (B*H, Lq, Lk)
    return None, torch.from_numpy(np.ascontiguousarray(attn))


def mask_from_sdpa(attn_mask) -> np.ndarray | None:
    """SDPA ``attn_mask`` (bool True = attend, float added) -> ours (the same convention)."""
    return None if attn_mask is None else M.from_sdpa_mask(_to_numpy(attn_mask))


def mask_to_sdpa(mask) -> torch.Tensor | None:
    """Our mask -> an SDPA ``attn_mask`` tensor (the same convention)."""
    torch = _require("torch")
    return None if mask is None else torch.from_numpy(np.ascontiguousarray(M.to_sdpa_mask(mask)))


def mask_from_hf(attention_mask) -> np.ndarray | None:
    """HF ``attention_mask`` (B, Lk) with 1 = keep, or HF's 4-D additive extended mask -> ours (bool)."""
    if attention_mask is None:
        return None
    am = _to_numpy(attention_mask)
    if am.ndim == 4:
        return M.from_hf_extended_mask(am)
    return M.from_hf_attention_mask(am)  # (B, 1, 1, Lk)


def mask_to_hf(mask) -> torch.Tensor | None:
    """Our key padding mask (B, 1, 1, Lk) -> HF ``attention_mask`` (B, Lk) int64 tensor, 1 = keep."""
    torch = _require("torch")
    return None if mask is None else torch.from_numpy(M.to_hf_attention_mask(mask))
