"""Kimi Delta Attention against transformers' ``KimiLinearDeltaAttention``: the importer, the checks (declared for
``harness.compare`` by ``delta_layers``).

The parameters are in ``recurrent.kimi.KimiDeltaAttention``'s table. The module computes in float32 inside whatever
its dtype: the forget gate (``.float()``), the core (``chunk_kimi_delta_attention`` for a prefill,
``recurrent_kimi_delta_attention`` for one token, both cast to float32) and ``KimiLinearRMSNormGated`` (all of it
in float32), and its cache stores the recurrent state as float32. ``kda_in_float64`` runs its own forward with
float32 meaning float64 for the call (``lift.float32_is_float64``), float64 end to end. torch and transformers are
imported lazily.
"""

from __future__ import annotations

import numpy as np

from ..recurrent.kimi import KimiDeltaAttention
from ._lazy import require
from .delta_layers import LayerKind, decode_hf, layer_sides, params_as_ours
from .harness import compare
from .lift import float32_is_float64
from .report import CrosscheckReport

HF_KIMI_KDA_NAME_MAP = {
    "W_q": "q_proj.weight",
    "W_k": "k_proj.weight",
    "W_v": "v_proj.weight",
    "conv_weight": "conv1d.weight",
    "W_fa": "forget_gate.f_a_proj.weight",
    "W_fb": "forget_gate.f_b_proj.weight",
    "dt_bias": "forget_gate.dt_bias",
    "A_log": "forget_gate.A_log",
    "W_b": "b_proj.weight",
    "W_ga": "g_a_proj.weight",
    "W_gb": "g_b_proj.weight",
    "norm_weight": "o_norm.weight",
    "W_o": "o_proj.weight",
}
"""Our KimiDeltaAttention's parameters -> KimiLinearDeltaAttention's (reshaped: conv (C, 1, K), dt_bias (H·d,),
A_log (1, 1, H, 1))."""


def _config(**sizes):
    from transformers import KimiLinearConfig

    return KimiLinearConfig(num_hidden_layers=1, vocab_size=16, intermediate_size=32, num_attention_heads=2,
                            num_key_value_heads=1, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                            **sizes)  # fmt: skip


def hf_kimi_delta_attention(
    hidden_size: int = 16,
    num_heads: int = 3,
    head_dim: int = 4,
    conv_kernel_size: int = 4,
    rms_norm_eps: float = 1e-5,
    dtype=np.float64,
    seed: int = 0,
):
    """A small random transformers ``KimiLinearDeltaAttention`` (layer 0 of a tiny ``KimiLinearConfig``).

    Weights N(0, 0.3²), the conv's N(0, 0.5²), the norm's N(1, 0.3²), dt_bias N(0, 0.5²), A_log N(−1, 0.5²): on
    the tests' inputs the decays e^g spread from 0.61 to 0.96 (5th to 95th percentile), a memory of a few tokens."""
    torch = require("torch")
    require("transformers")
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    cfg = _config(hidden_size=hidden_size, linear_num_heads=num_heads, linear_head_dim=head_dim,
                  linear_conv_kernel_dim=conv_kernel_size, rms_norm_eps=rms_norm_eps)  # fmt: skip
    torch.manual_seed(seed)
    module = KimiLinearDeltaAttention(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name))
    mean = {"o_norm.weight": 1.0, "forget_gate.A_log": -1.0}
    std = {"conv1d.weight": 0.5, "forget_gate.dt_bias": 0.5, "forget_gate.A_log": 0.5}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(mean.get(name, 0.0), std.get(name, 0.3))
    return module


def from_hf_kimi_delta_attention(module, chunk_size: int = 64, impl: str = "chunked") -> KimiDeltaAttention:
    """transformers ``KimiLinearDeltaAttention`` -> our ``KimiDeltaAttention``, same weights (copied), same dtype."""
    if module.activation != "silu" or module.conv1d.bias is not None:
        raise ValueError(f"the module's conv must be bias-free with silu, got activation {module.activation!r}")
    sizes = (module.hidden_size, module.num_heads, module.head_dim, module.conv_kernel_size, module.layer_norm_epsilon)
    shapes = KimiDeltaAttention(*sizes, rng=0).param_shapes()
    params = params_as_ours(dict(module.named_parameters()), HF_KIMI_KDA_NAME_MAP, shapes)
    return KimiDeltaAttention(*sizes, params=params, dtype=params["W_o"].dtype, chunk_size=chunk_size, impl=impl)


def kda_in_float64(module):
    """Within the block the module computes in float64 where it says float32 (``lift.float32_is_float64``; the
    module is not edited): transformers' own forward, gates, core and gated RMSNorm, unedited."""
    return float32_is_float64(require("torch"))


KIND = LayerKind("KimiLinearDeltaAttention", HF_KIMI_KDA_NAME_MAP, lambda: _config(layer_types=["linear_attention"]))


def crosscheck_hf_kimi_delta_attention(
    module, hidden_states, attention_mask=None, d_output=None, rng=0, rtol=None, chunk_size: int = 64,
    impl: str = "chunked",
) -> CrosscheckReport:  # fmt: skip
    """A transformers ``KimiLinearDeltaAttention`` against ``from_hf_kimi_delta_attention(module)``: output, the
    state after the call, dL/dx and every parameter's gradient (arguments and thresholds as
    ``qwen3_next_deltanet.crosscheck_hf_qwen3_next_deltanet``)."""
    layer = from_hf_kimi_delta_attention(module, chunk_size=chunk_size, impl=impl)
    title = (f"ours vs transformers KimiLinearDeltaAttention (H={layer.num_heads}, d={layer.head_k_dim}, "
             f"K={layer.conv_kernel_size}, {impl}{', padding' if attention_mask is not None else ''})")  # fmt: skip
    return compare(title, *layer_sides(KIND, module, layer, hidden_states, attention_mask, d_output, rng, rtol))


def decode_hf_kimi_delta_attention(module, hidden_states, prefill: int = 3, lifted: bool = True):
    """transformers' decoding with its cache (a prefill, then one token a call) -> (outputs, DeltaNetState)."""
    return decode_hf(KIND, module, hidden_states, prefill, lifted)
