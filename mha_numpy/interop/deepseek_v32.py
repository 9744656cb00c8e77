"""DeepSeek-V3.2's sparse attention against transformers' ``DeepseekV32Attention`` (MLA with the DSA indexer):
``from_hf_deepseek_v32_attention`` (the weights into ``sparse.DeepSeekSparseAttention``), a tiny random builder,
and ``crosscheck_hf_deepseek_v32_attention`` (output, the input's and every MLA parameter's gradient, the indexer's
scores and its selection).

Where transformers casts: ``DeepseekV32Indexer.forward`` scores in float32 (``q.float()``, ``k.float()``, the
weights' ``.float()``), its RMSNorms round through float32 and its eager softmax runs in float32. In float64 the
check runs the module inside ``float64_throughout``: the indexer's forward is ``indexer_scores_lifted`` (a copy of
``DeepseekV32Indexer.forward`` with those three casts lifted, the rest line for line, ``torch.topk`` included), the
norms and the softmax in the module's dtype. A float32 module runs as shipped: every one of those casts is to
float32, a no-op there (its int32 indices are recorded by a forward hook on the indexer). Its indexer runs under
``no_grad`` as shipped: the indexer's parameters get no gradient from the attention (ours neither: ``sparse.dsa``).

Ties: ``torch.topk`` leaves equal scores at the k-th place to its kernel, ours keeps the lower key index
(``sparse.topk``); ReLU's zeros make exact ties possible, so a check's inputs should have none at the k-th place
(``selection_margin`` reports the smallest gap between the k-th and the (k+1)-th allowed score).
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..sparse.dsa import DeepSeekSparseAttention
from ..sparse.indexer import indexer_forward
from ._lazy import require
from .convert import numpy_dtype_of
from .deepseek_v3 import HF_DEEPSEEK_V3_NAME_MAP
from .harness import (
    Row,
    additive_tensor,
    autograd,
    compare,
    eval_mode,
    grad_rows,
    positions_of,
    run_ours,
    tensor,
    theirs_grads,
    upstream,
)
from .llama import hf_rope_theta, hidden, torch_cos_sin
from .names import NameMap, params_from_state
from .report import CrosscheckReport, rtol_for

if TYPE_CHECKING:  # annotations only
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Attention

HF_DEEPSEEK_V32_MLA_NAME_MAP: NameMap = {k: v for k, v in HF_DEEPSEEK_V3_NAME_MAP.items() if k != "W_q"}
"""DeepseekV32Attention's MLA parameters as ours: DeepSeek-V3's map without ``W_q`` (V3.2 always takes the query
through its LoRA, q_a_proj / q_b_proj; the biases present with attention_bias)."""

HF_DEEPSEEK_V32_INDEXER_NAME_MAP: NameMap = {
    "W_iq": ("indexer.wq_b.weight", None),
    "W_ik": ("indexer.wk.weight", None),
    "ik_norm": ("indexer.k_norm.weight", None),
    "ik_norm_b": ("indexer.k_norm.bias", None),
    "W_iw": ("indexer.weights_proj.weight", None),
}
"""DeepseekV32Indexer's parameters as ours (``DeepSeekSparseAttention.indexer_params``)."""


