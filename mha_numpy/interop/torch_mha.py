"""Cross-check against ``torch.nn.MultiheadAttention``: run ours, run torch, compare every quantity.

The module's output, attention weights (per head and averaged) and the gradients of every input and
parameter come from torch's module; Q, K, V, the scores and the context, which the module does not
return, from torch ops on torch's own input projection (independent of our name map).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..attention import MHACache, MultiHeadAttention
from . import convert, names
from ._harness import add_grad_rows, additive_tensor, heads, random_like, torch_attention
from ._lazy import require
from .report import CrosscheckReport, rtol_for
from .tensor_masks import mask_from_torch_mha

if TYPE_CHECKING:  # for the annotations only: never imported at run time here
    import torch


def crosscheck_torch_mha(
    module: torch.nn.MultiheadAttention | MultiHeadAttention,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    key_padding_mask=None,
    attn_mask=None,
    need_weights: bool = True,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """Run ``module`` (a torch.nn.MultiheadAttention, or our MultiHeadAttention exported with
    ``to_torch_mha``) and ``from_torch_mha(module)`` on the same inputs; compare everything.

    query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim): NumPy, always batch first (transposed for a
    ``batch_first=False`` module). Pass the same array three times for self-attention: torch then gets one
    tensor, and dL/dx is compared with our grads["query"] + grads["key"] + grads["value"].
    key_padding_mask (B, Lk) / attn_mask (Lq, Lk) or (B*H, Lq, Lk): in **torch's** convention (True = ignore).
    need_weights: which of torch's two code paths to check. d_output defaults to a random (B, Lq, E).
    rtol defaults to 1e-10 (float64) / 1e-5 (float32).
    """
    torch = require("torch")
    if isinstance(module, MultiHeadAttention):
        module = convert.to_torch_mha(module)
    mha = convert.from_torch_mha(module)
    dtype = mha.dtype
    rtol = rtol_for(dtype, rtol)
    self_attention = query is key and key is value
    query, key, value = (np.asarray(x).astype(dtype, copy=False) for x in (query, key, value))
    mask = mask_from_torch_mha(key_padding_mask, attn_mask, num_heads=mha.num_heads)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)
    B, Lq, E = query.shape
    d_output = random_like((B, Lq, E), dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)

    out, cache = mha.forward(query, key, value, mask=mask)  # ours
    grads = mha.backward(d_output, cache)
    inputs = (query, key, value, key_padding_mask, attn_mask, mask)
    theirs = _run_torch(torch, module, mha, inputs, self_attention, need_weights, d_output)

    path = "need_weights=True" if need_weights else "need_weights=False"
    layout = "separate q/k/v_proj_weight" if not module._qkv_same_embed_dim else "packed in_proj_weight"
    report = CrosscheckReport(
        f"torch.nn.MultiheadAttention ({path}, {layout}, bias={mha.bias}, batch_first={module.batch_first}"
        + "".join(f", {k}=True" for k in ("add_bias_kv", "add_zero_attn") if getattr(mha, k))
        + ")",
        dtype,
        rtol,
    )
    name_map = names.torch_mha_name_map(mha.embed_dim, module._qkv_same_embed_dim, mha.bias, mha.add_bias_kv)
    _compare(report, out, cache, grads, theirs, self_attention, name_map)
    return report


@dataclass
class _TorchRun:
    """What torch computed, as NumPy arrays: the module's results and the intermediates from torch ops."""

    output: np.ndarray  # (B, Lq, E), module(...)[0]
    weights: np.ndarray | None  # (B, H, Lq, Lk), average_attn_weights=False; None for need_weights=False
    weights_avg: np.ndarray | None  # (B, Lq, Lk), average_attn_weights=True; None for need_weights=False
    Q: np.ndarray  # (B, H, Lq, d)
    K: np.ndarray  # (B, H, Lk, d)
    V: np.ndarray  # (B, H, Lk, d)
    scores: np.ndarray  # (B, H, Lq, Lk)
    context: np.ndarray  # (B, H, Lq, d)
    output_ops: np.ndarray  # (B, Lq, E), out_proj(merge(context)) from the torch ops
    d_inputs: list[np.ndarray]  # dL/dx for self-attention (one tensor), else dL/dquery, dL/dkey, dL/dvalue
    d_params: dict[str, np.ndarray]  # by torch parameter name


