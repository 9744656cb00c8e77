"""Weights across frameworks: torch.nn.MultiheadAttention <-> MultiHeadAttention, HF BertAttention -> ours.

The name maps say where each tensor goes (``names``); values are copied exactly, the dtype follows the source.
They are read as ``names.X`` at call time, so a test that swaps a map there reaches every import and export.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..attention import MultiHeadAttention
from . import names
from ._lazy import require

if TYPE_CHECKING:  # for the annotations only: never imported at run time here
    import torch
    from transformers.models.bert.modeling_bert import BertAttention


def numpy_dtype_of(torch_dtype) -> np.dtype:
    """A torch dtype -> the NumPy dtype of the same name, or ValueError naming what mha_numpy supports."""
    name = str(torch_dtype).removeprefix("torch.")
    if name not in ("float16", "float32", "float64"):
        raise ValueError(f"the module's dtype is {torch_dtype}; mha_numpy supports float16, float32 and float64")
    return np.dtype(name)


def module_with_params(E, H, bias, kdim, vdim, dropout, dtype, params, **options) -> MultiHeadAttention:
    """A module with the given weights; ``options`` go to the constructor (e.g. num_kv_heads, rope_theta)."""
    mha = MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, dropout=dropout, dtype=dtype, rng=0, **options)
    for name, p in mha.params.items():
        if params[name].shape != p.shape:
            raise ValueError(f"{name}: the imported tensor has shape {params[name].shape}, expected {p.shape}")
    mha.params = {name: params[name] for name in mha.params}  # same keys and order as a fresh module
    return mha


def from_torch_mha(module: torch.nn.MultiheadAttention) -> MultiHeadAttention:
    """``torch.nn.MultiheadAttention`` -> ``MultiHeadAttention`` with copies of the same weights.

    Packed ``in_proj_weight`` or separate ``q/k/v_proj_weight`` (kdim / vdim), with or without bias,
    either ``batch_first`` (our arrays are always (B, L, E)); the dtype follows the module.
    ``add_bias_kv=True`` (a learned key and value appended, ``bias_k``, ``bias_v``) and ``add_zero_attn=True``
    (a zero key and value appended) become the module's options of the same names.
    """
    torch = require("torch")
    if not isinstance(module, torch.nn.MultiheadAttention):
        raise ValueError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
    bias_kv = module.bias_k is not None
    if bias_kv != (module.bias_v is not None):
        raise ValueError("bias_k and bias_v must both be present (add_bias_kv=True) or both absent")
    bias = module.in_proj_bias is not None
    if bias != (module.out_proj.bias is not None):
        raise ValueError("in_proj_bias and out_proj.bias must both be present or both absent")
    packed = bool(module._qkv_same_embed_dim)
    dtype = numpy_dtype_of(module.out_proj.weight.dtype)
    name_map = names.torch_mha_name_map(module.embed_dim, packed=packed, bias=bias, bias_kv=bias_kv)
    params = names.params_from_state(dict(module.named_parameters()), name_map)
    sizes = (module.embed_dim, module.num_heads, bias, module.kdim, module.vdim, module.dropout, dtype)
    return module_with_params(*sizes, params, add_bias_kv=bias_kv, add_zero_attn=bool(module.add_zero_attn))


def to_torch_mha(mha: MultiHeadAttention) -> torch.nn.MultiheadAttention:
    """``MultiHeadAttention`` -> ``torch.nn.MultiheadAttention(batch_first=True)`` with the same weights.

    Packed ``in_proj_weight`` when kdim == vdim == E (torch decides this), separate weights otherwise.
    The dtype follows ``mha``; values are copied exactly. An option torch MHA cannot express (any option in effect
    whose declaration, ``steps.Option.exports``, lacks "torch_mha") is refused, naming it.
    """
    missing = mha.config.not_exportable("torch_mha")  # every option in effect that its declaration does not export
    if missing:
        raise ValueError(f"torch.nn.MultiheadAttention has no {missing[0]}: this module cannot be exported to it")
    torch = require("torch")
    module = torch.nn.MultiheadAttention(
        mha.embed_dim,
        mha.num_heads,
        dropout=mha.dropout,
        bias=mha.bias,
        kdim=mha.kdim,
        vdim=mha.vdim,
        batch_first=True,
        dtype=getattr(torch, mha.dtype.name),
        add_bias_kv=mha.add_bias_kv,
        add_zero_attn=mha.add_zero_attn,
    )
    named = dict(module.named_parameters())
    name_map = names.torch_mha_name_map(mha.embed_dim, module._qkv_same_embed_dim, mha.bias, mha.add_bias_kv)
    with torch.no_grad():
        for ours, (torch_name, rows) in name_map.items():
            target = named[torch_name] if rows is None else named[torch_name][rows]
            value = mha.params[ours].reshape(target.shape) if ours in ("bias_k", "bias_v") else mha.params[ours]
            if tuple(target.shape) != value.shape:
                raise ValueError(f"{ours} has shape {mha.params[ours].shape}, torch expects {tuple(target.shape)}")
            target.copy_(torch.from_numpy(value))
    return module


def from_hf_bert_attention(module: BertAttention) -> MultiHeadAttention:
    """Hugging Face ``BertAttention`` -> ``MultiHeadAttention`` (self.query/key/value and output.dense).

    Only multi-head attention is imported. ``BertSelfOutput`` (``module.output``) then adds the input
    back and applies ``LayerNorm``: ``LayerNorm(dense(context) + hidden_states)``. That residual and
    LayerNorm are not part of MHA and not modelled here (``crosscheck_hf_bert_attention`` checks them
    separately, forward only, with ``models.layers.layer_norm``).
    """
    self_attn = getattr(module, "self", None)
    if self_attn is None or not all(hasattr(self_attn, n) for n in ("query", "key", "value")):
        raise ValueError(f"module must be a transformers BertAttention (with .self.query/key/value), got {module!r}")
    E = self_attn.query.in_features
    H = self_attn.num_attention_heads
    if self_attn.all_head_size != E:
        raise ValueError(f"all_head_size={self_attn.all_head_size} differs from hidden_size={E}; not modelled")
    scaling = getattr(self_attn, "scaling", self_attn.attention_head_size**-0.5)  # older transformers: implicit
    if not np.isclose(scaling, self_attn.attention_head_size**-0.5, rtol=1e-15):
        raise ValueError(f"BertSelfAttention.scaling={scaling} is not 1/sqrt(head size); not modelled")
    dtype = numpy_dtype_of(self_attn.query.weight.dtype)
    params = names.params_from_state(dict(module.named_parameters()), names.HF_BERT_NAME_MAP)
    return module_with_params(E, H, True, E, E, float(self_attn.dropout.p), dtype, params)
