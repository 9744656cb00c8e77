"""Gated DeltaNet against transformers' ``Qwen3NextGatedDeltaNet``: the importer, the checks (``delta_layers``).

torch and transformers are imported lazily, inside the functions. The parameters (``recurrent.qwen3_next``):

==============  ===================  =========================================================
ours            Qwen3NextGatedDeltaNet   shape
==============  ===================  =========================================================
W_qkvz          in_proj_qkvz.weight  (2·Hk·dk + 2·Hv·dv, E), grouped by key head
W_ba            in_proj_ba.weight    (2·Hv, E)
conv_weight     conv1d.weight        ours (C, K), theirs (C, 1, K); C = 2·Hk·dk + Hv·dv
dt_bias, A_log  dt_bias, A_log       (Hv,)
norm_weight     norm.weight          (dv,)
W_out           out_proj.weight      (E, Hv·dv)
==============  ===================  =========================================================

The module casts to float32 inside whatever its dtype (measured: a float64 module gives float32-rounded outputs):
the gates (``A_log.float()``, ``a.float()``), the core (``torch_chunk_gated_delta_rule`` /
``torch_recurrent_gated_delta_rule`` cast q, k, v, g, β to float32) and ``Qwen3NextRMSNormGated`` (x̂ and silu(z) in
float32). ``deltanet_in_float64`` runs the module's own forward with float32 meaning float64 for the call
(``lift.float32_is_float64``): the float64 check is against that, float64 end to end, and the as-shipped gap goes
in the report's notes. The attention mask is transformers' (B, L) 0/1 padding mask, which
the module applies by zeroing the padding tokens' inputs (``apply_mask_to_padding_states``); ours takes it as bool.
"""

from __future__ import annotations

import numpy as np

from ..recurrent.qwen3_next import GatedDeltaNet
from ._lazy import require
from .delta_layers import LayerKind, decode_hf, layer_sides, params_as_ours
from .harness import compare
from .lift import float32_is_float64
from .report import CrosscheckReport

HF_QWEN3_NEXT_DELTANET_NAME_MAP = {
    "W_qkvz": "in_proj_qkvz.weight",
    "W_ba": "in_proj_ba.weight",
    "conv_weight": "conv1d.weight",
    "dt_bias": "dt_bias",
    "A_log": "A_log",
    "norm_weight": "norm.weight",
    "W_out": "out_proj.weight",
}
"""Our GatedDeltaNet's parameters -> Qwen3NextGatedDeltaNet's (conv1d.weight (C, 1, K) is ours (C, K))."""


def hf_qwen3_next_deltanet(
    hidden_size: int = 16,
    num_k_heads: int = 2,
    num_v_heads: int = 6,
    head_k_dim: int = 4,
    head_v_dim: int = 3,
    conv_kernel_size: int = 4,
    rms_norm_eps: float = 1e-6,
    dtype=np.float64,
    seed: int = 0,
):
    """A small random transformers ``Qwen3NextGatedDeltaNet`` (layer 0 of a tiny ``Qwen3NextConfig``).

    Weights N(0, 0.3²), the conv's N(0, 0.5²), the norm's N(1, 0.3²) (all ones would hide a swapped weight),
    dt_bias N(0, 0.5²), A_log N(0, 0.5²): on the tests' inputs (N(0, 1)) the decays e^g spread from 0.002 to 0.84
    (5th and 95th percentiles, median 0.37): some heads forget at once, some remember a few tokens.
    """
    torch = require("torch")
    require("transformers")
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = Qwen3NextConfig(
        hidden_size=hidden_size, linear_num_key_heads=num_k_heads, linear_num_value_heads=num_v_heads,
        linear_key_head_dim=head_k_dim, linear_value_head_dim=head_v_dim, linear_conv_kernel_dim=conv_kernel_size,
        rms_norm_eps=rms_norm_eps, num_hidden_layers=1, vocab_size=16, intermediate_size=2 * hidden_size,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    torch.manual_seed(seed)
    module = Qwen3NextGatedDeltaNet(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name))
    std = {"conv1d.weight": 0.5, "dt_bias": 0.5, "A_log": 0.5}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(1.0 if name == "norm.weight" else 0.0, std.get(name, 0.3))
    return module


def from_hf_qwen3_next_deltanet(module, chunk_size: int = 64, impl: str = "chunked") -> GatedDeltaNet:
    """transformers ``Qwen3NextGatedDeltaNet`` -> our ``GatedDeltaNet``, same weights (copied), same dtype."""
    if module.activation != "silu":
        raise ValueError(f"the module's activation is {module.activation!r}; GatedDeltaNet's conv uses silu")
    if module.conv1d.bias is not None:
        raise ValueError("the module's conv1d has a bias; GatedDeltaNet's conv has none (as Qwen3-Next's)")
    sizes = (module.hidden_size, module.num_k_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim,
             module.conv_kernel_size, module.layer_norm_epsilon)  # fmt: skip
    shapes = GatedDeltaNet(*sizes, rng=0).param_shapes()
    params = params_as_ours(dict(module.named_parameters()), HF_QWEN3_NEXT_DELTANET_NAME_MAP, shapes)
    return GatedDeltaNet(*sizes, params=params, dtype=params["W_out"].dtype, chunk_size=chunk_size, impl=impl)


def deltanet_in_float64(module):
    """Within the block the module computes in float64 where it says float32 (``lift.float32_is_float64``; the
    module is not edited): transformers' own forward, gates, core and gated RMSNorm, unedited."""
    return float32_is_float64(require("torch"))


def _config():
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(num_hidden_layers=1, layer_types=["linear_attention"])


KIND = LayerKind("Qwen3NextGatedDeltaNet", HF_QWEN3_NEXT_DELTANET_NAME_MAP, _config)


def crosscheck_hf_qwen3_next_deltanet(
    module, hidden_states, attention_mask=None, d_output=None, rng=0, rtol=None, impl: str = "chunked",
    chunk_size: int = 64,
) -> CrosscheckReport:  # fmt: skip
    """A transformers ``Qwen3NextGatedDeltaNet`` against ``from_hf_qwen3_next_deltanet(module)``: output, the
    state after the call (conv and recurrent), dL/dx and every parameter's gradient by torch autograd.

    hidden_states (B, L, E); attention_mask (B, L) bool (True = a token) or None. float64: against the module with
    its casts lifted (``deltanet_in_float64``), default 1e-10, the as-shipped gap in a note; float32: against the
    module as shipped, default 1e-5.
    """
    layer = from_hf_qwen3_next_deltanet(module, chunk_size=chunk_size, impl=impl)
    title = (f"ours vs transformers Qwen3NextGatedDeltaNet (Hk={layer.num_k_heads}, Hv={layer.num_v_heads}, "
             f"dk={layer.head_k_dim}, dv={layer.head_v_dim}, K={layer.conv_kernel_size}, {impl}"
             f"{', padding' if attention_mask is not None else ''})")  # fmt: skip
    return compare(title, *layer_sides(KIND, module, layer, hidden_states, attention_mask, d_output, rng, rtol))


def decode_hf_qwen3_next_deltanet(module, hidden_states, prefill: int = 3, lifted: bool = True):
    """transformers' decoding with its cache (a prefill, then one token a call) -> (outputs, DeltaNetState)."""
    return decode_hf(KIND, module, hidden_states, prefill, lifted)
