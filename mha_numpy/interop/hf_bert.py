"""Cross-check against a Hugging Face ``BertAttention``: run ours, run transformers, compare.

Multi-head attention is ``module.self`` then ``module.output.dense``; the rows are for that part. The last
row checks the whole module, ``LayerNorm(MHA(x) + x)``, forward only (residual and LayerNorm are not MHA).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..models.layers import layer_norm
from . import convert, names
from ._lazy import require, to_numpy
from .harness import Row, autograd, compare, eval_mode, grad_rows, heads, run_ours, tensor, theirs_grads, upstream
from .report import CrosscheckReport, rtol_for

if TYPE_CHECKING:  # for the annotations only: never imported at run time here
    from transformers.models.bert.modeling_bert import BertAttention


def crosscheck_hf_bert_attention(
    module: BertAttention,
    hidden_states: np.ndarray,
    attention_mask=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """A transformers ``BertAttention`` against ``from_hf_bert_attention(module)``, self-attention.

    hidden_states (B, L, E) NumPy. attention_mask: None; HF's (B, L) with 1 = keep (ours gets it through
    ``mask_from_hf``, HF through transformers' own ``create_bidirectional_mask``); or a 4-D additive mask
    (HF's 0 / finfo.min, or any float bias), which both sides add to the scores as it is. So a fully masked
    row gets HF's uniform weights here; with our bool conversion it would get zeros (docs/crosscheck.md).
    MHA = module.self then module.output.dense; the gradient rows are for that part. The last row checks
    the whole module, LayerNorm(MHA(x) + x), forward only, with ``models.layers.layer_norm``.
    The module needs ``attn_implementation="eager"`` for its attention weights.
    """
    torch = require("torch")
    mha = convert.from_hf_bert_attention(module)
    dtype = mha.dtype
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    mask, extended = _masks(torch, module, tensor(torch, x), attention_mask, dtype)
    d_output = upstream(d_output, x.shape, dtype, rng)
    ours, _ = run_ours(mha, (x, x, x), d_output, mask=mask)
    ln = module.output.LayerNorm
    ours["full"] = layer_norm(ours["output"] + x, to_numpy(ln.weight), to_numpy(ln.bias), ln.eps)
    # scaling: checked against module.self.scaling by from_hf_bert_attention
    theirs = _run_transformers(torch, module, x, extended, mha.num_heads, mha.head_dim**-0.5, d_output)
    title = f"transformers BertAttention ({module.self.config._attn_implementation})"
    return compare(title, dtype, rtol_for(dtype, rtol), rows(names.HF_BERT_NAME_MAP), ours, theirs)


def rows(name_map) -> tuple[Row, ...]:
    """The rows: output, attention weights, the intermediates, the gradients of x and of every parameter, and the
    whole module, forward only."""
    return (
        Row("output", "output.dense(self(x)[0])", "output"),
        Row("attn_weights per head", "self(x)[1] (eager)", "weights",
            missing="attn_weights: not returned by this attn_implementation; use 'eager'"),
        Row("Q", "self.query(x) → heads", "Q"),
        Row("K", "self.key(x) → heads", "K"),
        Row("V", "self.value(x) → heads", "V"),
        Row("scores", "(Q Kᵀ)·scaling (torch ops)", "scores"),
        Row("context", "self(x)[0] → heads", "context"),
        Row("dL/dx (q+k+v paths)", "hidden_states.grad", "dx"),
        *grad_rows(name_map),
        Row("BertAttention(x)", "LayerNorm(MHA(x)+x), fwd only", "full", note="residual + LayerNorm are not MHA"),
    )  # fmt: skip


def _masks(torch, module, tx, attention_mask, dtype) -> tuple:
    """``attention_mask`` -> (ours, HF's extended mask tensor), each None when there is no mask."""
    am = to_numpy(attention_mask, "attention_mask")
    if am is not None and am.ndim == 2:
        try:
            from transformers.masking_utils import create_bidirectional_mask as create
        except ImportError:  # transformers before masking_utils
            create = None
        if create is not None:  # transformers' own conversion: (B, 1, L, L) additive, or None if nothing is masked
            extended = create(config=module.self.config, inputs_embeds=tx, attention_mask=torch.from_numpy(am))
        else:  # older transformers: the same 0 / finfo.min mask, made by us
            extended = torch.from_numpy(M.to_hf_extended_mask(M.from_hf_attention_mask(am), dtype))
        return M.from_hf_attention_mask(am), extended  # ours: bool (B, 1, 1, L)
    # HF's 4-D additive mask is added to the scores, exactly like our float masks: use it as it is
    extended = None if am is None else torch.from_numpy(np.ascontiguousarray(am, dtype=dtype))
    return (None if am is None else am.astype(dtype)), extended


def _run_transformers(torch, module, x, extended, H: int, scaling: float, d_output) -> dict:
    """The module forward and autograd backward (in eval mode: no dropout), then Q, K, V, the scores, the context
    (B, H, L, ·) and the whole module's output."""
    tx, name_map = tensor(torch, x, grad=True), names.HF_BERT_NAME_MAP
    named = {n: p for n, p in module.named_parameters() if n in {t for t, _ in name_map.values()}}
    with eval_mode(module):
        ctx_merged_t, w_t = module.self(tx, attention_mask=extended)  # (B, L, E), (B, H, L, L) or None
        out_t = module.output.dense(ctx_merged_t)  # (B, L, E): the MHA output, before residual + LayerNorm
        (dx,), grads = autograd(torch, out_t, [tx], named, d_output)
        with torch.no_grad():
            Q_t, K_t, V_t = (heads(lin(tx), H) for lin in (module.self.query, module.self.key, module.self.value))
            scores_t = (Q_t @ K_t.transpose(-2, -1)) * scaling  # HF's order: matmul, then scale
            full_t = module(tx, attention_mask=extended)[0]  # LayerNorm(dense(context) + x)
    steps = dict(Q=Q_t, K=K_t, V=V_t, scores=scores_t, context=heads(ctx_merged_t.detach(), H), full=full_t)
    theirs = {name: t.numpy() for name, t in steps.items()}
    theirs.update(output=out_t.detach().numpy(), weights=None if w_t is None else w_t.detach().numpy(), dx=dx)
    return {**theirs, **theirs_grads(grads, name_map)}
