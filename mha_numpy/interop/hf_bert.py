"""Cross-check against a Hugging Face ``BertAttention``: run ours, run transformers, compare.

Multi-head attention is ``module.self`` then ``module.output.dense``; the rows are for that part. The last
row checks the whole module, ``LayerNorm(MHA(x) + x)``, forward only (residual and LayerNorm are not MHA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..attention import MHACache
from ..models.layers import layer_norm
from . import convert, names
from ._harness import add_grad_rows, heads, random_like
from ._lazy import require, to_numpy
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
    rtol = rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
    mask, extended = _masks(torch, module, tx, attention_mask, dtype)
    d_output = random_like(x.shape, dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)

    out, cache = mha.forward(x, x, x, mask=mask)  # ours
    grads = mha.backward(d_output, cache)
    # scaling: checked against module.self.scaling by from_hf_bert_attention
    theirs = _run_transformers(torch, module, tx, extended, mha.num_heads, mha.head_dim**-0.5, d_output)

    report = CrosscheckReport(f"transformers BertAttention ({module.self.config._attn_implementation})", dtype, rtol)
    _compare(report, out, cache, grads, theirs)
    ln = module.output.LayerNorm
    full = layer_norm(out + x, to_numpy(ln.weight), to_numpy(ln.bias), ln.eps)
    report.compare(
        "BertAttention(x)",
        "LayerNorm(MHA(x)+x), fwd only",
        full,
        theirs.full,
        note="residual + LayerNorm are not MHA",
    )
    return report


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


@dataclass
class _HFRun:
    """What transformers computed, as NumPy arrays."""

    output: np.ndarray  # (B, L, E), output.dense(self(x)[0]): the MHA output, before residual + LayerNorm
    weights: np.ndarray | None  # (B, H, L, L), self(x)[1]; None when the attn_implementation gives none
    Q: np.ndarray  # (B, H, L, d)
    K: np.ndarray  # (B, H, L, d)
    V: np.ndarray  # (B, H, L, d)
    scores: np.ndarray  # (B, H, L, L)
    context: np.ndarray  # (B, H, L, d)
    full: np.ndarray  # (B, L, E), module(x)[0] = LayerNorm(output + x)
    d_x: np.ndarray  # (B, L, E)
    d_params: dict[str, np.ndarray]  # by torch parameter name


def _run_transformers(torch, module, tx, extended, H: int, scaling: float, d_output) -> _HFRun:
    """The module forward and autograd backward (in eval mode: no dropout), then Q, K, V and the scores."""
    hf_names = {t for t, _ in names.HF_BERT_NAME_MAP.values()}
    named = {n: p for n, p in module.named_parameters() if n in hf_names}
    was_training = module.training
    module.eval()
    try:
        ctx_merged_t, w_t = module.self(tx, attention_mask=extended)  # (B, L, E), (B, H, L, L) or None
        out_t = module.output.dense(ctx_merged_t)  # (B, L, E): the MHA output, before residual + LayerNorm
        g = torch.autograd.grad(out_t, [tx, *named.values()], torch.from_numpy(d_output))
        with torch.no_grad():
            Q_t, K_t, V_t = (heads(lin(tx), H) for lin in (module.self.query, module.self.key, module.self.value))
            scores_t = (Q_t @ K_t.transpose(-2, -1)) * scaling  # HF's order: matmul, then scale
            full_t = module(tx, attention_mask=extended)[0]  # LayerNorm(dense(context) + x)
    finally:
        module.train(was_training)
    return _HFRun(
        out_t.detach().numpy(),
        None if w_t is None else w_t.detach().numpy(),
        *(t.numpy() for t in (Q_t, K_t, V_t, scores_t, heads(ctx_merged_t.detach(), H), full_t)),
        d_x=g[0].numpy(),
        d_params=dict(zip(named, (t.numpy() for t in g[1:]))),
    )


def _compare(report: CrosscheckReport, out, cache: MHACache, grads: dict, theirs: _HFRun) -> None:
    """The rows: output, attention weights, the intermediates, the gradients of x and of every parameter."""
    report.compare("output", "output.dense(self(x)[0])", out, theirs.output)
    if theirs.weights is not None:
        report.compare("attn_weights per head", "self(x)[1] (eager)", cache.attn_weights, theirs.weights)
    else:
        report.notes.append("attn_weights: not returned by this attn_implementation; use 'eager'")
    report.compare("Q", "self.query(x) → heads", cache.Q, theirs.Q)
    report.compare("K", "self.key(x) → heads", cache.K, theirs.K)
    report.compare("V", "self.value(x) → heads", cache.V, theirs.V)
    report.compare("scores", "(Q Kᵀ)·scaling (torch ops)", cache.scores, theirs.scores)
    report.compare("context", "self(x)[0] → heads", cache.context, theirs.context)
    d_x = grads["query"] + grads["key"] + grads["value"]
    report.compare("dL/dx (q+k+v paths)", "hidden_states.grad", d_x, theirs.d_x)
    name_map = names.HF_BERT_NAME_MAP
    add_grad_rows(report, grads, names.params_from_state(theirs.d_params, name_map), name_map)
