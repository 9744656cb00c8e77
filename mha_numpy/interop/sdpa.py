"""Cross-check ``functional.scaled_dot_product_attention`` against torch's: run ours, run torch, compare.

The output and the gradients of q, k, v come from ``torch.nn.functional.scaled_dot_product_attention``;
the scores and weights, which SDPA does not return, from torch ops.
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import masks as M
from .._checks import default_scale
from ._lazy import require
from .harness import additive_tensor, random_like, torch_attention
from .report import CrosscheckReport, rtol_for
from .tensor_masks import mask_from_sdpa


def crosscheck_sdpa(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask=None,
    is_causal: bool = False,
    scale: float | None = None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """``functional.scaled_dot_product_attention`` against ``torch.nn.functional.scaled_dot_product_attention``.

    q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv), NumPy, one dtype. attn_mask in SDPA's convention
    (bool True = attend, or float added), which is ours. is_causal: top-left aligned, like our
    ``masks.causal_mask(Lq, Lk)`` (torch refuses attn_mask together with is_causal; so do we).
    """
    torch = require("torch")
    q, k, v = (np.asarray(x) for x in (q, k, v))
    dtype = q.dtype
    rtol = rtol_for(dtype, rtol)
    if attn_mask is not None and is_causal:
        raise ValueError("pass either attn_mask or is_causal=True, not both (torch SDPA refuses both)")
    mask = M.causal_mask(q.shape[2], k.shape[2]) if is_causal else mask_from_sdpa(attn_mask)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)

    ctx, cache = F.scaled_dot_product_attention_forward(q, k, v, mask, scale=scale)  # ours
    d_output = random_like(ctx.shape, dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)
    *d_qkv, _ = F.scaled_dot_product_attention_backward(d_output, cache)  # dq, dk, dv; no bias: d_bias is None
    out_t, d_qkv_t, scores_t, weights_t = _run_torch(torch, (q, k, v), mask, is_causal, scale, d_output)

    kind = "is_causal=True" if is_causal else ("no mask" if mask is None else f"{mask.dtype.name} attn_mask")
    report = CrosscheckReport(f"torch.nn.functional.scaled_dot_product_attention ({kind})", dtype, rtol)
    report.compare("output (context)", "SDPA(q, k, v)", ctx, out_t)
    report.compare("attn_weights", "softmax(scores+mask) (torch ops)", cache.attn_weights, weights_t)
    report.compare("scores", "(q·scale) kᵀ (torch ops)", cache.scores, scores_t)
    for name, ours, theirs in zip(("q", "k", "v"), d_qkv, d_qkv_t):
        report.compare(f"dL/d{name}", f"{name}.grad", ours, theirs)
    return report


def _run_torch(torch, qkv, mask, is_causal: bool, scale, d_output) -> tuple:
    """torch SDPA forward and autograd backward, then the scores and weights from torch ops, as NumPy:
    (output (B, H, Lq, dv), (dq, dk, dv), scores (B, H, Lq, Lk), weights (B, H, Lq, Lk))."""
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).requires_grad_() for x in qkv)
    tm = None if (mask is None or is_causal) else torch.from_numpy(np.ascontiguousarray(mask))
    out_t = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, is_causal=is_causal, scale=scale)
    g = torch.autograd.grad(out_t, (tq, tk, tv), torch.from_numpy(d_output))
    s = default_scale(tq.shape[-1], scale)
    with torch.no_grad():
        scores_t, weights_t, _ = torch_attention(torch, tq, tk, tv, s, additive_tensor(torch, mask, qkv[0].dtype))
    return out_t.detach().numpy(), [x.numpy() for x in g], scores_t.numpy(), weights_t.numpy()