def from_hf_deepseek_v32_attention(module: DeepseekV32Attention) -> DeepSeekSparseAttention:
    """Hugging Face ``DeepseekV32Attention`` -> ``DeepSeekSparseAttention``, the same weights (copied): sizes,
    attention_bias, rope_theta, index_n_heads, index_head_dim, index_topk from the config. ValueError for what is
    not modelled (num_key_value_heads != num_attention_heads, YaRN's mscale, an indexer norm eps other than 1e-6)."""
    if not hasattr(module, "indexer") or not hasattr(module, "config"):
        raise ValueError(f"module must be a transformers DeepseekV32Attention (indexer and config), got {module!r}")
    cfg = module.config
    H, dqk = cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    if cfg.num_key_value_heads != H:
        raise ValueError(f"num_key_value_heads={cfg.num_key_value_heads} != num_attention_heads={H}: not modelled")
    if not np.isclose(module.scaling, dqk**-0.5, rtol=1e-15):
        raise ValueError(f"DeepseekV32Attention.scaling={module.scaling} is not qk_head_dim^-1/2 (YaRN's mscale?)")
    eps = {module.kv_a_layernorm.variance_epsilon, module.q_a_layernorm.variance_epsilon}
    if len(eps) != 1 or module.indexer.k_norm.eps != 1e-6:
        raise ValueError(f"norm eps {sorted(eps)}, indexer k_norm eps {module.indexer.k_norm.eps}: not modelled")
    dsa = DeepSeekSparseAttention(
        cfg.hidden_size, H, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim,
        cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk, bias=bool(cfg.attention_bias),
        dtype=numpy_dtype_of(module.kv_b_proj.weight.dtype), rng=0, rope_theta=hf_rope_theta(cfg),
        norm_eps=float(eps.pop()),
    )  # fmt: skip
    state = dict(module.named_parameters())
    mla = params_from_state(state, {n: HF_DEEPSEEK_V32_MLA_NAME_MAP[n] for n in dsa.mla.params})
    indexer = params_from_state(state, HF_DEEPSEEK_V32_INDEXER_NAME_MAP)
    for ours, theirs in ((dsa.mla.params, mla), (dsa.indexer_params, indexer)):
        for name, p in ours.items():
            if theirs[name].shape != p.shape:
                raise ValueError(f"{name}: the imported tensor has shape {theirs[name].shape}, expected {p.shape}")
    dsa.mla.params, dsa.indexer_params = mla, indexer
    return dsa


def hf_deepseek_v32_attention(
    hidden_size: int = 16, num_heads: int = 4, kv_lora_rank: int = 8, qk_rope_head_dim: int = 4,
    qk_nope_head_dim: int = 6, v_head_dim: int = 5, q_lora_rank: int = 6, index_n_heads: int = 8,
    index_head_dim: int = 8, index_topk: int = 4, rope_theta: float = 10000.0, bias: bool = True,
    dtype=np.float64, seed: int = 0,
) -> DeepseekV32Attention:  # fmt: skip
    """A small random transformers ``DeepseekV32Attention`` (layer 0, eager attention), nothing downloaded. Nonzero
    biases N(0, 0.3²) (the indexer's LayerNorm bias too) and norm weights N(1, 0.2²): zeros and ones would hide a
    swapped one."""
    torch = require("torch")
    transformers = require("transformers")
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Attention

    cfg = transformers.DeepseekV32Config(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=qk_nope_head_dim, v_head_dim=v_head_dim, index_n_heads=index_n_heads,
        index_head_dim=index_head_dim, index_topk=index_topk, attention_bias=bias, attn_implementation="eager",
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta}, num_hidden_layers=1, vocab_size=16,
        intermediate_size=8, moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    module = DeepseekV32Attention(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name)).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.3)
            elif "norm" in name:
                p.normal_(1.0, 0.2)
    return module


def indexer_scores_lifted(indexer, hidden_states, q_resid, position_embeddings, attention_mask):
    """``DeepseekV32Indexer.forward``'s scores (B, S, T), masked, before its top-k: its lines with the three float32
    casts lifted (``q.float()``, ``k.float()``, the weights' ``.float()``), no cache. In the module's dtype."""
    torch = require("torch")
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    batch_size, seq_len, _ = hidden_states.shape
    cos, sin = position_embeddings
    q = indexer.wq_b(q_resid).view(batch_size, seq_len, indexer.n_heads, indexer.head_dim)  # [B, S, H, D]
    rope, rest = indexer.qk_rope_head_dim, indexer.head_dim - indexer.qk_rope_head_dim
    q_rot, q_pass = torch.split(q, [rope, rest], dim=-1)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)  # [B, S, 1, D]
    k_rot, k_pass = torch.split(k, [rope, rest], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)  # half-split
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)  # [B, S, D]
    scores = torch.relu(torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)) * indexer.softmax_scale)  # lifted
    weights = indexer.weights_proj(hidden_states) * (indexer.n_heads**-0.5)  # lifted: no .float()
    index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]
    if attention_mask.dtype == torch.bool:
        return index_scores.masked_fill(~attention_mask, float("-inf"))
    return index_scores + attention_mask


