"""QK-norm against Hugging Face Qwen3: the importer, one call and decoding with the cache.

torch and transformers are imported lazily, inside the functions. ``Qwen3Attention`` with E = hidden_size,
H = num_attention_heads, Hkv = num_key_value_heads, d = head_dim (need not be E / H):

======================  ==============================  ============================================
ours                    Qwen3Attention                  shape / value
======================  ==============================  ============================================
W_q, b_q                q_proj                          (H·d, E), (H·d,)
W_k, b_k                k_proj                          (Hkv·d, E), (Hkv·d,)
W_v, b_v                v_proj                          (Hkv·d, E), (Hkv·d,)
W_o, b_o                o_proj                          (E, H·d), (E,)  (biases only with attention_bias)
q_norm, k_norm          q_norm.weight, k_norm.weight    (d,): one RMSNorm over each head's d features,
qk_norm_eps             config.rms_norm_eps             shared by the heads, before RoPE
rope_theta              config.rope_parameters          (rope_type "default" only)
(the mask)              sliding_window                  a sliding layer's window (use_sliding_window,
                                                        layers from max_window_layers on); else causal
======================  ==============================  ============================================

``Qwen3RMSNorm`` rounds through float32 whatever the dtype (it casts x to float32 for the statistics and back),
and the eager softmax is float32: the float64 check runs both in float64 (``rms_norm_in_float64``,
``decoder_attention``) and reports the as-shipped gap.

OLMo 2 normalises differently: ``Olmo2Attention`` applies one RMSNorm to the whole projection, q_proj(x) of
width H·d (weights (H·d,)) and k_proj(x) of width Hkv·d, before the head split, so its statistic mixes the heads.
Only Qwen3's per-head form is built (``qk_norm=True``); docs/derivation.md § 22 says what OLMo 2's would take.
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
from .names import HF_LLAMA_NAME_MAP
from .report import CrosscheckReport

if TYPE_CHECKING:  # annotations only
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

HF_QWEN3_NAME_MAP = {**HF_LLAMA_NAME_MAP, "q_norm": ("q_norm.weight", None), "k_norm": ("k_norm.weight", None)}
"""Qwen3Attention's parameters as ours (the projections' biases exist only with ``attention_bias=True``)."""


def _name_map(bias: bool):
    return {ours: entry for ours, entry in HF_QWEN3_NAME_MAP.items() if bias or not ours.startswith("b_")}


@contextmanager
def rms_norm_in_float64(module):
    """Within the block, the module's ``q_norm`` and ``k_norm`` (``Qwen3RMSNorm``) compute their formula in the
    input's dtype, without the float32 round trip. Restored afterwards (the class's forward again)."""
    torch = require("torch")

    def rms_norm(self, x):  # Qwen3RMSNorm.forward without .to(torch.float32) and back
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    norms = (module.q_norm, module.k_norm)
    for m in norms:
        m.forward = types.MethodType(rms_norm, m)
    try:
        yield module
    finally:
        for m in norms:
            del m.forward


def _kind(module) -> DecoderAttention:
    name_map = _name_map(module.q_proj.bias is not None)
    return DecoderAttention("Qwen3Attention", name_map, "Qwen3RotaryEmbedding", rms_norm_in_float64, " and QK-norm")


def from_hf_qwen3_attention(module: Qwen3Attention) -> MultiHeadAttention:
    """Hugging Face ``Qwen3Attention`` -> ``MultiHeadAttention(qk_norm=True, head_dim=...)``, same weights.

    Self-attention with E = hidden_size, the config's head_dim (H·d need not be E), GQA from num_key_value_heads,
    RoPE from the config, QK-norm with q_norm, k_norm (d,) and eps = rms_norm_eps, scores scaled by d^-1/2.
    Causality and a sliding layer's window are not part of the module: pass
    ``decoder_attention.layer_mask(B, Lq, Lk, module.sliding_window)`` as the mask (or a ``KVCache`` with it).
    """
    d = llama_like_sizes(module, "Qwen3Attention", needs=("q_norm", "k_norm"))[-1]
    if module.q_norm.weight.shape != (d,) or module.k_norm.weight.shape != (d,):
        raise ValueError(f"q_norm, k_norm must be per head, ({d},); got {tuple(module.q_norm.weight.shape)}")
    eps = {module.q_norm.variance_epsilon, module.k_norm.variance_epsilon}
    if len(eps) != 1:
        raise ValueError(f"q_norm and k_norm have different eps {sorted(eps)}; the module has one qk_norm_eps")
    return from_llama_like(module, "Qwen3Attention", HF_QWEN3_NAME_MAP, qk_norm=True, qk_norm_eps=float(eps.pop()))


def _imported(module, kernel, recompute: bool) -> MultiHeadAttention:
    return on_kernel(from_hf_qwen3_attention(module), kernel, recompute)


def _title(module, mha, what: str) -> str:
    layer = "full" if module.sliding_window is None else f"sliding {module.sliding_window}"
    return (f"{what} transformers Qwen3Attention (H={mha.num_heads}, Hkv={mha.num_kv_heads}, d={mha.head_dim}, "
            f"QK-norm eps={mha.qk_norm_eps:g}, {layer} layer, {mha.impl})")  # fmt: skip


def crosscheck_hf_qwen3_attention(
    module: Qwen3Attention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    positions=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
    kernel=None,
    recompute: bool = False,
) -> CrosscheckReport:
    """A transformers ``Qwen3Attention`` (eager) against ``from_hf_qwen3_attention(module)`` and torch autograd.

    Arguments and rows as ``gemma2.crosscheck_hf_gemma2_attention``; Q and K are compared after QK-norm and RoPE,
    and the rows include dL/dq_norm and dL/dk_norm. Default pass threshold 1e-10 in float64 (HF's softmax and
    RMSNorms kept in float64, the as-shipped gap in a note), 1e-5 in float32.
    """
    mha = _imported(module, kernel, recompute)
    return crosscheck_decoder_attention(_kind(module), module, mha, _title(module, mha, "ours vs"), hidden_states,
                                        attention_mask, positions, d_output, rng, rtol)  # fmt: skip


def crosscheck_hf_qwen3_kv_cache(
    module: Qwen3Attention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    prefill: int = 3,
    chunk: int = 1,
    rtol: float | None = None,
    kernel=None,
) -> CrosscheckReport:
    """Decoding: ours (``KVCache``) against ``Qwen3Attention`` with a transformers ``DynamicCache``; arguments and
    rows as ``gemma2.crosscheck_hf_gemma2_kv_cache`` (the cached keys are after QK-norm and RoPE)."""
    mha = _imported(module, kernel, False)
    title = _title(module, mha, f"KV cache (prefill {prefill}, then {chunk} a call) vs")
    return crosscheck_decoder_kv_cache(_kind(module), module, mha, title, hidden_states, attention_mask, prefill,
                                       chunk, rtol)  # fmt: skip


def hf_qwen3_attention(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None = None,
    sliding_window: int | None = None,
    rope_theta: float = 10000.0,
    bias: bool = False,
    rms_norm_eps: float = 1e-6,
    dtype=np.float64,
    seed: int = 0,
    init_std: float = 0.5,
) -> Qwen3Attention:
    """A small random transformers ``Qwen3Attention`` (layer 0, eager) for the cross-checks.

    head_dim None: hidden_size // num_heads; sliding_window an int makes layer 0 a sliding layer
    (use_sliding_window=True, max_window_layers=0). Weights N(0, init_std²), norm weights N(1, 0.3²) (all ones
    would hide a swapped weight), nonzero biases when ``bias``.
    """
    torch = require("torch")
    require("transformers")
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    cfg = Qwen3Config(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads, use_sliding_window=sliding_window is not None,
        sliding_window=sliding_window, max_window_layers=0, num_hidden_layers=1, intermediate_size=2 * hidden_size,
        vocab_size=16, rope_theta=rope_theta, attention_bias=bias, rms_norm_eps=rms_norm_eps,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    module = Qwen3Attention(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.3)
            else:
                p.normal_(0.0, 0.1 if name.endswith("bias") else init_std)  # zero biases would hide bias bugs
    return module
