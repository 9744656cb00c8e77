"""Grouped-query attention against torch SDPA's ``enable_gqa=True``: run ours, run theirs, compare."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ._lazy import require
from .harness import Row, autograd, compare, our_grads, tensor, upstream
from .report import CrosscheckReport, rtol_for
from .sdpa import QKV_GRAD_ROWS


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
    mask = None if attn_mask is None else np.asarray(attn_mask)
    d_output = upstream(d_output, (*q.shape[:-1], v.shape[-1]), dtype, rng)  # (B, H, Lq, dv)
    ours = _ours(q, k, v, mask, scale, d_output)
    tq, tk, tv = (tensor(torch, x, grad=True) for x in (q, k, v))
    tm = None if mask is None else tensor(torch, mask)
    out_t = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, scale=scale, enable_gqa=True)
    g = autograd(torch, out_t, (tq, tk, tv), {}, d_output)[0]
    theirs = {"output": out_t.detach().numpy(), **our_grads(dict(zip("qkv", g)))}
    kind = "no mask" if mask is None else f"{mask.dtype.name} attn_mask"
    title = f"torch SDPA enable_gqa=True (H={q.shape[1]}, Hkv={k.shape[1]}, {kind})"
    return compare(title, dtype, rtol, ROWS, ours, theirs)


ROWS = (Row("output (context)", "SDPA(q, k, v, enable_gqa)", "output"), *QKV_GRAD_ROWS)
"""The rows of ``crosscheck_gqa_sdpa``."""


def _ours(q, k, v, mask, scale, d_output) -> dict:
    """``repeat_kv`` + ``scaled_dot_product_attention`` forward and backward: the output, dq, dk and dv."""
    n_rep = q.shape[1] // k.shape[1]
    K, c_k = F.repeat_kv_forward(k, n_rep)  # (B, H, Lk, d)
    V, c_v = F.repeat_kv_forward(v, n_rep)  # (B, H, Lk, dv)
    ctx, cache = F.scaled_dot_product_attention_forward(q, K, V, mask, scale=scale)  # (B, H, Lq, dv)
    dq, dK, dV, _ = F.scaled_dot_product_attention_backward(d_output, cache)  # no bias: d_bias is None
    dk, dv = F.repeat_kv_backward(dK, c_k), F.repeat_kv_backward(dV, c_v)  # (B, Hkv, Lk, ·)
    return {"output": ctx, **our_grads({"q": dq, "k": dk, "v": dv})}
