"""Llama 4's attention layers from Hugging Face ``Llama4TextAttention``: the importer (its checks: ``llama4_check``).

torch and transformers are imported lazily, inside the functions. A layer of Llama 4 is one of two kinds, by
``config.no_rope_layers[layer_idx]`` (1: RoPE, 0: NoPE; by default every ``no_rope_layer_interval``-th layer is NoPE):

======================  ======================================  ==============================================
ours                    Llama4TextAttention                     RoPE layer / NoPE layer
======================  ======================================  ==============================================
W_q ... W_o, b_q ...    q_proj, k_proj, v_proj, o_proj          as they are (biases with attention_bias)
rope_theta,             config.rope_parameters                  its base and scaling (Llama 4's "llama3"),
rope_scaling,                                                   pairs (2i, 2i + 1): Llama 4's complex form /
rope_interleave=True                                            None: no RoPE
qk_norm,                use_qk_norm: ``Llama4TextL2Norm``       x · rsqrt(mean(x²) + rms_norm_eps) of each head
qk_norm_weight=False    (no weight), after RoPE                 of Q, K (commutes with RoPE) / none
log_length_scale,       attn_temperature_tuning, attn_scale,    none / each query's scores times
log_length_floor        floor_scale                             log(⌊(p + 1) / floor⌋ + 1) · attn_scale + 1
(the mask)              layer_types                             "chunked_attention": ``masks.chunked_causal_mask``
                                                                of attention_chunk_size / "full_attention": causal
======================  ======================================  ==============================================

``llama4_layer_options(config, layer_idx)`` is that decision as the module's options, ``llama4_layer_mask`` the
layer's mask. Llama 4 turns features (2i, 2i + 1) of a head together (``view_as_complex``): ``Rope`` with
``rope_interleave=True``, by the table of its ``rope_parameters`` (``mha_numpy.rope_scaling``). The L2 norm and the
temperature do not see the layout.

The cross-checks against transformers (one call, decoding, HF's float32 steps in float64): ``llama4_check``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..attention import MultiHeadAttention
from ._lazy import require
from .convert import module_with_params, numpy_dtype_of
from .llama import PROJECTIONS, hf_rope_theta
from .names import params_from_state
from .rope import hf_rope_scaling

if TYPE_CHECKING:  # annotations only
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

LAYER_TYPES = ("chunked_attention", "full_attention")


def llama4_layer_options(config, layer_idx: int) -> dict:
    """The options of Llama 4's layer ``layer_idx`` for ``MultiHeadAttention``: RoPE (rope_theta) where
    ``no_rope_layers[layer_idx]`` is 1, with the weightless QK-norm where ``use_qk_norm``; no RoPE (NoPE) where it
    is 0, with the attention temperature where ``attn_temperature_tuning``. ValueError naming layer_idx when the
    config has no such layer."""
    flags = list(config.no_rope_layers)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, (int, np.integer)) or not 0 <= layer_idx < len(flags):
        raise ValueError(f"layer_idx must be an int in [0, {len(flags)}) (config.no_rope_layers), got {layer_idx!r}")
    if not flags[layer_idx]:  # NoPE: no rotary, the temperature of long contexts
        if not config.attn_temperature_tuning:
            return {"rope_theta": None}
        return {"rope_theta": None, "log_length_scale": float(config.attn_scale),
                "log_length_floor": float(config.floor_scale)}  # fmt: skip
    options = {"rope_theta": hf_rope_theta(config, scaled=True), "rope_interleave": True}  # pairs (2i, 2i + 1)
    if hf_rope_scaling(config) is not None:
        options["rope_scaling"] = hf_rope_scaling(config)  # Llama 4's own: "llama3"
    if config.use_qk_norm:
        options.update(qk_norm=True, qk_norm_weight=False, qk_norm_eps=float(config.rms_norm_eps))
    return options


def llama4_layer_mask(config, layer_idx: int, Lq: int, Lk: int | None = None, attention_mask=None):
    """The mask of Llama 4's layer ``layer_idx`` for Lq queries, the last of Lk positions: ``chunked_causal_mask``
    of ``attention_chunk_size`` (chunks counted from each item's first real token, transformers' rule) on a
    "chunked_attention" layer, causal on a "full_attention" one; a ``StructuredMask`` (the chunked kernel skips its
    tiles), ANDed with the padding of an HF ``attention_mask`` (B, Lk) (1 = keep). ValueError naming the layer type
    when it is neither."""
    kind, Lk = config.layer_types[layer_idx], Lq if Lk is None else Lk
    if kind not in LAYER_TYPES:
        raise ValueError(f"config.layer_types[{layer_idx}] must be one of {LAYER_TYPES}, got {kind!r}")
    am = None if attention_mask is None else np.asarray(attention_mask)
    if kind == "chunked_attention":
        left = 0 if am is None else (np.cumsum(am, axis=-1) == 0).sum(axis=-1)  # (B,) leading pads
        mask = M.chunked_causal_mask(Lq, Lk, config.attention_chunk_size, left_padding=left, align="bottom-right",
                                     structured=True)  # fmt: skip
    else:
        mask = M.causal_mask(Lq, Lk, align="bottom-right", structured=True)
    return mask if am is None else mask & M.padding_mask(attention_mask=am)


def llama4_name_map(module) -> dict:
    """Where each of our parameters lives in ``module``: every projection as it is; biases only with
    attention_bias."""
    out = {f"W_{x}": (f"{x}_proj.weight", None) for x in "qkvo"}
    if module.q_proj.bias is not None:
        out.update({f"b_{x}": (f"{x}_proj.bias", None) for x in "qkvo"})
    return out


def from_hf_llama4_attention(module: Llama4TextAttention) -> MultiHeadAttention:
    """Hugging Face ``Llama4TextAttention`` -> ``MultiHeadAttention`` with its layer's options
    (``llama4_layer_options``) and its weights (``llama4_name_map``).

    Self-attention with E = hidden_size, the config's head_dim, GQA from num_key_value_heads, scores scaled by
    d^-1/2. The layer's mask is not part of the module: pass ``llama4_layer_mask(config, layer_idx, L)``."""
    names = (*PROJECTIONS, "config", "layer_idx", "use_rope", "head_dim")
    if not all(hasattr(module, n) for n in names):
        raise ValueError(f"module must be a transformers Llama4TextAttention ({', '.join(names)}), got {module!r}")
    cfg, d = module.config, module.head_dim
    if not np.isclose(module.scaling, d**-0.5, rtol=1e-15):
        raise ValueError(f"Llama4TextAttention.scaling={module.scaling} is not 1/sqrt(head_dim); not modelled")
    has_bias = {module.q_proj.bias is not None, module.o_proj.bias is not None}
    if len(has_bias) != 1:
        raise ValueError("q/k/v/o_proj biases must all be present or all absent")
    options = llama4_layer_options(cfg, module.layer_idx)
    params = params_from_state(dict(module.named_parameters()), llama4_name_map(module))
    E, dtype = module.q_proj.in_features, numpy_dtype_of(module.q_proj.weight.dtype)
    return module_with_params(E, cfg.num_attention_heads, has_bias.pop(), E, E, float(cfg.attention_dropout), dtype,
                              params, num_kv_heads=cfg.num_key_value_heads, head_dim=d, **options)  # fmt: skip


