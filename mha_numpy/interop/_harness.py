"""What the cross-check harnesses share: the random upstream gradient, torch's side of the attention
written as plain torch ops (for the intermediates a module does not return), and the gradient rows."""

from __future__ import annotations

import numpy as np

from .. import masks as M
from .._checks import as_generator
from .names import NameMap, describe
from .report import CrosscheckReport


def random_like(shape, dtype, rng) -> np.ndarray:
    """A standard normal array of ``shape`` and ``dtype``: the random upstream gradient of a cross-check."""
    return as_generator(rng).standard_normal(shape).astype(dtype)


def decode_calls(L: int, prefill: int, chunk: int = 1) -> list[tuple[int, int]]:
    """The decoding cross-checks' calls: positions [a, b) of each, a prefill of ``prefill`` tokens, then ``chunk``
    tokens a call up to L. ValueError naming prefill or chunk."""
    if not 1 <= prefill <= L:
        raise ValueError(f"prefill must lie in [1, L={L}], got {prefill}")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    return [(0, prefill)] + [(t, min(t + chunk, L)) for t in range(prefill, L, chunk)]


def heads(torch_x, num_heads: int):
    """torch (B, L, E) -> (B, H, L, d), the same split as ours (head h = features h*d ... (h+1)*d - 1)."""
    B, L, E = torch_x.shape
    return torch_x.reshape(B, L, num_heads, E // num_heads).transpose(1, 2)  # (B, H, L, d)


def torch_attention(torch, Q, K, V, scale: float, additive):
    """Torch ops: scores = (Q scale) Kᵀ, weights = softmax(scores + mask), context = weights V.

    Fully masked rows: torch's softmax gives NaN; set to 0 like SDPA and mha_numpy do.
    """
    scores = (Q * scale) @ K.transpose(-2, -1)  # (B, H, Lq, Lk), torch MHA's order: scale q first
    masked = scores if additive is None else scores + additive
    weights = torch.softmax(masked, dim=-1).nan_to_num(0.0)  # (B, H, Lq, Lk)
    return scores, weights, weights @ V  # context (B, H, Lq, d)


def additive_tensor(torch, mask, dtype):
    """Our mask (bool or float) -> the float tensor added to the scores (0 / -inf for bool); None stays None."""
    return None if mask is None else torch.from_numpy(np.ascontiguousarray(M.to_additive(mask, dtype)))


def add_grad_rows(report: CrosscheckReport, grads_ours: dict, grads_theirs: dict, name_map: NameMap) -> None:
    """One row "dL/dW_q" ... per parameter of ``name_map``, labelled with the torch tensor it comes from."""
    for ours in name_map:
        report.compare(f"dL/d{ours}", describe(name_map[ours]), grads_ours[ours], grads_theirs[ours])
