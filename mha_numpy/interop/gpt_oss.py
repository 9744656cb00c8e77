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
rope_theta         config.rope_parameters["rope_theta"]  (rope_type "default" only)
=================  ==================  ==========================================

What differs from Llama, read in transformers' modeling_gpt_oss.py:

- the sinks: its eager attention appends each head's logit as one more column after the mask, takes the softmax
  over [scores, sink] and drops the column, ``probs[..., :-1]``: our ``sinks=True`` (the weights it returns are the
  keys', as ours);
- its rotary embedding turns the same pairs (i, i + d/2) as Llama's, written with (cos, sin) of d/2 columns and
  the two halves (``_apply_rotary_emb``) rather than duplicated columns and ``rotate_half``: the same rotation,
  our ``Rope``. Its default config rescales the angles with YaRN (``rope_type="yarn"``, factor 32, and cos, sin
  multiplied by an attention factor): not modelled, refused; the cross-checks use ``rope_type="default"``.
  ``GptOssRotaryEmbedding`` computes its angles in float32, so the checks pass (cos, sin) built in float64 with
  torch ops (the module takes them as an argument) and note how far HF's float32 angles are;
- its eager softmax runs in the logits' dtype (``F.softmax(..., dtype=combined_logits.dtype)``), after subtracting
  the row max of [scores, sink]: float64 stays float64 (Llama's eager attention rounds through float32);
- every other layer is a sliding-window layer (``config.layer_types``, ``sliding_window`` = 128 by default): its
  mask, made by the model (``create_sliding_window_causal_mask``: key j allowed for query i when i - window < j <= i),
  is ours ``masks.sliding_window_mask``; its ``DynamicCache`` layer keeps the last window - 1 keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import functional as F
from .. import masks as M
from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ._harness import add_grad_rows, decode_calls, random_like
from ._lazy import require
from .llama import from_llama_like
from .names import HF_LLAMA_NAME_MAP, params_from_state
from .report import CrosscheckReport, rtol_for

if TYPE_CHECKING:  # annotations only
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

HF_GPT_OSS_NAME_MAP = {**HF_LLAMA_NAME_MAP, "sinks": ("sinks", None)}
"""GptOssAttention's parameters as ours: Llama's and the sinks."""


def from_hf_gpt_oss_attention(module: GptOssAttention) -> MultiHeadAttention:
    """Hugging Face ``GptOssAttention`` -> ``MultiHeadAttention(num_kv_heads=, rope_theta=, head_dim=, sinks=True)``.

    The same weights and sinks. Causality and the sliding window are not part of the module: pass ``layer_mask``'s
    mask (or decode with a ``KVCache`` and that mask), as GptOssModel's masks do.
    """
    # hf_rope_theta refuses YaRN's rope scaling
    return from_llama_like(module, "GptOssAttention", HF_GPT_OSS_NAME_MAP, needs=("sinks",), sinks=True)


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


def _text_positions(B: int, L: int) -> np.ndarray:
    """(B, L) int64: 0 ... L-1 for every sequence."""
    return np.broadcast_to(np.arange(L), (B, L)).astype(np.int64)


def torch_cos_sin_halves(torch, positions: np.ndarray, head_dim: int, theta: float, dtype):
    """GptOssRotaryEmbedding's (cos, sin) (B, L, d/2), its formula in float64 with torch ops, cast to dtype."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (d/2,)
    freqs = torch.from_numpy(np.asarray(positions, dtype=np.float64))[..., None] * inv_freq  # (B, L, d/2)
    tdtype = getattr(torch, np.dtype(dtype).name)
    return freqs.cos().to(tdtype), freqs.sin().to(tdtype)


def _hf_rope_note(torch, module, x_t, mask_t, positions: np.ndarray, cos_t, out) -> str:
    """How far HF's own rotary module (float32 angles) is from the float64 (cos, sin), and the module's output with
    it (as shipped) from ours."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    cos_hf, sin_hf = GptOssRotaryEmbedding(module.config)(x_t, torch.from_numpy(positions))
    err = float((cos_hf.double() - cos_t.double()).abs().max())
    with torch.no_grad():
        shipped = module(x_t, (cos_hf, sin_hf), mask_t)[0].numpy()
    gap = float(np.abs(shipped - out).max() / np.abs(shipped).max())
    return (
        f"HF's GptOssRotaryEmbedding (float32 angles) differs from the float64 cos by {err:.1e}; with it (as shipped) "
        f"the output is {gap:.1e} (max rel) from ours"
    )


def _eval(module):
    """The module in eval mode (no dropout) until the with block ends; its mode restored after."""
    from contextlib import contextmanager

    @contextmanager
    def scope():
        was_training = module.training
        module.eval()
        try:
            yield module
        finally:
            module.train(was_training)

    return scope()


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
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
    from transformers.models.gpt_oss.modeling_gpt_oss import apply_rotary_pos_emb

    mha = from_hf_gpt_oss_attention(module)
    mha.kernel = impl
    dtype, H, Hkv, d = mha.dtype, mha.num_heads, mha.num_kv_heads, mha.head_dim
    rtol = rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    B, L, E = x.shape
    pos = _text_positions(B, L)  # (B, L) 0 ... L-1 (padded positions too, as GptOssModel's default)
    d_output = random_like((B, L, E), dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)
    keep = None if attention_mask is None else np.asarray(attention_mask)
    mask = layer_mask(module, L, attention_mask=keep)

    out, cache = mha.forward(x, x, x, mask=mask)
    grads = mha.backward(d_output, cache)
    P = mha.params
    q_heads = F.split_heads_forward(F.linear_forward(x, P["W_q"], P.get("b_q"))[0], H)[0]  # (B, H, L, d)
    k_heads = F.split_heads_forward(F.linear_forward(x, P["W_k"], P.get("b_k"))[0], Hkv)[0]  # (B, Hkv, L, d)
    Q, K = F.rope_forward(q_heads, pos, mha.rope_theta)[0], F.rope_forward(k_heads, pos, mha.rope_theta)[0]

    tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
    make = create_sliding_window_causal_mask if getattr(module, "sliding_window", None) else create_causal_mask
    t_keep = None if keep is None else torch.from_numpy(np.ascontiguousarray(keep, dtype=np.int64))
    hf_mask = make(config=module.config, inputs_embeds=tx, attention_mask=t_keep, cache=None,
                   position_ids=torch.from_numpy(pos))  # fmt: skip  # (B, 1, L, L) additive: 0 / finfo.min
    cos_t, sin_t = torch_cos_sin_halves(torch, pos, d, mha.rope_theta, dtype)
    named = dict(module.named_parameters())
    with _eval(module):
        out_t, w_t = module(tx, (cos_t, sin_t), hf_mask)
        g = torch.autograd.grad(out_t, [tx, *named.values()], torch.from_numpy(d_output))
        with torch.no_grad():
            q_t = module.q_proj(tx).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
            k_t = module.k_proj(tx).view(B, L, Hkv, d).transpose(1, 2)  # (B, Hkv, L, d)
            Q_t, K_t = apply_rotary_pos_emb(q_t, k_t, cos_t, sin_t)

    window = getattr(module, "sliding_window", None)
    layer = f"sliding window {window}" if window else "full causal"
    title = f"transformers GptOssAttention (H={H}, Hkv={Hkv}, d={d}, {layer}, sinks, eager) vs {mha.impl}"
    report = CrosscheckReport(title, dtype, rtol)
    allowed_hf = hf_mask.detach().numpy() > np.finfo(dtype).min / 2  # (B, 1, L, L) True where 0 was added
    report.compare("mask (1 = may attend)", "create_*_mask", np.broadcast_to(mask, allowed_hf.shape), allowed_hf)
    report.compare("output", "module(x, (cos, sin), mask)", out, out_t.detach().numpy())
    report.compare("attn weights (keys')", "eager probs[..., :-1]", cache.attn_weights, w_t.detach().numpy())
    report.compare("Q after RoPE", "apply_rotary_pos_emb", Q, Q_t.numpy())
    report.compare("K after RoPE", "apply_rotary_pos_emb", K, K_t.numpy())
    report.compare("dL/dx (q+k+v paths)", "hidden_states.grad", grads["query"] + grads["key"] + grads["value"], g[0])
    name_map = {ours: entry for ours, entry in HF_GPT_OSS_NAME_MAP.items() if ours in mha.params}
    grads_theirs = params_from_state(dict(zip(named, (t.numpy() for t in g[1:]))), name_map)
    add_grad_rows(report, grads, grads_theirs, name_map)
    with _eval(module):
        report.notes.append(_hf_rope_note(torch, module, tx.detach(), hf_mask, pos, cos_t, out))
    return report


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
    from transformers import DynamicCache

    mha = from_hf_gpt_oss_attention(module)
    mha.kernel = impl
    dtype, d = mha.dtype, mha.head_dim
    rtol = rtol_for(dtype, rtol)
    x = np.asarray(hidden_states).astype(dtype, copy=False)
    B, L, E = x.shape
    steps = decode_calls(L, prefill)

    kv = KVCache()
    ours = np.concatenate(
        [mha.forward(x[:, a:b], x[:, a:b], x[:, a:b], mask=layer_mask(module, b - a, b), kv_cache=kv)[0]
         for a, b in steps], axis=1,
    )  # fmt: skip
    full, _ = mha.forward(x, x, x, mask=layer_mask(module, L))

    hf_cache = DynamicCache(config=module.config)
    cos_t, sin_t = torch_cos_sin_halves(torch, _text_positions(B, L), d, mha.rope_theta, dtype)
    tx = torch.from_numpy(np.ascontiguousarray(x))
    layer = hf_cache.layers[module.layer_idx]
    theirs = []
    with _eval(module), torch.no_grad():
        for a, b in steps:
            held = layer.keys.shape[-2] if getattr(layer, "is_initialized", False) else 0  # what HF's layer kept
            mask = M.to_additive(layer_mask(module, b - a, held + b - a), dtype)[None, None]  # (1, 1, Lq, Lk)
            mask_t = torch.from_numpy(np.ascontiguousarray(mask))
            theirs.append(module(tx[:, a:b], (cos_t[:, a:b], sin_t[:, a:b]), mask_t, cache=hf_cache)[0].numpy())
    kept = layer.keys.shape[-2]

    window = getattr(module, "sliding_window", None)
    title = f"KV cache vs transformers DynamicCache ({'sliding window ' + str(window) if window else 'full'} layer, "
    report = CrosscheckReport(title + f"prefill {prefill}, then {L - prefill} single steps)", dtype, rtol)
    report.compare("outputs, every call", "GptOssAttention(..., cache=)", ours, np.concatenate(theirs, axis=1))
    report.compare("cached ≡ full (layer mask)", "ours, one forward", ours, full, note="ours vs ours")
    report.compare(f"the last {kept} keys (RoPE'd)", "DynamicCache keys", kv.keys[:, :, L - kept :], layer.keys.numpy())
    report.compare(f"the last {kept} values", "DynamicCache values", kv.values[:, :, L - kept :], layer.values.numpy())
    report.notes.append(f"HF's cache layer keeps {kept} of {L} positions; our KVCache keeps all {len(kv)}")
    return report


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
) -> GptOssAttention:
    """A small random transformers ``GptOssAttention`` for the cross-checks (eager attention, ``rope_type="default"``):
    layer 0, a sliding-window layer of ``sliding_window`` positions, or layer 1 (full attention) when it is None.
    Sinks drawn from N(0, 1) (HF leaves them uninitialised until its model's init), nonzero biases when ``bias``."""
    torch = require("torch")
    require("transformers")
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    cfg = GptOssConfig(
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads,
        num_hidden_layers=2,  # layer 0 sliding, layer 1 full: GptOssConfig's alternation
        sliding_window=sliding_window or 4,
        vocab_size=16,
        intermediate_size=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        attention_bias=bias,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    module = GptOssAttention(cfg, layer_idx=0 if sliding_window else 1).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        module.sinks.normal_(0.0, 1.0)
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)  # zero biases would hide bias bugs
    return module