_SAME_DTYPE_EAGER = "mha_numpy_v32_eager_same_dtype"


def _eager_same_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0, indices=None, **kwargs):
    """The eager attention ``float64_throughout`` registers: its softmax in the query's dtype, not float32."""
    torch = require("torch")
    if indices is not None:  # under its own name the module passes the indices: fold them as its eager branch
        index_mask = torch.ones((*indices.shape[:2], key.shape[2]), dtype=torch.bool).scatter(-1, indices.long(),
                                                                                            False)  # fmt: skip
        attention_mask = attention_mask.masked_fill(index_mask.unsqueeze(1), torch.finfo(query.dtype).min)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, S, T); Hkv = H (the importer's)
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@contextmanager
def float64_throughout(module: DeepseekV32Attention, chosen: list | None = None):
    """Within the block, ``module`` runs its RMSNorms and its eager softmax in its own dtype, and its indexer as
    ``indexer_scores_lifted`` followed by the shipped ``topk`` (each call's indices appended to ``chosen``).
    Restored after."""
    torch = require("torch")
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def rms_norm(self, x):  # DeepseekV32RMSNorm.forward without the float32 round trip
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def indexer(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids=None, cache=None):
        with torch.no_grad():  # as shipped
            scores = indexer_scores_lifted(self, hidden_states, q_resid, position_embeddings, attention_mask)
            out = scores.topk(min(self.index_topk, scores.shape[-1]), dim=-1).indices.to(torch.int32)
        if chosen is not None:
            chosen.append(out.numpy().copy())
        return out

    norms = [m for m in module.modules() if type(m).__name__ == "DeepseekV32RMSNorm"]
    implementation = module.config._attn_implementation
    for m in norms:
        m.forward = types.MethodType(rms_norm, m)
    module.indexer.forward = types.MethodType(indexer, module.indexer)
    ALL_ATTENTION_FUNCTIONS[_SAME_DTYPE_EAGER] = _eager_same_dtype
    module.config._attn_implementation = _SAME_DTYPE_EAGER
    try:
        yield module
    finally:
        for m in [*norms, module.indexer]:
            del m.forward  # the class's forward again
        module.config._attn_implementation = implementation
        del ALL_ATTENTION_FUNCTIONS[_SAME_DTYPE_EAGER]


def selection_margin(scores: np.ndarray, mask: np.ndarray, k: int) -> float:
    """The smallest gap, over the queries with more than k allowed keys, between the k-th and the (k+1)-th allowed
    indexer score (inf when no query has more than k): 0 means a tie at the k-th place, where torch and we may differ.
    scores (B, Lq, Lk), mask bool broadcastable to it."""
    rows = np.broadcast_to(mask, scores.shape).sum(axis=-1) > k  # (B, Lq) the queries where top-k drops keys
    if not rows.any():
        return np.inf
    s = np.sort(np.where(mask, scores, -np.inf)[rows], axis=-1)[:, ::-1]  # (N, Lk) descending
    return float((s[:, k - 1] - s[:, k]).min())


def _selected(index: np.ndarray, Lk: int, allowed: np.ndarray) -> np.ndarray:
    """index (B, Lq, k) (-1 or a masked key: not attended) -> (B, Lq, Lk) float 1.0 at the attended keys."""
    out = np.zeros((*index.shape[:2], Lk))
    b, i, slot = np.nonzero(index >= 0)
    out[b, i, index[b, i, slot]] = 1.0
    return out * allowed


ROWS = (
    Row("output", "module(x, (cos, sin), mask)", "output"),
    Row("indexer scores (allowed keys)", "DeepseekV32Indexer, casts lifted", "index scores"),
    Row("selected keys (0/1)", "topk indices, under the mask", "selected"),
    Row("dL/dx (query + latent paths)", "hidden_states.grad", "dx"),
)
"""The rows of ``crosscheck_hf_deepseek_v32_attention`` before the MLA parameters' gradients."""


def crosscheck_hf_deepseek_v32_attention(
    module: DeepseekV32Attention, hidden_states: np.ndarray, d_output=None, rng=0, rtol: float | None = None
) -> CrosscheckReport:
    """A transformers ``DeepseekV32Attention`` against ``from_hf_deepseek_v32_attention(module)`` and torch autograd,
    causal, positions 0 ... L-1: a float64 module inside ``float64_throughout`` with float64 (cos, sin), a float32 one
    as shipped (its casts are to float32) with (cos, sin) computed in float64 and rounded. hidden_states (B, L, E).
    Rows: the output, the indexer's scores on the allowed keys, the selection (0/1), the input's gradient and every
    MLA parameter's (the indexer's get none on either side: the selection is fixed)."""
    torch = require("torch")
    dsa = from_hf_deepseek_v32_attention(module)
    rtol = rtol_for(dsa.dtype, rtol)  # float32 or float64, else ValueError
    x, cfg = hidden(hidden_states, dsa.dtype), module.config
    B, L, _ = x.shape
    d_output = upstream(d_output, x.shape, x.dtype, rng)
    allowed = M.causal_mask(L)  # (L, L)
    ours, _ = run_ours(dsa, (x,), d_output, dx_from=("x",))
    scores, _ = indexer_forward(x, dsa.query_latent(x), dsa.indexer_params, dsa.indexer)  # (B, L, L)
    ours["index scores"] = np.where(allowed, scores, 0.0)
    ours["selected"] = _selected(dsa.select(x).index, L, allowed)
    cos_sin = torch_cos_sin(torch, positions_of(None, B, L), cfg.qk_rope_head_dim, hf_rope_theta(cfg), x.dtype)
    mask_t = additive_tensor(torch, allowed, x.dtype)[None, None]  # (1, 1, L, L)
    name_map = {n: HF_DEEPSEEK_V32_MLA_NAME_MAP[n] for n in dsa.mla.params}
    named = {n: p for n, p in module.named_parameters() if not n.startswith("indexer.")}  # no_grad there
    chosen, tx = [], tensor(torch, x, grad=True)  # chosen: their indices, each call's
    with _as_checked(module, dsa.dtype, chosen), eval_mode(module):
        out_t, _ = module(tx, cos_sin, mask_t)
        (dx,), grads = autograd(torch, out_t, [tx], named, d_output)
        with torch.no_grad():  # in float32 the lifted casts were no-ops: the shipped scores
            q_resid = module.q_a_layernorm(module.q_a_proj(tensor(torch, x)))
            t_scores = indexer_scores_lifted(module.indexer, tensor(torch, x), q_resid, cos_sin, mask_t[:, 0])
    theirs = {"output": out_t.detach().numpy(), "dx": dx, **theirs_grads(grads, name_map)}
    theirs["index scores"] = np.where(allowed, t_scores.numpy(), 0.0)
    theirs["selected"] = _selected(chosen[0].astype(np.int64), L, allowed)
    margin = selection_margin(scores, allowed, dsa.index_topk)
    notes = [f"selection margin (k-th minus (k+1)-th allowed indexer score, smallest): {margin:.2e}; 0: a tie"]
    notes += ["float32: the module as shipped (its casts are to float32: no-ops)"] if dsa.dtype == np.float32 else []
    title = (f"DeepSeekSparseAttention vs transformers DeepseekV32Attention (H={cfg.num_attention_heads}, "
             f"r={cfg.kv_lora_rank}, nI={cfg.index_n_heads}, dI={cfg.index_head_dim}, k={cfg.index_topk}, "
             f"L={L})")  # fmt: skip
    return compare(title, x.dtype, rtol, ROWS + grad_rows(name_map), ours, theirs, notes)


def _as_checked(module: DeepseekV32Attention, dtype, chosen: list):
    """float64: ``float64_throughout``; float32: as shipped, each call's indices recorded on their way out."""
    return float64_throughout(module, chosen) if dtype == np.float64 else _recording_indices(module, chosen)


@contextmanager
def _recording_indices(module: DeepseekV32Attention, chosen: list):
    """Within the block, each call of ``module.indexer`` (as shipped) appends its indices to ``chosen``."""
    hook = module.indexer.register_forward_hook(lambda _m, _args, out: chosen.append(out.numpy().copy()))
    try:
        yield module
    finally:
        hook.remove()
