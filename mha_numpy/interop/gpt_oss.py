"""Attention sinks against Hugging Face gpt-oss: the importer, ``GptOssAttention`` (sinks, sliding layers, GQA, RoPE)
and its KV cache.

torch and transformers are imported lazily, inside the functions. ``GptOssAttention`` with E = hidden_size,
H = num_attention_heads, Hkv = num_key_value_heads, d = head_dim (H·d need not be E):

=================  ==================  ==========================================
ours               GptOssAttention     shape
=================  ==================  ==========================================
W_q, b_q           q_proj              (H·d, E), (H·d,)
W_k, b_k           k_proj              (Hkv·d, E), (Hkv·d,)
W_v, b_v           v_proj              (Hkv·d, E), (Hkv·d,)
W_o, b_o           o_proj              (E, H·d), (E,)  (biases with attention_bias=True, gpt-oss's default)
sinks              sinks               (H,)  (``sinks=True``)
rope_theta         config.rope_parameters["rope_theta"]
rope_scaling       config.rope_parameters  (gpt-oss's YaRN; ``rope.hf_rope_scaling``)
=================  ==================  ==========================================

What differs from Llama, read in transformers' modeling_gpt_oss.py:

- the sinks: its eager attention appends each head's logit as one more column after the mask, takes the softmax
  over [scores, sink] and drops the column, ``probs[..., :-1]``: our ``sinks=True`` (the weights it returns are the
  keys', as ours);
- its rotary embedding turns the same pairs (i, i + d/2) as Llama's, written with (cos, sin) of d/2 columns and
  the two halves (``_apply_rotary_emb``) rather than duplicated columns and ``rotate_half``: the same rotation,
  our ``Rope``. Its default config rescales the angles with YaRN (``rope_type="yarn"``, factor 32, beta_fast 32,
  beta_slow 1, truncate False, original length 4096, and cos, sin multiplied by the attention factor
  0.1 · ln 32 + 1): our ``rope_scaling=`` (``mha_numpy.rope_scaling.yarn_frequencies``), imported from the config.
  ``GptOssRotaryEmbedding`` computes its angles in float32, so the checks pass it (cos, sin) from the same
  ``GptOssRotaryEmbedding`` run in float64 (``rope.float64_rope``; the module takes them as an argument) and note
  how far HF's float32 angles are;
- its eager softmax runs in the logits' dtype (``F.softmax(..., dtype=combined_logits.dtype)``), after subtracting
  the row max of [scores, sink]: float64 stays float64 (Llama's eager attention rounds through float32);
- every other layer is a sliding-window layer (``config.layer_types``, ``sliding_window`` = 128 by default): its
  mask, made by the model (``create_sliding_window_causal_mask``: key j allowed for query i when i - window < j <= i),
  is ours ``masks.sliding_window_mask``; its ``DynamicCache`` layer keeps the last window - 1 keys.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ._lazy import require
from .harness import (
    Row,
    compare,
    decode,
    decode_calls,
    decoding_rows,
    eval_mode,
    grad_rows,
    hf_decode,
    positions_of,
    relative,
    run_hf_attention,
    run_ours,
    tensor,
    upstream,
)
from .llama import LLAMA_ROWS, from_llama_like, hf_qk_after_rope, hidden, ours_qk_after_rope
from .names import HF_LLAMA_NAME_MAP
from .report import CrosscheckReport, rtol_for
from .rope import float64_rope

if TYPE_CHECKING:  # annotations only
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

HF_GPT_OSS_NAME_MAP = {**HF_LLAMA_NAME_MAP, "sinks": ("sinks", None)}
"""GptOssAttention's parameters as ours: Llama's and the sinks."""


def from_hf_gpt_oss_attention(module: GptOssAttention) -> MultiHeadAttention:
    """Hugging Face ``GptOssAttention`` -> ``MultiHeadAttention(num_kv_heads=, rope_theta=, head_dim=, sinks=True)``.

    The same weights and sinks. Causality and the sliding window are not part of the module: pass ``layer_mask``'s
    mask (or decode with a ``KVCache`` and that mask), as GptOssModel's masks do.
    """
    return from_llama_like(module, "GptOssAttention", HF_GPT_OSS_NAME_MAP, needs=("sinks",), scaled=True, sinks=True)


def layer_mask(module: GptOssAttention, Lq: int, Lk: int | None = None, attention_mask=None) -> np.ndarray:
    """The mask of the module's layer for Lq queries after Lk - Lq earlier positions (bottom-right): causal, within
    ``sliding_window`` on a sliding layer; with ``attention_mask`` (B, Lk) of HF's 1 = keep, 0 = padding, combined.
    -> bool (Lq, Lk) or (B, 1, Lq, Lk), True = may attend."""
    Lk = Lq if Lk is None else Lk
    window = getattr(module, "sliding_window", None)
    if window:
        mask = M.sliding_window_mask(Lq, Lk, int(window), offset=Lk - Lq)
    else:
        mask = M.causal_mask(Lq, Lk, diagonal=Lk - Lq)
    return mask if attention_mask is None else M.combine_masks(mask, M.padding_mask(attention_mask=attention_mask))


def torch_cos_sin_halves(torch, positions: np.ndarray, head_dim: int, theta: float, dtype):
    """The default RoPE's (cos, sin) (B, L, d/2) as GptOssRotaryEmbedding writes it, in float64 with torch ops, cast
    to dtype (the cross-checks now take any rope_type's from the module itself: ``hf_cos_sin_halves``)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (d/2,)
    freqs = torch.from_numpy(np.asarray(positions, dtype=np.float64))[..., None] * inv_freq  # (B, L, d/2)
    tdtype = getattr(torch, np.dtype(dtype).name)
    return freqs.cos().to(tdtype), freqs.sin().to(tdtype)


def hf_cos_sin_halves(torch, config, positions: np.ndarray, dtype):
    """GptOssRotaryEmbedding's own (cos, sin) (B, L, d/2) (its rope_type's table and attention factor), computed
    in float64 (``float64_rope``), cast to dtype."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    tdtype = getattr(torch, np.dtype(dtype).name)
    with float64_rope(torch):
        rotary = GptOssRotaryEmbedding(config)
        cos, sin = rotary(torch.zeros(1, dtype=torch.float64), torch.from_numpy(np.asarray(positions)))
    return cos.to(tdtype), sin.to(tdtype)


def _hf_rope_note(torch, module, x, mask_t, positions: np.ndarray, cos_t, out) -> str:
    """How far HF's own rotary module (float32 angles) is from the float64 (cos, sin), and the module's output with
    it (as shipped) from ours."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    x_t = tensor(torch, x)
    cos_hf, sin_hf = GptOssRotaryEmbedding(module.config)(x_t, torch.from_numpy(positions))
    err = float((cos_hf.double() - cos_t.double()).abs().max())
    with eval_mode(module), torch.no_grad():
        shipped = module(x_t, (cos_hf, sin_hf), mask_t)[0].numpy()
    return (
        f"HF's GptOssRotaryEmbedding (float32 angles) differs from the float64 cos by {err:.1e}; with it (as shipped) "
        f"the output is {relative(out, shipped):.1e} (max rel) from ours"
    )


def hf_layer_mask(torch, module, x, keep, pos):
    """The mask GptOssModel makes for the module's layer (``create_causal_mask`` or
    ``create_sliding_window_causal_mask``, with the padding of ``keep``): (B, 1, L, L) additive, 0 / finfo.min."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    make = create_sliding_window_causal_mask if getattr(module, "sliding_window", None) else create_causal_mask
    t_keep = None if keep is None else tensor(torch, np.asarray(keep, dtype=np.int64))
    return make(config=module.config, inputs_embeds=tensor(torch, x), attention_mask=t_keep, cache=None,
                position_ids=torch.from_numpy(pos))  # fmt: skip


def attention_rows(name_map) -> tuple[Row, ...]:
    """The rows of ``crosscheck_hf_gpt_oss_attention``."""
    return (
        Row("mask (1 = may attend)", "create_*_mask", "mask"),
        Row("output", "module(x, (cos, sin), mask)", "output"),
        Row("attn weights (keys')", "eager probs[..., :-1]", "weights"),
        *LLAMA_ROWS[1:],  # Q and K after RoPE, dL/dx
        *grad_rows(name_map),
    )


def crosscheck_hf_gpt_oss_attention(
    module: GptOssAttention,
    hidden_states: np.ndarray,
    attention_mask=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
    impl="vectorized",
) -> CrosscheckReport:
    """A transformers ``GptOssAttention`` (sinks, GQA, RoPE; its layer's causal or sliding-window mask) against
    ``from_hf_gpt_oss_attention(module)`` on the kernel ``impl`` (a registered name or a kernel object).

    hidden_states (B, L, E) NumPy; attention_mask None or (B, L) HF's 1 = keep, 0 = padding (left or right). HF gets
    the mask its model makes (``create_causal_mask`` / ``create_sliding_window_causal_mask``, additive finfo.min),
    ours ``layer_mask``'s bool mask; HF gets float64 (cos, sin) built with torch ops. Rows: the two masks, the
    output, the attention weights (the keys', the sink's dropped), Q and K after RoPE, and the gradient of a random
    upstream gradient with respect to the input and every parameter, the sinks included.
    """
    torch = require("torch")
    mha = from_hf_gpt_oss_attention(module)
    mha.kernel = impl
    dtype, x = mha.dtype, hidden(hidden_states, mha.dtype)
    pos = positions_of(None, *x.shape[:2])  # 0 ... L-1 (padded positions too, as GptOssModel's default)
    keep = None if attention_mask is None else np.asarray(attention_mask)
    d_output, mask = upstream(d_output, x.shape, dtype, rng), layer_mask(module, x.shape[1], attention_mask=keep)
    ours, _ = run_ours(mha, (x, x, x), d_output, mask=mask)
    name_map = {n: entry for n, entry in HF_GPT_OSS_NAME_MAP.items() if n in mha.params}
    theirs = _hf_call(torch, module, mha, x, hf_layer_mask(torch, module, x, keep, pos), d_output, name_map)
    ours.update(ours_qk_after_rope(mha, x, pos), mask=np.broadcast_to(mask, theirs["mask"].shape))
    window = getattr(module, "sliding_window", None)
    title = (f"transformers GptOssAttention (H={mha.num_heads}, Hkv={mha.num_kv_heads}, d={mha.head_dim}, "
             f"{f'sliding window {window}' if window else 'full causal'}, sinks, eager) vs {mha.impl}")  # fmt: skip
    note = _hf_rope_note(torch, module, x, theirs.pop("mask_t"), pos, theirs.pop("cos"), ours["output"])
    return compare(title, dtype, rtol_for(dtype, rtol), attention_rows(name_map), ours, theirs, [note])


def _hf_call(torch, module, mha, x, mask_t, d_output, name_map) -> dict:
    """HF's module on one call under autograd (float64 (cos, sin) from torch ops), its Q and K after RoPE, the keys
    its mask allows; "mask_t" and "cos" for the note."""
    from transformers.models.gpt_oss.modeling_gpt_oss import apply_rotary_pos_emb

    pos = positions_of(None, *x.shape[:2])
    cos_sin = hf_cos_sin_halves(torch, module.config, pos, mha.dtype)
    theirs = run_hf_attention(torch, module, x, cos_sin, mask_t, d_output, name_map)
    theirs.update(hf_qk_after_rope(torch, module, x, cos_sin, apply_rotary_pos_emb), mask_t=mask_t, cos=cos_sin[0])
    theirs["mask"] = mask_t.numpy() > np.finfo(mha.dtype).min / 2  # (B, 1, L, L) True where 0 was added
    return theirs


def crosscheck_hf_gpt_oss_kv_cache(
    module: GptOssAttention,
    hidden_states: np.ndarray,
    prefill: int = 3,
    rtol: float | None = None,
    impl="vectorized",
) -> CrosscheckReport:
    """Decoding: ours (``KVCache`` and the layer's mask each call) against ``GptOssAttention`` with a transformers
    ``DynamicCache`` (on a sliding layer a ``DynamicSlidingWindowLayer``, which keeps the last window - 1 keys).

    hidden_states (B, L, E): the first ``prefill`` tokens in one call, then one token per call. Rows: the outputs
    of every call against HF's cached decoding; ours cached against our own full forward with the layer's mask;
    the keys and values HF's cache holds at the end against ours at those positions.
    """
    torch = require("torch")
    mha = from_hf_gpt_oss_attention(module)
    mha.kernel = impl
    dtype, x = mha.dtype, hidden(hidden_states, mha.dtype)
    B, L, E = x.shape
    calls, kv = decode_calls(L, prefill), KVCache()
    ours = {"outputs": decode(calls, lambda a, b: mha.forward(*(x[:, a:b],) * 3, mask=layer_mask(module, b - a, b),
                                                              kv_cache=kv)[0])}  # fmt: skip
    ours["full"] = mha.forward(x, x, x, mask=layer_mask(module, L))[0]
    cos_sin = hf_cos_sin_halves(torch, module.config, positions_of(None, B, L), dtype)
    outputs, layer = hf_decode(torch, module, x, calls, cos_sin, partial(_hf_cache_mask, torch, module, dtype))
    theirs, kept = {"outputs": outputs, "keys": layer.keys.numpy(), "values": layer.values.numpy()}, layer.keys.shape[2]
    ours.update(keys=kv.keys[:, :, L - kept :], values=kv.values[:, :, L - kept :])
    window = getattr(module, "sliding_window", None)
    title = (f"KV cache vs transformers DynamicCache ({'sliding window ' + str(window) if window else 'full'} layer, "
             f"prefill {prefill}, then {L - prefill} single steps)")  # fmt: skip
    rows = decoding_rows("GptOssAttention(..., cache=)", full=("cached ≡ full (layer mask)", "ours, one forward"),
                         keys=(f"the last {kept} keys (RoPE'd)", "DynamicCache keys"),
                         values=(f"the last {kept} values", "DynamicCache values"))  # fmt: skip
    note = f"HF's cache layer keeps {kept} of {L} positions; our KVCache keeps all {len(kv)}"
    return compare(title, dtype, rtol_for(dtype, rtol), rows, ours, theirs, [note])


def _hf_cache_mask(torch, module, dtype, a: int, b: int, cache):
    """The layer's mask for the call's queries a .. b - 1 over the keys HF's cache layer holds and the call's:
    (1, 1, b - a, held + b - a) additive."""
    layer = cache.layers[module.layer_idx]
    held = layer.keys.shape[-2] if getattr(layer, "is_initialized", False) else 0
    return tensor(torch, M.to_additive(layer_mask(module, b - a, held + b - a), dtype)[None, None])


def hf_gpt_oss_attention(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None = None,
    sliding_window: int | None = 4,
    rope_theta: float = 10000.0,
    bias: bool = True,
    dtype=np.float64,
    seed: int = 0,
    rope_parameters: dict | None = None,
    max_position_embeddings: int = 131072,
) -> GptOssAttention:
    """A small random transformers ``GptOssAttention`` for the cross-checks (eager attention, ``rope_type="default"``
    unless ``rope_parameters`` is given; ``rope_parameters="gpt-oss"``: GptOssConfig's own default, YaRN):
    layer 0, a sliding-window layer of ``sliding_window`` positions, or layer 1 (full attention) when it is None.
    Sinks drawn from N(0, 1) (HF leaves them uninitialised until its model's init), nonzero biases when ``bias``."""
    torch = require("torch")
    require("transformers")
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    cfg = GptOssConfig(
        hidden_size=hidden_size, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads, sliding_window=sliding_window or 4,
        num_hidden_layers=2,  # layer 0 sliding, layer 1 full: GptOssConfig's alternation
        vocab_size=16, intermediate_size=8, num_local_experts=2, num_experts_per_tok=1,
        rope_parameters=_rope_parameters(rope_parameters, rope_theta), attention_bias=bias,
        max_position_embeddings=max_position_embeddings, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    module = GptOssAttention(cfg, layer_idx=0 if sliding_window else 1).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        module.sinks.normal_(0.0, 1.0)
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)  # zero biases would hide bias bugs
    return module


def _rope_parameters(given, rope_theta: float) -> dict | None:
    """The builder's rope_parameters: the default RoPE of rope_theta, GptOssConfig's own ("gpt-oss": None, its
    YaRN), or the dict given (a copy: transformers fills it in)."""
    if given is None:
        return {"rope_type": "default", "rope_theta": float(rope_theta)}
    return None if given == "gpt-oss" else dict(given)
