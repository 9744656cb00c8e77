"""Multi-head latent attention against Hugging Face ``DeepseekV3Attention``: the importer, the attention with its
gradients, and decoding with the latent cache against HF's ``DynamicCache``.

torch and transformers are imported lazily, inside the functions. With E = hidden_size, H = num_attention_heads,
r = kv_lora_rank, rq = q_lora_rank, dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim, dqk = dn + dr:

===========  =========================  ==============================================
ours         DeepseekV3Attention        shape
===========  =========================  ==============================================
W_q          q_proj                     (H·dqk, E)            (q_lora_rank None)
W_qa, b_qa   q_a_proj                   (rq, E), (rq,)        (the bias with attention_bias)
q_a_norm     q_a_layernorm              (rq,)
W_qb         q_b_proj                   (H·dqk, rq)
W_kva, b_kva kv_a_proj_with_mqa         (r + dr, E), (r + dr,)
kv_a_norm    kv_a_layernorm             (r,)
W_kvb        kv_b_proj                  (H·(dn + dv), r)
W_o, b_o     o_proj                     (E, H·dv), (E,)
===========  =========================  ==============================================

Not modelled, refused by the importer naming it: a rope_type other than "default" (YaRN rescales the angles and
multiplies the scale by mscale², DeepSeek-V3's own checkpoints use it), num_key_value_heads ≠ num_attention_heads
(the expansion already gives every head its key and value; HF would repeat them again), and a scaling other than
dqk^-1/2.

Three steps of HF's module compute in float32 whatever its dtype: ``DeepseekV3RMSNorm`` (it rounds through float32),
``DeepseekV3RotaryEmbedding`` (float32 angles) and the eager attention's softmax (``dtype=torch.float32``). In
float64 the cross-check therefore builds (cos, sin) in float64 (``llama.torch_cos_sin``) and runs the module inside
``float64_throughout`` (its two norms' formula without the round trip, the eager attention with the softmax in the
inputs' dtype), and reports the gap of the module as shipped in a note. In float32 the module runs as given.
"""

from __future__ import annotations

import types
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..kv_cache import LatentCache
from ..latent import MultiHeadLatentAttention
from ._lazy import require
from .convert import numpy_dtype_of
from .harness import (
    Row,
    additive_tensor,
    compare,
    decode,
    decode_calls,
    decoding_rows,
    grad_rows,
    hf_decode,
    positions_of,
    run_hf_attention,
    run_ours,
    shipped_gap,
    upstream,
)
from .llama import hf_rope_theta, hidden, torch_cos_sin
from .names import NameMap, params_from_state
from .report import CrosscheckReport, rtol_for

if TYPE_CHECKING:  # annotations only
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

HF_DEEPSEEK_V3_NAME_MAP: NameMap = {
    "W_q": ("q_proj.weight", None),
    "W_qa": ("q_a_proj.weight", None),
    "b_qa": ("q_a_proj.bias", None),
    "q_a_norm": ("q_a_layernorm.weight", None),
    "W_qb": ("q_b_proj.weight", None),
    "W_kva": ("kv_a_proj_with_mqa.weight", None),
    "b_kva": ("kv_a_proj_with_mqa.bias", None),
    "kv_a_norm": ("kv_a_layernorm.weight", None),
    "W_kvb": ("kv_b_proj.weight", None),
    "W_o": ("o_proj.weight", None),
    "b_o": ("o_proj.bias", None),
}
"""DeepseekV3Attention's parameters as ours (each present or not by q_lora_rank and attention_bias)."""


