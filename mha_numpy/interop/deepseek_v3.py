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
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..kv_cache import LatentCache
from ..latent import MultiHeadLatentAttention
from ._harness import additive_tensor, decode_calls, random_like
from ._lazy import require
from .convert import numpy_dtype_of
from .llama import hf_rope_theta, torch_cos_sin
from .names import NameMap, describe, params_from_state
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


def _positions(positions, B: int, L: int) -> np.ndarray:
    """None -> 0..L-1; (L,) or (B, L) -> (B, L) int64."""
    return np.broadcast_to(np.arange(L) if positions is None else np.asarray(positions), (B, L)).astype(np.int64)


def _run_hf(torch, module, x, cos_sin, mask, d_output):
    """-> (output, attention weights or None, d hidden_states, {name: gradient}) of the module, autograd of d."""
    named = dict(module.named_parameters())
    tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
    out, weights = module(tx, cos_sin, mask)
    g = torch.autograd.grad(out, [tx, *named.values()], torch.from_numpy(d_output))
    w = None if weights is None else weights.detach().numpy()
    return out.detach().numpy(), w, g[0].numpy(), dict(zip(named, (t.numpy() for t in g[1:])))


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
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    mla = from_hf_deepseek_v3_attention(module)
    if kernel is not None:
        mla.kernel = kernel
    dtype = mla.dtype
    rtol = rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    B, L, _ = x.shape
    pos = _positions(positions, B, L)  # (B, L)
    mask = M.causal_mask(L) if mask is None else mask
    d_output = random_like(x.shape, dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)

    out, cache = mla.forward(x, mask=mask, positions=pos)
    grads = mla.backward(d_output, cache)
    mask_t = _additive(torch, mask, dtype)
    shipped_cos_sin = DeepseekV3RotaryEmbedding(module.config)(torch.from_numpy(x), torch.from_numpy(pos))
    was_training = module.training
    module.eval()
    try:
        if dtype == np.float64:
            shipped = _run_hf(torch, module, x, shipped_cos_sin, mask_t, d_output)
            cos_sin = torch_cos_sin(torch, pos, mla.qk_rope_head_dim, mla.rope_theta, dtype)  # float64 angles
            with float64_throughout(module):
                out_t, w_t, dx_t, g_t = _run_hf(torch, module, x, cos_sin, mask_t, d_output)
        else:  # the module as shipped, its own rotary embedding included
            out_t, w_t, dx_t, g_t = _run_hf(torch, module, x, shipped_cos_sin, mask_t, d_output)
    finally:
        module.train(was_training)

    c = mla.config
    title = (f"MultiHeadLatentAttention vs transformers DeepseekV3Attention (H={c.num_heads}, r={c.kv_lora_rank}, "
             f"q_lora_rank={c.q_lora_rank}, dn={c.qk_nope_head_dim}, dr={c.qk_rope_head_dim}, dv={c.v_head_dim}, "
             f"interleave={c.rope_interleave}, kernel {mla.impl})")  # fmt: skip
    report = CrosscheckReport(title, dtype, rtol)
    report.compare("output", "module(x, (cos, sin), mask)", out, out_t)
    if w_t is not None:
        report.compare("attention weights", "eager attn_weights", cache.attn_weights, w_t)
    else:
        report.notes.append(f"no attention weights row: {module.config._attn_implementation} returns none")
    report.compare("dL/dx (query + latent paths)", "hidden_states.grad", grads["query"] + grads["key"], dx_t)
    name_map = {ours: HF_DEEPSEEK_V3_NAME_MAP[ours] for ours in mla.params}
    theirs = params_from_state(g_t, name_map)
    for ours in name_map:
        report.compare(f"dL/d{ours}", describe(name_map[ours]), grads[ours], theirs[ours])
    if dtype == np.float64:
        out_s, _, _, g_s = shipped
        err_y = np.abs(out_s - out).max() / np.abs(out_s).max()
        shipped_grads = params_from_state(g_s, name_map)
        err_g = max(np.abs(shipped_grads[n] - grads[n]).max() / np.abs(shipped_grads[n]).max() for n in name_map)
        report.notes.append(
            "HF run with its RMSNorms and softmax in float64 (float64_throughout) and float64 (cos, sin); the module "
            f"as shipped (those and its rotary embedding in float32) differs from ours by {err_y:.1e} (output) and "
            f"{err_g:.1e} (worst parameter gradient), relative to the largest"
        )
    return report


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
    from transformers import DynamicCache

    mla = from_hf_deepseek_v3_attention(module)
    if kernel is not None:
        mla.kernel = kernel
    dtype = mla.dtype
    rtol = rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    B, L, _ = x.shape
    calls = decode_calls(L, prefill)

    cache = LatentCache()
    ours = np.concatenate([mla.forward(x[:, a:b], kv_cache=cache)[0] for a, b in calls], axis=1)
    full, _ = mla.forward(x, mask=M.causal_mask(L))

    hf_cache = DynamicCache(config=module.config)
    cos_t, sin_t = torch_cos_sin(torch, _positions(None, B, L), mla.qk_rope_head_dim, mla.rope_theta, dtype)
    tx = torch.from_numpy(np.ascontiguousarray(x))
    theirs = []
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), float64_throughout(module) if dtype == np.float64 else nullcontext():
            for a, b in calls:
                mask = _additive(torch, M.causal_mask(b - a, b, diagonal=a), dtype)  # bottom-right: after the cache
                theirs.append(module(tx[:, a:b], (cos_t[:, a:b], sin_t[:, a:b]), mask, cache=hf_cache)[0].numpy())
    finally:
        module.train(was_training)
    layer = hf_cache.layers[module.layer_idx]

    report = CrosscheckReport(
        f"LatentCache vs transformers DynamicCache (prefill {prefill}, then {L - prefill} single steps)", dtype, rtol
    )
    report.compare("outputs, every call", "DeepseekV3Attention(..., cache=)", ours, np.concatenate(theirs, axis=1))
    report.compare("cached ≡ full causal", "ours, one causal forward", ours, full, note="ours vs ours")
    report.compare("cached latents c_kv", "DynamicCache keys", cache.latent, layer.keys.numpy())
    report.compare("cached rope keys", "DynamicCache values", cache.k_rope, layer.values.numpy())
    report.notes.append(
        f"our LatentCache: {cache.nbytes} bytes for {len(cache)} positions ({cache.bytes_per_token} per token; "
        f"K and V would take {B * L * mla.num_heads * (mla.qk_head_dim + mla.v_head_dim) * x.itemsize})"
    )
    return report