def hf_llama4_attention(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    layer_idx: int = 0,
    num_layers: int = 4,
    chunk_size: int | None = 3,
    use_qk_norm: bool = True,
    attn_temperature_tuning: bool = True,
    attn_scale: float = 0.7,
    floor_scale: float = 2,
    rope_theta: float = 100.0,
    rope_scaling: dict | None = None,
    bias: bool = True,
    dtype=np.float64,
    seed: int = 0,
    init_std: float = 0.5,
) -> Llama4TextAttention:
    """A small random ``Llama4TextAttention`` (eager), layer ``layer_idx`` of ``num_layers``: the last NoPE (full
    attention, the temperature: floor_scale 2, attn_scale 0.7 move it within a few positions), the others RoPE
    (chunked, the L2 norm; rope_scaling: beside the base, as Llama 4's "llama3"). Weights N(0, init_std²)."""
    torch = require("torch")
    require("transformers")
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    rope = {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})}
    cfg = Llama4TextConfig(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
        num_hidden_layers=num_layers, no_rope_layer_interval=num_layers, attention_chunk_size=chunk_size,
        use_qk_norm=use_qk_norm, attn_temperature_tuning=attn_temperature_tuning, attn_scale=attn_scale,
        floor_scale=floor_scale, rope_parameters=rope, attention_bias=bias, vocab_size=16, attn_implementation="eager",
        intermediate_size=2 * hidden_size, intermediate_size_mlp=2 * hidden_size)  # fmt: skip
    torch.manual_seed(seed)
    module = Llama4TextAttention(cfg, layer_idx=layer_idx).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(0.0, 0.1 if name.endswith("bias") else init_std)  # zero biases would hide bias bugs
    return module
