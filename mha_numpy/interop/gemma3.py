"""Gemma 3's local and global layers against Hugging Face ``Gemma3Attention``: the importer, one call, decoding.

torch and transformers are imported lazily, inside the functions. Gemma 3 alternates sliding ("local") layers and
full ("global") ones, ``config.layer_types`` (by default five sliding layers, then a full one), and turns each kind
by its own RoPE base: ``config.rope_parameters[layer_type]["rope_theta"]`` (the older names:
``rope_local_base_freq`` for the sliding layers, ``rope_theta`` for the full ones). ``Gemma3Attention`` with
E = hidden_size, H, Hkv, d = head_dim:

======================  ==============================  ============================================
ours                    Gemma3Attention                 shape / value
======================  ==============================  ============================================
W_q, b_q ... W_o, b_o   q_proj, k_proj, v_proj, o_proj  as Gemma 2's (biases with attention_bias)
q_norm, k_norm          1 + q_norm.weight, k_norm       (d,): Gemma's RMSNorm scales by (1 + weight);
                                                        the gradient is the same
qk_norm_eps             config.rms_norm_eps             before RoPE, as Qwen3's
scale                   scaling                         query_pre_attn_scalar^-1/2
rope_theta,             rope_parameters[layer_type]     ``gemma3_layer_options``: the base and scaling
rope_scaling                                            of its layer type (global layers: "linear")
(the mask)              sliding_window                  a sliding layer's window; a full layer: causal
======================  ==============================  ============================================

Gemma 3 passes no soft-cap to its attention (``attn_logit_softcapping`` is not read by ``Gemma3Attention``), so
none is imported. ``Gemma3RMSNorm`` rounds through float32 and the eager softmax is float32: the float64 check runs
both in float64 (``gemma_norm_in_float64``, ``decoder_attention``) and reports the as-shipped gap.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ..attention import MultiHeadAttention
from ._lazy import require
from .decoder_attention import DecoderAttention, crosscheck_decoder_attention, crosscheck_decoder_kv_cache
from .harness import on_kernel
from .llama import from_llama_like, llama_like_sizes
from .qwen3 import HF_QWEN3_NAME_MAP
from .report import CrosscheckReport
from .rope import float64_rope, hf_rope_scaling

if TYPE_CHECKING:  # annotations only
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention

GEMMA3_LAYER_TYPES = ("sliding_attention", "full_attention")


def gemma3_layer_options(config, layer_idx: int) -> dict:
    """The options of Gemma 3's layer ``layer_idx`` that depend on its type: its layer type's RoPE base and scaling.
    ValueError naming layer_idx (no such layer), layer_types (an unknown type) or rope_parameters (no base)."""
    types_ = list(config.layer_types)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, (int, np.integer)) or not 0 <= layer_idx < len(types_):
        raise ValueError(f"layer_idx must be an int in [0, {len(types_)}) (config.layer_types), got {layer_idx!r}")
    kind = types_[layer_idx]
    if kind not in GEMMA3_LAYER_TYPES:
        raise ValueError(f"config.layer_types[{layer_idx}] must be one of {GEMMA3_LAYER_TYPES}, got {kind!r}")
    rope = dict((config.rope_parameters or {}).get(kind) or {})
    if "rope_theta" not in rope:
        raise ValueError(f"config.rope_parameters[{kind!r}] must hold the layer type's rope_theta, got {rope!r}")
    layer = types.SimpleNamespace(rope_parameters=rope, max_position_embeddings=config.max_position_embeddings)
    scaling = hf_rope_scaling(layer)  # Gemma 3's global layers from 4B on: "linear", factor 8
    return {"rope_theta": float(rope["rope_theta"]), **({} if scaling is None else {"rope_scaling": scaling})}


@contextmanager
def gemma_norm_in_float64(module):
    """Within the block, the module's ``q_norm`` and ``k_norm`` (``Gemma3RMSNorm``) compute x̂ · (1 + weight) in the
    input's dtype, without the float32 round trip. Restored afterwards (the class's forward again)."""

    def rms_norm(self, x):  # Gemma3RMSNorm.forward without .float() and back
        return self._norm(x) * (1.0 + self.weight)

    norms = (module.q_norm, module.k_norm)
    for m in norms:
        m.forward = types.MethodType(rms_norm, m)
    try:
        yield module
    finally:
        for m in norms:
            del m.forward


def _kind(module) -> DecoderAttention:
    bias = module.q_proj.bias is not None
    name_map = {ours: entry for ours, entry in HF_QWEN3_NAME_MAP.items() if bias or not ours.startswith("b_")}
    return DecoderAttention("Gemma3Attention", name_map, "Gemma3RotaryEmbedding", gemma_norm_in_float64,
                            " and QK-norm", cos_sin=_hf_cos_sin)  # fmt: skip


def _hf_cos_sin(torch, module, positions, dtype):
    """HF's (cos, sin) for this layer from Gemma 3's own rotary module (its layer type's base and scaling, read
    from its config) lifted to float64 (``rope.float64_rope``), cast to dtype."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    with float64_rope(torch), torch.no_grad():
        rotary, pos = Gemma3RotaryEmbedding(module.config), torch.from_numpy(np.asarray(positions, np.int64))
        cos, sin = rotary(torch.zeros(1, dtype=torch.float64), pos, module.layer_type)
    tdtype = getattr(torch, np.dtype(dtype).name)
    return cos.to(tdtype), sin.to(tdtype)