def _run_torch(torch, module, mha: MultiHeadAttention, inputs, self_attention, need_weights, d_output) -> _TorchRun:
    """The module forward and autograd backward (in eval mode: no dropout), then its intermediates."""
    query, key, value, key_padding_mask, attn_mask, mask = inputs
    dtype = mha.dtype

    def tensor(x):
        return torch.from_numpy(np.ascontiguousarray(x))

    # torch: leaves are batch first; a batch_first=False module sees them transposed to (L, B, E)
    leaves = [tensor(query).requires_grad_()]
    if not self_attention:
        leaves += [tensor(key).requires_grad_(), tensor(value).requires_grad_()]
    tq, tk, tv = (leaves * 3)[:3] if self_attention else leaves
    fed = [t if module.batch_first else t.transpose(0, 1) for t in (tq, tk, tv)]
    if self_attention:
        fed = [fed[0]] * 3  # the same object three times, as a user would call it

    def torch_mask(m):
        m = None if m is None else (m if hasattr(m, "detach") else tensor(np.asarray(m)))
        return m if m is None or m.dtype == torch.bool else m.to(getattr(torch, dtype.name))

    masks = {"key_padding_mask": torch_mask(key_padding_mask), "attn_mask": torch_mask(attn_mask)}
    named = dict(module.named_parameters())
    was_training = module.training
    module.eval()  # no dropout
    try:
        out_t, w_t = module(*fed, **masks, need_weights=need_weights, average_attn_weights=False)
        out_t = out_t if module.batch_first else out_t.transpose(0, 1)  # (B, Lq, E)
        g = [x.numpy() for x in torch.autograd.grad(out_t, leaves + list(named.values()), tensor(d_output))]
        with torch.no_grad():
            avg_t = None
            if need_weights:  # the same path again, with weights averaged over the heads: (B, Lq, Lk)
                avg_t = module(*fed, **masks, need_weights=True)[1].numpy()
            steps = _torch_steps(torch, module, mha, (tq, tk, tv), additive_tensor(torch, mask, dtype))
    finally:
        module.train(was_training)
    return _TorchRun(
        out_t.detach().numpy(),
        None if w_t is None else w_t.detach().numpy(),
        avg_t,
        *steps,
        d_inputs=g[: len(leaves)],
        d_params=dict(zip(named, g[len(leaves) :])),
    )


def _torch_steps(torch, module, mha: MultiHeadAttention, batch_first_qkv, additive) -> tuple[np.ndarray, ...]:
    """Q, K, V, scores, context and out_proj(merge(context)) from torch ops on the module's own weights."""
    tq, tk, tv = batch_first_qkv
    B, Lq, E = tq.shape
    # the intermediates, from torch's own input projection (independent of our name map)
    b = module.in_proj_bias
    if module._qkv_same_embed_dim:
        q_t, k_t, v_t = torch.nn.functional._in_projection_packed(tq, tk, tv, module.in_proj_weight, b)
    else:
        bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
        w = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
        q_t, k_t, v_t = torch.nn.functional._in_projection(tq, tk, tv, *w, bq, bk, bv)
    if module.bias_k is not None:  # add_bias_kv: one learned key and value after the sequence's
        k_t = torch.cat([k_t, module.bias_k.transpose(0, 1).expand(B, 1, -1)], dim=1)  # (B, Lk + 1, E)
        v_t = torch.cat([v_t, module.bias_v.transpose(0, 1).expand(B, 1, -1)], dim=1)
    Q_t, K_t, V_t = (heads(x, mha.num_heads) for x in (q_t, k_t, v_t))  # (B, H, L, d)
    if module.add_zero_attn:  # one zero key and value more
        zero = torch.zeros((B, mha.num_heads, 1, mha.head_dim), dtype=K_t.dtype)
        K_t, V_t = torch.cat([K_t, zero], dim=2), torch.cat([V_t, zero], dim=2)  # (B, H, Lk + n, d)
    extra = K_t.shape[2] - tk.shape[1]  # the appended keys: every query may attend to them
    if additive is not None and extra:
        additive = torch.nn.functional.pad(additive.expand(B, mha.num_heads, Lq, -1), (0, extra))  # zeros
    scores_t, _, ctx_t = torch_attention(torch, Q_t, K_t, V_t, mha.head_dim**-0.5, additive)
    merged_t = ctx_t.transpose(1, 2).reshape(B, Lq, E)  # (B, Lq, E)
    out_ops_t = torch.nn.functional.linear(merged_t, module.out_proj.weight, module.out_proj.bias)
    return tuple(t.numpy() for t in (Q_t, K_t, V_t, scores_t, ctx_t, out_ops_t))


def _compare(report: CrosscheckReport, out, cache: MHACache, grads: dict, theirs: _TorchRun, self_attention, name_map):
    """The rows: output, attention weights, the intermediates, torch ops against the module, the gradients
    of the inputs and of every parameter (``name_map`` reads torch's parameter gradients as ours)."""
    report.compare("output", "module(...)[0]", out, theirs.output)
    if theirs.weights is not None:
        report.compare("attn_weights per head", "average_attn_weights=False", cache.attn_weights, theirs.weights)
        report.compare(
            "attn_weights averaged", "average_attn_weights=True", cache.attn_weights.mean(1), theirs.weights_avg
        )
    report.compare("Q", "F._in_projection → heads", cache.Q, theirs.Q)
    report.compare("K", "F._in_projection → heads", cache.K, theirs.K)
    report.compare("V", "F._in_projection → heads", cache.V, theirs.V)
    report.compare("scores", "(Q·scale) Kᵀ  (torch ops)", cache.scores, theirs.scores)
    report.compare("context", "softmax(scores+mask) V (torch ops)", cache.context, theirs.context)
    report.compare(
        "torch ops ≡ module",
        "out_proj(merge(context))",
        theirs.output_ops,
        theirs.output,
        note="torch vs torch: the intermediates are the module's",
    )
    if self_attention:
        d_x = grads["query"] + grads["key"] + grads["value"]
        report.compare("dL/dx (q+k+v paths)", "x.grad (one tensor)", d_x, theirs.d_inputs[0])
    else:
        for name, gt in zip(("query", "key", "value"), theirs.d_inputs):
            report.compare(f"dL/d{name}", f"{name}.grad", grads[name], gt)
    add_grad_rows(report, grads, names.params_from_state(theirs.d_params, name_map), name_map)
