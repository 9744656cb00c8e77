"""Cross-check against ``torch.nn.MultiheadAttention``: run ours, run torch, compare every quantity.

The module's output, attention weights (per head and averaged) and the gradients of every input and
parameter come from torch's module; Q, K, V, the scores and the context, which the module does not
return, from torch ops on torch's own input projection (independent of our name map).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..attention import MultiHeadAttention
from . import convert, names
from ._lazy import require
from .harness import (
    Row,
    additive_tensor,
    autograd,
    compare,
    eval_mode,
    grad_key,
    grad_rows,
    heads,
    run_ours,
    theirs_grads,
    torch_attention,
    upstream,
)
from .harness import tensor as as_tensor
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
    mask = _our_mask(key_padding_mask, attn_mask, mha)
    d_output = upstream(d_output, query.shape, dtype, rng)
    dx_from = ("query", "key", "value") if self_attention else ()
    ours, _ = run_ours(mha, (query, key, value), d_output, dx_from, mask=mask)
    inputs = (query, key, value, key_padding_mask, attn_mask, mask)
    name_map = names.torch_mha_name_map(mha.embed_dim, module._qkv_same_embed_dim, mha.bias, mha.add_bias_kv)
    theirs = _run_torch(torch, module, mha, inputs, self_attention, need_weights, d_output, name_map)
    ours["weights_avg"] = ours["weights"].mean(1)
    ours["torch_ops"], theirs["torch_ops"] = theirs.pop("output_ops"), theirs["output"]  # torch against torch
    return compare(_title(module, mha, need_weights), dtype, rtol, rows(self_attention, name_map), ours, theirs)


def _our_mask(key_padding_mask, attn_mask, mha: MultiHeadAttention):
    """torch's two masks (True = ignore) -> ours (bool True = may attend, or float in the module's dtype)."""
    mask = mask_from_torch_mha(key_padding_mask, attn_mask, num_heads=mha.num_heads)
    return mask.astype(mha.dtype) if mask is not None and mask.dtype != np.bool_ else mask


def _title(module, mha: MultiHeadAttention, need_weights: bool) -> str:
    path = "need_weights=True" if need_weights else "need_weights=False"
    layout = "separate q/k/v_proj_weight" if not module._qkv_same_embed_dim else "packed in_proj_weight"
    extras = "".join(f", {k}=True" for k in ("add_bias_kv", "add_zero_attn") if getattr(mha, k))
    return f"torch.nn.MultiheadAttention ({path}, {layout}, bias={mha.bias}, batch_first={module.batch_first}{extras})"


ROWS = (
    Row("output", "module(...)[0]", "output"),
    Row("attn_weights per head", "average_attn_weights=False", "weights", missing=""),  # need_weights=False: none
    Row("attn_weights averaged", "average_attn_weights=True", "weights_avg", missing=""),
    Row("Q", "F._in_projection → heads", "Q"),
    Row("K", "F._in_projection → heads", "K"),
    Row("V", "F._in_projection → heads", "V"),
    Row("scores", "(Q·scale) Kᵀ  (torch ops)", "scores"),
    Row("context", "softmax(scores+mask) V (torch ops)", "context"),
    Row("torch ops ≡ module", "out_proj(merge(context))", "torch_ops",
        note="torch vs torch: the intermediates are the module's"),
)  # fmt: skip
"""The rows of ``crosscheck_torch_mha`` before the gradients: the output, the attention weights, the intermediates,
torch ops against the module."""


def rows(self_attention: bool, name_map) -> tuple[Row, ...]:
    """``ROWS``, the gradients of the inputs (one x for self-attention) and of every parameter of ``name_map``."""
    if self_attention:
        inputs = (Row("dL/dx (q+k+v paths)", "x.grad (one tensor)", "dx"),)
    else:
        inputs = tuple(Row(f"dL/d{name}", f"{name}.grad", grad_key(name)) for name in ("query", "key", "value"))
    return ROWS + inputs + grad_rows(name_map)


def _run_torch(torch, module, mha: MultiHeadAttention, inputs, self_attention, need_weights, d_output, name_map):
    """The module forward and autograd backward (in eval mode: no dropout), then its intermediates -> a dict keyed as
    the rows (the parameters' gradients read as ours through ``name_map``)."""
    query, key, value, key_padding_mask, attn_mask, mask = inputs
    dtype = mha.dtype

    def tensor(x):
        return as_tensor(torch, x)

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
    with eval_mode(module):  # no dropout
        out_t, w_t = module(*fed, **masks, need_weights=need_weights, average_attn_weights=False)
        out_t = out_t if module.batch_first else out_t.transpose(0, 1)  # (B, Lq, E)
        d_inputs, grads = autograd(torch, out_t, leaves, dict(module.named_parameters()), d_output)
        with torch.no_grad():
            avg_t = None
            if need_weights:  # the same path again, with weights averaged over the heads: (B, Lq, Lk)
                avg_t = module(*fed, **masks, need_weights=True)[1].numpy()
            steps = _torch_steps(torch, module, mha, (tq, tk, tv), additive_tensor(torch, mask, dtype))
    theirs = dict(zip(("Q", "K", "V", "scores", "context", "output_ops"), steps))
    theirs.update(output=out_t.detach().numpy(), weights=None if w_t is None else w_t.detach().numpy())
    theirs.update(
        weights_avg=avg_t,
        **dict(zip(("dx",) if self_attention else map(grad_key, ("query", "key", "value")), d_inputs)),
    )
    return {**theirs, **theirs_grads(grads, name_map)}


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