def from_hf_deepseek_v3_attention(module: DeepseekV3Attention) -> MultiHeadLatentAttention:
    """Hugging Face ``DeepseekV3Attention`` -> ``MultiHeadLatentAttention``, the same weights (copied).

    Sizes, q_lora_rank (None: one query projection), attention_bias, rope_theta and rope_interleave from the
    config; the norms' eps is HF's (both latent norms are built with its default 1e-6). Causality is not part of the
    module: pass ``masks.causal_mask(L)``, as DeepseekV3Model's mask does, or decode with a ``LatentCache``.
    """
    if not hasattr(module, "kv_b_proj") or not hasattr(module, "config"):
        raise ValueError(f"module must be a transformers DeepseekV3Attention (kv_b_proj and config), got {module!r}")
    cfg = module.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    if Hkv != H:
        raise ValueError(
            f"num_key_value_heads={Hkv} with num_attention_heads={H} is not modelled: the expansion W_kvb gives every "
            "head its own key and value, which HF's eager attention would repeat again"
        )
    dqk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    if not np.isclose(module.scaling, dqk**-0.5, rtol=1e-15):
        raise ValueError(f"DeepseekV3Attention.scaling={module.scaling} is not qk_head_dim^-1/2 (YaRN's mscale?)")
    eps = {module.kv_a_layernorm.variance_epsilon}
    if module.q_a_layernorm is not None:
        eps.add(module.q_a_layernorm.variance_epsilon)
    if len(eps) != 1:
        raise ValueError(f"q_a_layernorm and kv_a_layernorm have different eps {sorted(eps)}: not modelled")
    mla = MultiHeadLatentAttention(
        cfg.hidden_size, H, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim,
        q_lora_rank=cfg.q_lora_rank, bias=bool(cfg.attention_bias),
        dropout=float(getattr(cfg, "attention_dropout", 0.0)), dtype=numpy_dtype_of(module.kv_b_proj.weight.dtype),
        rng=0, rope_theta=hf_rope_theta(cfg), rope_interleave=bool(cfg.rope_interleave), norm_eps=float(eps.pop()),
    )  # fmt: skip
    name_map = {ours: HF_DEEPSEEK_V3_NAME_MAP[ours] for ours in mla.params}
    params = params_from_state(dict(module.named_parameters()), name_map)
    for name, p in mla.params.items():
        if params[name].shape != p.shape:
            raise ValueError(f"{name}: the imported tensor has shape {params[name].shape}, expected {p.shape}")
    mla.params = params
    return mla


def hf_deepseek_v3_attention(
    hidden_size: int = 16,
    num_heads: int = 4,
    kv_lora_rank: int = 8,
    qk_rope_head_dim: int = 4,
    qk_nope_head_dim: int = 6,
    v_head_dim: int = 5,
    q_lora_rank: int | None = 6,
    rope_theta: float = 10000.0,
    rope_interleave: bool = True,
    bias: bool = True,
    dtype=np.float64,
    seed: int = 0,
    attn_implementation: str = "eager",
) -> DeepseekV3Attention:
    """A small random transformers ``DeepseekV3Attention`` (layer 0) for the cross-checks, nothing downloaded.

    Nonzero biases N(0, 0.3²) when ``bias`` and norm weights N(1, 0.2²): zeros and ones would hide a swapped one.
    """
    torch = require("torch")
    transformers = require("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    cfg = transformers.DeepseekV3Config(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=qk_nope_head_dim, v_head_dim=v_head_dim, rope_theta=rope_theta,
        rope_interleave=rope_interleave, attention_bias=bias, attn_implementation=attn_implementation,
        num_hidden_layers=1, vocab_size=16, intermediate_size=8, moe_intermediate_size=8, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    module = DeepseekV3Attention(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name)).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.3)
            elif "layernorm" in name:
                p.normal_(1.0, 0.2)
    return module


_SAME_DTYPE_EAGER = "mha_numpy_eager_same_dtype"