def from_hf_gemma3_attention(module: Gemma3Attention) -> MultiHeadAttention:
    """Hugging Face ``Gemma3Attention`` -> ``MultiHeadAttention(qk_norm=True, scale=..., rope_theta=its layer
    type's, head_dim=...)``, same weights (q_norm, k_norm = 1 + Gemma's weights).

    Causality and a sliding layer's window are not part of the module: pass
    ``decoder_attention.layer_mask(B, Lq, Lk, module.sliding_window)`` as the mask (or a ``KVCache`` with it)."""
    cfg = llama_like_sizes(module, "Gemma3Attention", needs=("q_norm", "k_norm", "scaling", "layer_idx"))[0]
    if getattr(cfg, "use_bidirectional_attention", False):
        raise ValueError("the module's config has use_bidirectional_attention=True; causal layers only")
    eps = {module.q_norm.eps, module.k_norm.eps}
    if len(eps) != 1:
        raise ValueError(f"q_norm and k_norm have different eps {sorted(eps)}; the module has one qk_norm_eps")
    mha = from_llama_like(module, "Gemma3Attention", HF_QWEN3_NAME_MAP, scale=module.scaling, qk_norm=True,
                          qk_norm_eps=float(eps.pop()), **gemma3_layer_options(cfg, module.layer_idx))  # fmt: skip
    for name in ("q_norm", "k_norm"):
        mha.params[name] += 1.0  # Gemma's RMSNorm scales by 1 + weight
    return mha


def _imported(module, kernel, recompute: bool) -> MultiHeadAttention:
    return on_kernel(from_hf_gemma3_attention(module), kernel, recompute)


def _title(module, mha, what: str) -> str:
    layer = "full" if module.sliding_window is None else f"sliding {module.sliding_window}"
    return (f"{what} transformers Gemma3Attention ({layer} layer, rope_theta={mha.rope_theta:g}; H={mha.num_heads}, "
            f"Hkv={mha.num_kv_heads}, d={mha.head_dim}, scale={mha.scale:.4g}, {mha.impl})")  # fmt: skip


def crosscheck_hf_gemma3_attention(
    module: Gemma3Attention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    positions=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
    kernel=None,
    recompute: bool = False,
) -> CrosscheckReport:
    """A transformers ``Gemma3Attention`` (eager) against ``from_hf_gemma3_attention(module)`` and torch autograd.

    Arguments and rows as ``gemma2.crosscheck_hf_gemma2_attention``, with dL/dq_norm and dL/dk_norm; HF's (cos, sin)
    are made in float64 with the layer type's base. Default pass threshold 1e-10 in float64 (HF's softmax and
    RMSNorms kept in float64, the as-shipped gap in a note), 1e-5 in float32.
    """
    mha = _imported(module, kernel, recompute)
    return crosscheck_decoder_attention(_kind(module), module, mha, _title(module, mha, "ours vs"), hidden_states,
                                        attention_mask, positions, d_output, rng, rtol)  # fmt: skip


def crosscheck_hf_gemma3_kv_cache(
    module: Gemma3Attention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    prefill: int = 3,
    chunk: int = 1,
    rtol: float | None = None,
    kernel=None,
) -> CrosscheckReport:
    """Decoding: ours (``KVCache``) against ``Gemma3Attention`` with a transformers ``DynamicCache``; arguments and
    rows as ``gemma2.crosscheck_hf_gemma2_kv_cache``."""
    mha = _imported(module, kernel, False)
    title = _title(module, mha, f"KV cache (prefill {prefill}, then {chunk} a call) vs")
    return crosscheck_decoder_kv_cache(_kind(module), module, mha, title, hidden_states, attention_mask, prefill,
                                       chunk, rtol)  # fmt: skip


def hf_gemma3_attention(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    layer: str = "sliding_attention",
    sliding_window: int = 3,
    rope_local_base_freq: float = 10.0,
    rope_theta: float = 1000.0,
    rope_scaling: dict | None = None,
    query_pre_attn_scalar: float = 10,
    bias: bool = True,
    dtype=np.float64,
    seed: int = 0,
    init_std: float = 0.5,
) -> Gemma3Attention:
    """A small random ``Gemma3Attention`` (eager) of a two-layer config, sliding then full: layer 0 for
    ``layer="sliding_attention"`` (base ``rope_local_base_freq``), 1 for "full_attention" (base ``rope_theta``,
    scaled by ``rope_scaling`` as Gemma 3's global layers: {"rope_type": "linear", "factor": 8.0}).
    Weights N(0, init_std²), norm weights N(0, 0.3²) (Gemma's are offsets from 1), biases N(0, 0.1²)."""
    torch = require("torch")
    require("transformers")
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention

    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": rope_local_base_freq},
            "full_attention": {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})}}  # fmt: skip
    cfg = Gemma3TextConfig(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
        query_pre_attn_scalar=query_pre_attn_scalar, sliding_window=sliding_window, num_hidden_layers=2,
        layer_types=list(GEMMA3_LAYER_TYPES), rope_parameters=rope, attention_bias=bias, vocab_size=16,
        intermediate_size=2 * hidden_size, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    module = Gemma3Attention(cfg, GEMMA3_LAYER_TYPES.index(layer)).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else (0.1 if name.endswith("bias") else init_std))
    return module
