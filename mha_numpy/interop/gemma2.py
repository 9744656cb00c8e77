"""Soft-capped scores against Hugging Face Gemma 2: the importer, one call and decoding with the cache.

torch and transformers are imported lazily, inside the functions. ``Gemma2Attention`` with E = hidden_size,
H = num_attention_heads, Hkv = num_key_value_heads, d = head_dim (need not be E / H):

======================  ==============================  ============================================
ours                    Gemma2Attention                 shape / value
======================  ==============================  ============================================
W_q, b_q                q_proj                          (H·d, E), (H·d,)
W_k, b_k                k_proj                          (Hkv·d, E), (Hkv·d,)
W_v, b_v                v_proj                          (Hkv·d, E), (Hkv·d,)
W_o, b_o                o_proj                          (E, H·d), (E,)  (biases only with attention_bias)
scale                   scaling                         query_pre_attn_scalar^-1/2 (not d^-1/2 in general)
softcap                 attn_logit_softcapping          cap · tanh(s / cap) of the scores, before the mask
rope_theta              config.rope_parameters          (rope_type "default" only)
(the mask)              sliding_window                  a sliding layer's window; a full layer: causal
======================  ==============================  ============================================

The window is not part of the module (as causality is not): a layer's mask is ``decoder_attention.layer_mask``,
which the cross-checks compare with the mask HF's own ``create_sliding_window_causal_mask`` makes. Gemma 2's
eager attention computes its softmax in float32; the float64 check keeps it in float64 and reports the gap
(``decoder_attention``).

    module = hf_gemma2_attention(16, 4, 2, head_dim=6, query_pre_attn_scalar=10, softcap=1.5, sliding_window=3)
    mha = from_hf_gemma2_attention(module)              # MultiHeadAttention(softcap=1.5, scale=10**-0.5, ...)
    print(crosscheck_hf_gemma2_attention(module, x, attention_mask=am))
"""

from __future__ import annotations

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
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention


def _name_map(bias: bool):
    return {ours: entry for ours, entry in HF_LLAMA_NAME_MAP.items() if bias or ours.startswith("W_")}


def _kind(module) -> DecoderAttention:
    return DecoderAttention("Gemma2Attention", _name_map(module.q_proj.bias is not None), "Gemma2RotaryEmbedding")


def from_hf_gemma2_attention(module: Gemma2Attention) -> MultiHeadAttention:
    """Hugging Face ``Gemma2Attention`` -> ``MultiHeadAttention(softcap=..., scale=..., head_dim=...)``, same weights.

    Self-attention with E = hidden_size, the config's head_dim (H·d need not be E), GQA from num_key_value_heads,
    RoPE from the config, the scores scaled by ``module.scaling`` = query_pre_attn_scalar^-1/2 and soft-capped by
    attn_logit_softcapping (None: no cap). Causality and a sliding layer's window are not part of the module: pass
    ``decoder_attention.layer_mask(B, Lq, Lk, module.sliding_window)`` as the mask (or a ``KVCache`` with it).
    """
    llama_like_sizes(module, "Gemma2Attention", needs=("scaling", "attn_logit_softcapping"))
    cap = module.attn_logit_softcapping
    return from_llama_like(module, "Gemma2Attention", HF_LLAMA_NAME_MAP, scale=module.scaling,
                           softcap=None if cap is None else float(cap))  # fmt: skip


def _imported(module, kernel, recompute: bool) -> MultiHeadAttention:
    if getattr(module.config, "use_bidirectional_attention", False):
        raise ValueError("the module's config has use_bidirectional_attention=True; the checks model causal layers")
    return on_kernel(from_hf_gemma2_attention(module), kernel, recompute)


def _title(module, mha, what: str) -> str:
    layer = "full" if module.sliding_window is None else f"sliding {module.sliding_window}"
    scale = "1/√d" if mha.scale is None else f"{mha.scale:.4g}"
    return (f"{what} transformers Gemma2Attention (H={mha.num_heads}, Hkv={mha.num_kv_heads}, d={mha.head_dim}, "
            f"scale={scale}, softcap={mha.softcap}, {layer} layer, {mha.impl})")  # fmt: skip