@contextmanager
def float64_throughout(module: DeepseekV3Attention):
    """Within the block, ``module`` computes its two latent RMSNorms and its eager softmax in its own dtype (float64)
    instead of float32: each ``DeepseekV3RMSNorm`` runs its formula without the float32 round trip, and the attention
    is HF's eager attention with ``softmax(..., dtype=query.dtype)``, registered for the block under its own name in
    HF's attention registry. (cos, sin) are an argument of the module's forward: pass float64 ones. Restored after."""
    torch = require("torch")
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def rms_norm(self, x):  # DeepseekV3RMSNorm.forward without .to(torch.float32) and back
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):  # HF's, one dtype
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, Lq, Lk); Hkv = H (the importer's)
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.nn.functional.softmax(weights, dim=-1, dtype=query.dtype)
        weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    norms = [m for m in module.modules() if type(m).__name__ == "DeepseekV3RMSNorm"]
    implementation = module.config._attn_implementation
    for m in norms:
        m.forward = types.MethodType(rms_norm, m)
    ALL_ATTENTION_FUNCTIONS[_SAME_DTYPE_EAGER] = eager
    module.config._attn_implementation = _SAME_DTYPE_EAGER
    try:
        yield module
    finally:
        for m in norms:
            del m.forward  # the class's forward again
        module.config._attn_implementation = implementation
        del ALL_ATTENTION_FUNCTIONS[_SAME_DTYPE_EAGER]


def _additive(torch, mask, dtype):
    """Our mask (bool True = may attend, or float) -> HF's additive float tensor (b, h, Lq, Lk), 4-D."""
    m = additive_tensor(torch, mask, dtype)
    return m.reshape((1,) * (4 - m.ndim) + tuple(m.shape))


ROWS = (
    Row("output", "module(x, (cos, sin), mask)", "output"),
    Row("attention weights", "eager attn_weights", "weights", missing=""),  # the note says why
    Row("dL/dx (query + latent paths)", "hidden_states.grad", "dx"),
)
"""The rows of ``crosscheck_hf_deepseek_v3_attention`` before the gradients of the parameters."""


def crosscheck_hf_deepseek_v3_attention(
    module: DeepseekV3Attention,
    hidden_states: np.ndarray,
    mask=None,
    positions=None,
    d_output: np.ndarray | None = None,
    kernel=None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """A transformers ``DeepseekV3Attention`` against ``from_hf_deepseek_v3_attention(module)`` and torch autograd.

    hidden_states (B, L, E) NumPy; mask: ours (bool True = may attend, or float), broadcastable to (B, H, L, L),
    default causal; a row with no allowed key is not comparable (HF's softmax of -inf gives NaN, ours 0).
    positions None (0..L-1), (L,) or (B, L); kernel: ours (a name or a kernel object, default vectorized). Rows: the
    output, the attention weights, and the gradient of a random upstream gradient with respect to the input and
    every parameter. float64: HF inside ``float64_throughout`` with float64 (cos, sin) (the gap of the module as
    shipped in a note); float32: HF as given, with (cos, sin) from its own ``DeepseekV3RotaryEmbedding``.
    """
    torch = require("torch")
    mla = _imported(module, kernel)
    dtype, x, cfg = mla.dtype, hidden(hidden_states, mla.dtype), module.config
    pos, d_output = positions_of(positions, *x.shape[:2]), upstream(d_output, x.shape, dtype, rng)  # pos (B, L)
    mask = M.causal_mask(x.shape[1]) if mask is None else mask
    ours, _ = run_ours(mla, (x,), d_output, dx_from=("query", "key"), mask=mask, positions=pos)
    name_map = {n: HF_DEEPSEEK_V3_NAME_MAP[n] for n in mla.params}
    shipped, theirs = _hf_call(torch, module, x, pos, _additive(torch, mask, dtype), d_output, name_map)
    no_weights = f"no attention weights row: {cfg._attn_implementation} returns none"
    notes = [no_weights] if theirs["weights"] is None else []
    if dtype == np.float64:
        err_y, err_g = shipped_gap(ours, shipped)
        notes.append(
            "HF run with its RMSNorms and softmax in float64 (float64_throughout) and float64 (cos, sin); the module "
            f"as shipped (those and its rotary embedding in float32) differs from ours by {err_y:.1e} (output) and "
            f"{err_g:.1e} (worst parameter gradient), relative to the largest"
        )
    return compare(_title(cfg, mla), dtype, rtol_for(dtype, rtol), ROWS + grad_rows(name_map), ours, theirs, notes)


def _title(cfg, mla) -> str:
    return (f"MultiHeadLatentAttention vs transformers DeepseekV3Attention (H={cfg.num_attention_heads}, "
            f"r={cfg.kv_lora_rank}, q_lora_rank={cfg.q_lora_rank}, dn={cfg.qk_nope_head_dim}, "
            f"dr={cfg.qk_rope_head_dim}, dv={cfg.v_head_dim}, interleave={bool(cfg.rope_interleave)}, "
            f"kernel {mla.impl})")  # fmt: skip


def _imported(module, kernel) -> MultiHeadLatentAttention:
    """``from_hf_deepseek_v3_attention(module)`` on ``kernel`` (None: the default)."""
    mla = from_hf_deepseek_v3_attention(module)
    if kernel is not None:
        mla.kernel = kernel
    return mla


def _hf_call(torch, module, x, pos, mask_t, d_output, name_map) -> tuple[dict, dict]:
    """HF's module under autograd -> (as shipped, with its own float32 rotary embedding; the compared run: in
    float64 inside ``float64_throughout`` with float64 (cos, sin), in float32 as shipped)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    cfg = module.config
    shipped_cos_sin = DeepseekV3RotaryEmbedding(cfg)(torch.from_numpy(x), torch.from_numpy(pos))
    shipped = run_hf_attention(torch, module, x, shipped_cos_sin, mask_t, d_output, name_map)
    if x.dtype != np.float64:
        return shipped, shipped
    cos_sin = torch_cos_sin(torch, pos, cfg.qk_rope_head_dim, hf_rope_theta(cfg), x.dtype)  # float64 angles
    with float64_throughout(module):
        return shipped, run_hf_attention(torch, module, x, cos_sin, mask_t, d_output, name_map)


def crosscheck_hf_deepseek_v3_cache(
    module: DeepseekV3Attention,
    hidden_states: np.ndarray,
    prefill: int = 3,
    kernel=None,
    rtol: float | None = None,
) -> CrosscheckReport:
    """Decoding with the latent cache: ours (``LatentCache``) against ``DeepseekV3Attention`` with a ``DynamicCache``.

    hidden_states (B, L, E): the first ``prefill`` tokens in one call, then one token per call. Rows: the outputs of
    every call (concatenated, (B, L, E)) against HF's cached decoding; ours cached against our own full causal
    forward; the cached latents (after their norm) and rope keys (after RoPE) against HF's cache.
    """
    torch = require("torch")
    mla = _imported(module, kernel)
    dtype, x, cfg = mla.dtype, hidden(hidden_states, mla.dtype), module.config
    B, L, _ = x.shape
    calls, cache = decode_calls(L, prefill), LatentCache()
    ours = {"outputs": decode(calls, lambda a, b: mla.forward(x[:, a:b], kv_cache=cache)[0])}
    ours.update(full=mla.forward(x, mask=M.causal_mask(L))[0], keys=cache.latent, values=cache.k_rope)
    cos_sin = torch_cos_sin(torch, positions_of(None, B, L), cfg.qk_rope_head_dim, hf_rope_theta(cfg), dtype)
    context = partial(float64_throughout, module) if dtype == np.float64 else nullcontext
    outputs, layer = hf_decode(torch, module, x, calls, cos_sin, partial(_causal_call_mask, torch, dtype), context)
    theirs = {"outputs": outputs, "keys": layer.keys.numpy(), "values": layer.values.numpy()}
    title = f"LatentCache vs transformers DynamicCache (prefill {prefill}, then {L - prefill} single steps)"
    rows = decoding_rows("DeepseekV3Attention(..., cache=)", keys=("cached latents c_kv", "DynamicCache keys"),
                         values=("cached rope keys", "DynamicCache values"))  # fmt: skip
    kv_bytes = B * L * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
    note = (f"our LatentCache: {cache.nbytes} bytes for {len(cache)} positions ({cache.bytes_per_token} per token; "
            f"K and V would take {kv_bytes * x.itemsize})")  # fmt: skip
    return compare(title, dtype, rtol_for(dtype, rtol), rows, ours, theirs, [note])


def _causal_call_mask(torch, dtype, a: int, b: int, cache=None):
    """The causal mask of a decoding call (bottom-right: after the cache), HF's 4-D additive tensor."""
    return _additive(torch, M.causal_mask(b - a, b, diagonal=a), dtype)
