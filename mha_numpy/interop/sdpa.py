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
from .harness import Row, additive_tensor, autograd, compare, grad_key, our_grads, tensor, torch_attention, upstream
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
    d_output = upstream(d_output, ctx.shape, dtype, rng)
    d_qkv = F.scaled_dot_product_attention_backward(d_output, cache)[:3]  # dq, dk, dv; no bias: d_bias is None
    ours = {"output": ctx, "weights": cache.attn_weights, "scores": cache.scores, **our_grads(dict(zip("qkv", d_qkv)))}
    theirs = _run_torch(torch, (q, k, v), mask, is_causal, scale, d_output)
    kind = "is_causal=True" if is_causal else ("no mask" if mask is None else f"{mask.dtype.name} attn_mask")
    title = f"torch.nn.functional.scaled_dot_product_attention ({kind})"
    return compare(title, dtype, rtol, ROWS, ours, theirs)


QKV_GRAD_ROWS = tuple(Row(f"dL/d{name}", f"{name}.grad", grad_key(name)) for name in "qkv")
"""The gradient rows of q, k and v."""

ROWS = (
    Row("output (context)", "SDPA(q, k, v)", "output"),
    Row("attn_weights", "softmax(scores+mask) (torch ops)", "weights"),
    Row("scores", "(q·scale) kᵀ (torch ops)", "scores"),
    *QKV_GRAD_ROWS,
)
"""The rows of ``crosscheck_sdpa``."""


def _run_torch(torch, qkv, mask, is_causal: bool, scale, d_output) -> dict:
    """torch SDPA forward and autograd backward, then the scores and weights from torch ops, as NumPy:
    output (B, H, Lq, dv), dq, dk, dv, scores (B, H, Lq, Lk), weights (B, H, Lq, Lk)."""
    tq, tk, tv = (tensor(torch, x, grad=True) for x in qkv)
    tm = None if (mask is None or is_causal) else tensor(torch, mask)
    out_t = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, is_causal=is_causal, scale=scale)
    g = autograd(torch, out_t, (tq, tk, tv), {}, d_output)[0]
    s = default_scale(tq.shape[-1], scale)
    with torch.no_grad():
        scores_t, weights_t, _ = torch_attention(torch, tq, tk, tv, s, additive_tensor(torch, mask, qkv[0].dtype))
    theirs = {"output": out_t.detach().numpy(), "scores": scores_t.numpy(), "weights": weights_t.numpy()}
    return {**theirs, **our_grads(dict(zip("qkv", g)))}
