"""Grouped-query attention against torch SDPA's ``enable_gqa=True``: run ours, run theirs, compare."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ._lazy import require
from .harness import random_like
from .report import CrosscheckReport, rtol_for


def crosscheck_gqa_sdpa(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask=None,
    scale: float | None = None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """``repeat_kv`` + ``scaled_dot_product_attention`` (ours) against torch SDPA with ``enable_gqa=True``.

    q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv), H a multiple of Hkv; attn_mask in SDPA's (and our)
    convention, bool True = attend or float added, broadcastable to (B, H, Lq, Lk). The gradients of k and v
    are (B, Hkv, Lk, ·): ours sums over each group of H / Hkv query heads (``repeat_kv_backward``).
    """
    torch = require("torch")
    q, k, v = (np.asarray(x) for x in (q, k, v))
    dtype = q.dtype
    rtol = rtol_for(dtype, rtol)
    if q.ndim != 4 or k.ndim != 4 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q (B, H, Lq, d) needs H a multiple of k's Hkv (B, Hkv, Lk, d): got q {q.shape}, k {k.shape}")
    n_rep = q.shape[1] // k.shape[1]
    mask = None if attn_mask is None else np.asarray(attn_mask)
    K, c_k = F.repeat_kv_forward(k, n_rep)  # (B, H, Lk, d)
    V, c_v = F.repeat_kv_forward(v, n_rep)  # (B, H, Lk, dv)
    ctx, cache = F.scaled_dot_product_attention_forward(q, K, V, mask, scale=scale)  # (B, H, Lq, dv)
    d_output = random_like(ctx.shape, dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)
    dq, dK, dV, _ = F.scaled_dot_product_attention_backward(d_output, cache)  # no bias: d_bias is None
    dk, dv = F.repeat_kv_backward(dK, c_k), F.repeat_kv_backward(dV, c_v)  # (B, Hkv, Lk, ·)

    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).requires_grad_() for x in (q, k, v))
    tm = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    out_t = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, scale=scale, enable_gqa=True)
    g = torch.autograd.grad(out_t, (tq, tk, tv), torch.from_numpy(d_output))

    kind = "no mask" if mask is None else f"{mask.dtype.name} attn_mask"
    report = CrosscheckReport(
        f"torch SDPA enable_gqa=True (H={q.shape[1]}, Hkv={k.shape[1]}, {kind})",
        dtype,
        rtol,
    )
    report.compare("output (context)", "SDPA(q, k, v, enable_gqa)", ctx, out_t.detach().numpy())
    for name, ours, theirs in zip(("q", "k", "v"), (dq, dk, dv), g):
        report.compare(f"dL/d{name}", f"{name}.grad", ours, theirs.numpy())
    return report