def crosscheck_hf_gemma2_attention(
    module: Gemma2Attention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    positions=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
    kernel=None,
    recompute: bool = False,
) -> CrosscheckReport:
    """A transformers ``Gemma2Attention`` (eager) against ``from_hf_gemma2_attention(module)`` and torch autograd.

    hidden_states (B, L, E) NumPy; attention_mask (B, L) HF style, 1 = keep (default none); positions None
    (0..L-1), (L,) or (B, L) for RoPE; kernel: a kernel name or object for ours (default vectorized); recompute:
    ours with recompute=True. The layer's mask is causal, or the sliding window of a sliding layer, with the
    padding; HF gets its own mask (``create_causal_mask`` / ``create_sliding_window_causal_mask``) and float64
    (cos, sin). Rows: the mask, the output, the attention weights, Q, K, V as the attention takes them (after
    RoPE), the gradient of a random upstream gradient with respect to the input and every parameter. Default pass
    threshold 1e-10 in float64 (HF's softmax kept in float64, the as-shipped gap in a note), 1e-5 in float32.
    """
    mha = _imported(module, kernel, recompute)
    return crosscheck_decoder_attention(_kind(module), module, mha, _title(module, mha, "ours vs"), hidden_states,
                                        attention_mask, positions, d_output, rng, rtol)  # fmt: skip


def crosscheck_hf_gemma2_kv_cache(
    module: Gemma2Attention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    prefill: int = 3,
    chunk: int = 1,
    rtol: float | None = None,
    kernel=None,
) -> CrosscheckReport:
    """Decoding: ours (``KVCache``) against ``Gemma2Attention`` with a transformers ``DynamicCache``.

    hidden_states (B, L, E): the first ``prefill`` tokens in one call, then ``chunk`` tokens per call (chunk > 1:
    Lq != Lk within a call). A sliding layer's ``DynamicCache`` keeps only window - 1 past positions, ours all of
    them under the window's mask. Rows: every call's mask against HF's, the outputs of every call (B, L, E)
    against HF's, against our own full forward under the layer's mask, the cached keys and values against HF's.
    """
    mha = _imported(module, kernel, False)
    title = _title(module, mha, f"KV cache (prefill {prefill}, then {chunk} a call) vs")
    return crosscheck_decoder_kv_cache(_kind(module), module, mha, title, hidden_states, attention_mask, prefill,
                                       chunk, rtol)  # fmt: skip


def hf_gemma2_attention(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None = None,
    query_pre_attn_scalar: float | None = None,
    softcap: float | None = 50.0,
    sliding_window: int | None = None,
    rope_theta: float = 10000.0,
    bias: bool = False,
    dtype=np.float64,
    seed: int = 0,
    init_std: float = 0.5,
) -> Gemma2Attention:
    """A small random transformers ``Gemma2Attention`` (layer 0, eager) for the cross-checks.

    head_dim None: hidden_size // num_heads; query_pre_attn_scalar None: head_dim; sliding_window an int makes
    layer 0 a sliding layer. Weights N(0, init_std²) (large enough that the cap flattens scores); nonzero biases
    when ``bias``.
    """
    torch = require("torch")
    require("transformers")
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention

    d = head_dim or hidden_size // num_heads
    cfg = Gemma2Config(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=d,
        query_pre_attn_scalar=d if query_pre_attn_scalar is None else query_pre_attn_scalar,
        attn_logit_softcapping=softcap, sliding_window=sliding_window or 4096,
        layer_types=["sliding_attention" if sliding_window else "full_attention"], num_hidden_layers=1,
        intermediate_size=2 * hidden_size, vocab_size=16, rope_theta=rope_theta, attention_bias=bias,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    module = Gemma2Attention(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(0.0, 0.1 if name.endswith("bias") else init_std)  # zero biases would hide bias bugs
    return module
