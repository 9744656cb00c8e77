"""RoPE + GQA against Hugging Face Llama: the importer, the attention and the KV cache (GQA alone vs SDPA: ``gqa``).

torch and transformers are imported lazily, inside the functions. Hugging Face ``LlamaAttention`` with
E = hidden_size, H = num_attention_heads, Hkv = num_key_value_heads, d = head_dim:

=================  ==================  ==========================================
ours               LlamaAttention      shape
=================  ==================  ==========================================
W_q, b_q           q_proj              (H·d, E), (H·d,)
W_k, b_k           k_proj              (Hkv·d, E), (Hkv·d,)
W_v, b_v           v_proj              (Hkv·d, E), (Hkv·d,)
W_o, b_o           o_proj              (E, H·d), (E,)  (biases only with attention_bias=True)
rope_theta         config.rope_parameters["rope_theta"]  (rope_type "default" only)
=================  ==================  ==========================================

``LlamaAttention.forward(hidden_states, (cos, sin), attention_mask, cache=...)`` takes the rotation as an
argument; its own ``LlamaRotaryEmbedding`` computes the angles in float32, so the cross-checks build (cos, sin)
in float64 with torch ops (``torch_cos_sin``) and report how far HF's float32 angles are from them.
Its "eager" attention computes the softmax in float32 even for float64 inputs: use
``attn_implementation="sdpa"`` for a float64 comparison (the checks pass an explicit float mask, so both
implementations see the same causal mask).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from .. import functional as F
from .. import masks as M
from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ..rope_scaling import rope_frequencies
from ._lazy import require
from .convert import module_with_params, numpy_dtype_of
from .harness import (
    Row,
    compare,
    decode,
    decode_calls,
    decoding_rows,
    grad_rows,
    hf_decode,
    positions_of,
    run_hf_attention,
    run_ours,
    tensor,
    upstream,
)
from .names import HF_LLAMA_NAME_MAP, params_from_state
from .report import CrosscheckReport, rtol_for
from .rope import hf_rope_scaling

if TYPE_CHECKING:  # annotations only
    from transformers.models.llama.modeling_llama import LlamaAttention

# --------------------------------------------------------------------------- Hugging Face LlamaAttention


def hf_rope_theta(config, scaled: bool = False) -> float:
    """rope_theta of a LlamaConfig (transformers v5 ``rope_parameters``, or the older ``rope_theta``). A rope_type
    other than "default" is refused unless ``scaled`` (the importer then passes ``hf_rope_scaling(config)``)."""
    params = getattr(config, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default")
    if kind != "default" and not scaled:
        raise ValueError(f"rope_type={kind!r} rescales the angles; only the 'default' RoPE is modelled here")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the config has no rope_theta")
    return float(theta)


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def llama_like_sizes(module, kind: str, needs: tuple[str, ...] = ()) -> tuple:
    """A Llama-like attention (Llama, Gemma 2, Qwen3, gpt-oss, DiffLlama) checked to be one -> (config, E, H, Hkv, d).

    ValueError naming ``kind`` when q/k/v/o_proj, config or one of ``needs`` is missing."""
    names = (*PROJECTIONS, "config", *needs)
    if not all(hasattr(module, n) for n in names):
        raise ValueError(f"module must be a transformers {kind} ({', '.join(names)}), got {module!r}")
    cfg = module.config
    return cfg, module.q_proj.in_features, cfg.num_attention_heads, cfg.num_key_value_heads, module.head_dim


def from_llama_like(
    module, kind: str, name_map: dict, needs=(), scale=None, scaled=False, **options
) -> MultiHeadAttention:
    """What every Llama-like importer shares: the module checked (``llama_like_sizes(module, kind, needs)``); the
    scaling 1/√d unless ``scale`` is given (then it is the module's ``scale=``); the projections' biases all
    present or all absent; the weights through ``name_map`` (its b_* entries only with biases); GQA, RoPE and
    head_dim from the config (with ``scaled``, its rope scaling too: ``hf_rope_scaling``), with ``options`` (the
    model's own steps)."""
    cfg, E, H, Hkv, d = llama_like_sizes(module, kind, needs)
    if scale is None and not np.isclose(module.scaling, d**-0.5, rtol=1e-15):
        raise ValueError(f"{kind}.scaling={module.scaling} is not 1/sqrt(head_dim); not modelled")
    has_bias = [getattr(module, n).bias is not None for n in PROJECTIONS]
    if len(set(has_bias)) != 1:
        raise ValueError(
            f"q/k/v/o_proj biases must all be present or all absent, got {dict(zip(PROJECTIONS, has_bias))}"
        )
    bias = has_bias[0]
    name_map = {ours: entry for ours, entry in name_map.items() if bias or not ours.startswith("b_")}
    params = params_from_state(dict(module.named_parameters()), name_map)
    dropout = float(getattr(cfg, "attention_dropout", 0.0))
    dtype = numpy_dtype_of(module.q_proj.weight.dtype)
    if "rope_theta" in options:  # a layer's own base (Gemma 3: one per layer type), and its scaling if any
        options = dict(num_kv_heads=Hkv, head_dim=d, **options)
    else:
        options = dict(num_kv_heads=Hkv, rope_theta=hf_rope_theta(cfg, scaled), head_dim=d, **options)  # d: any
        if scaled and hf_rope_scaling(cfg) is not None:
            options["rope_scaling"] = hf_rope_scaling(cfg)
    if scale is not None:
        options["scale"] = float(scale)
    return module_with_params(E, H, bias, E, E, dropout, dtype, params, **options)


def from_hf_llama_attention(module: LlamaAttention) -> MultiHeadAttention:
    """Hugging Face ``LlamaAttention`` -> ``MultiHeadAttention(num_kv_heads=..., rope_theta=...)``, same weights.

    Self-attention with E = hidden_size and the config's head_dim (H·head_dim need not be E: the module's
    ``head_dim`` option), GQA from ``num_key_value_heads``, RoPE from the config. Causality is not part of the
    module: pass ``masks.causal_mask(L)`` (or use a ``KVCache``), as LlamaModel's mask does.
    """
    return from_llama_like(module, "LlamaAttention", HF_LLAMA_NAME_MAP)


def torch_cos_sin(torch, positions: np.ndarray, head_dim: int, theta: float, dtype):
    """HF's (cos, sin) (B, L, d) built with torch ops in float64 (LlamaRotaryEmbedding's formula), cast to dtype."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (d/2,)
    freqs = torch.from_numpy(np.asarray(positions, dtype=np.float64))[..., None] * inv_freq  # (B, L, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, L, d)
    tdtype = getattr(torch, np.dtype(dtype).name)
    return emb.cos().to(tdtype), emb.sin().to(tdtype)


def causal_tensor(torch, Lq: int, Lk: int, dtype):
    """(1, 1, Lq, Lk) additive causal mask, 0 / -inf, the last Lq of Lk positions as queries (bottom-right)."""
    m = M.to_additive(M.causal_mask(Lq, Lk, diagonal=Lk - Lq), dtype)[None, None]
    return torch.from_numpy(np.ascontiguousarray(m))


def causal_call_mask(torch, dtype, a: int, b: int, cache=None):
    """The causal mask of a decoding call, queries a .. b - 1 over keys 0 .. b - 1: (1, 1, b - a, b) additive."""
    return causal_tensor(torch, b - a, b, dtype)


def rope_note(torch, rotary, config, positions: np.ndarray, cos_t) -> str:
    """How far a model's own rotary module (the class ``rotary``, float32 angles) is from the float64 (cos, sin)
    the check uses."""
    cos_hf, _ = rotary(config)(torch.zeros(1, dtype=torch.float64), torch.from_numpy(positions))
    err = float((cos_hf.double() - cos_t.double()).abs().max())
    return f"HF's {rotary.__name__} (float32 angles) differs from the float64 cos by {err:.1e}; not used here"


def ours_qk_after_rope(mha: MultiHeadAttention, x: np.ndarray, pos: np.ndarray) -> dict:
    """Our Q (B, H, L, d) and K (B, Hkv, L, d) after RoPE, from the pairs: projection, head split, rotation by the
    module's table (``rope_scaling.rope_frequencies``: its rope_scaling and partial_rotary_factor)."""
    P, c = mha.params, mha.config
    q = F.split_heads_forward(F.linear_forward(x, P["W_q"], P.get("b_q"))[0], mha.num_heads)[0]  # (B, H, L, d)
    k = F.split_heads_forward(F.linear_forward(x, P["W_k"], P.get("b_k"))[0], mha.num_kv_heads)[0]  # (B, Hkv, L, d)
    seq_len = int(np.max(pos)) + 1
    table = rope_frequencies(c.rope_scaling, c.rope_theta, c.head_dim, c.partial_rotary_factor, seq_len)
    return {"Q_rope": F.rotary_forward(q, pos, *table)[0], "K_rope": F.rotary_forward(k, pos, *table)[0]}


def hf_qk_after_rope(torch, module, x: np.ndarray, cos_sin, apply_rotary_pos_emb) -> dict:
    """HF's Q and K after RoPE: its q/k_proj, the head split, its model's ``apply_rotary_pos_emb``."""
    tx, (B, L, _), d = tensor(torch, x), x.shape, module.head_dim
    with torch.no_grad():
        q_t = module.q_proj(tx).view(B, L, -1, d).transpose(1, 2)  # (B, H, L, d)
        k_t = module.k_proj(tx).view(B, L, -1, d).transpose(1, 2)  # (B, Hkv, L, d)
        Q_t, K_t = apply_rotary_pos_emb(q_t, k_t, *cos_sin)
    return {"Q_rope": Q_t.numpy(), "K_rope": K_t.numpy()}


def hidden(hidden_states, dtype) -> np.ndarray:
    """hidden_states (B, L, E) as an array of ``dtype``."""
    return np.asarray(hidden_states).astype(dtype, copy=False)


LLAMA_ROWS = (
    Row("output", "module(x, (cos, sin), causal)", "output"),
    Row("Q after RoPE", "apply_rotary_pos_emb", "Q_rope"),
    Row("K after RoPE", "apply_rotary_pos_emb", "K_rope"),
    Row("dL/dx (q+k+v paths)", "hidden_states.grad", "dx"),
)
"""The rows of ``crosscheck_hf_llama_attention`` before the gradients of the parameters."""


def crosscheck_hf_llama_attention(
    module: LlamaAttention,
    hidden_states: np.ndarray,
    positions=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
) -> CrosscheckReport:
    """A transformers ``LlamaAttention`` (RoPE + GQA, causal) against ``from_hf_llama_attention(module)``.

    hidden_states (B, L, E) NumPy; positions None (0..L-1), (L,) or (B, L). HF gets float64 (cos, sin) built with
    torch ops and an explicit additive causal mask. Rows: the output, Q and K after RoPE (ours from the pairs,
    theirs from HF's q/k_proj + ``apply_rotary_pos_emb``), and the gradient of a random upstream gradient with
    respect to the input and every parameter.
    """
    torch = require("torch")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    mha = from_hf_llama_attention(module)
    x = hidden(hidden_states, mha.dtype)
    B, L, E = x.shape
    pos, d_output = positions_of(positions, B, L), upstream(d_output, x.shape, mha.dtype, rng)
    ours, _ = run_ours(mha, (x, x, x), d_output, mask=M.causal_mask(L), positions=pos)
    cos_sin = torch_cos_sin(torch, pos, mha.head_dim, mha.rope_theta, mha.dtype)
    name_map = {n: entry for n, entry in HF_LLAMA_NAME_MAP.items() if n in mha.params}
    theirs = run_hf_attention(torch, module, x, cos_sin, causal_tensor(torch, L, L, mha.dtype), d_output, name_map)
    title = (f"transformers LlamaAttention (H={mha.num_heads}, Hkv={mha.num_kv_heads}, "
             f"rope_theta={mha.rope_theta:g}, {module.config._attn_implementation})")  # fmt: skip
    rows = LLAMA_ROWS + grad_rows(name_map)
    ours.update(ours_qk_after_rope(mha, x, pos))
    theirs.update(hf_qk_after_rope(torch, module, x, cos_sin, apply_rotary_pos_emb))
    note = rope_note(torch, LlamaRotaryEmbedding, module.config, pos, cos_sin[0])
    return compare(title, mha.dtype, rtol_for(mha.dtype, rtol), rows, ours, theirs, [note])


def crosscheck_hf_llama_kv_cache(
    module: LlamaAttention,
    hidden_states: np.ndarray,
    prefill: int = 3,
    rtol: float | None = None,
) -> CrosscheckReport:
    """Decoding with a cache: ours (``KVCache``) against ``LlamaAttention`` with a transformers ``DynamicCache``.

    hidden_states (B, L, E): the first ``prefill`` tokens in one call, then one token per call. Rows: the
    outputs of every call (concatenated, (B, L, E)) against HF's cached decoding; ours cached against our own
    full causal forward; the cached keys (after RoPE) and values against HF's cache.
    """
    torch = require("torch")
    mha = from_hf_llama_attention(module)
    dtype, x = mha.dtype, hidden(hidden_states, mha.dtype)
    B, L, E = x.shape
    calls, kv = decode_calls(L, prefill), KVCache()
    ours = {"outputs": decode(calls, lambda a, b: mha.forward(*(x[:, a:b],) * 3, kv_cache=kv)[0])}
    ours.update(full=mha.forward(x, x, x, mask=M.causal_mask(L))[0], keys=kv.keys, values=kv.values)
    cos_sin = torch_cos_sin(torch, positions_of(None, B, L), mha.head_dim, mha.rope_theta, dtype)
    outputs, layer = hf_decode(torch, module, x, calls, cos_sin, partial(causal_call_mask, torch, dtype))
    theirs = {"outputs": outputs, "keys": layer.keys.numpy(), "values": layer.values.numpy()}
    title = f"KV cache vs transformers DynamicCache (prefill {prefill}, then {L - prefill} single steps)"
    note = f"our KVCache: {kv.nbytes} bytes for {len(kv)} positions ({kv.bytes_per_token} per token)"
    rows = decoding_rows("LlamaAttention(..., cache=)")
    return compare(title, dtype, rtol_for(dtype, rtol), rows, ours, theirs, [note])


def hf_llama_attention(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    rope_theta: float = 10000.0,
    bias: bool = True,
    dtype=np.float64,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    head_dim: int | None = None,
) -> LlamaAttention:
    """A small random transformers ``LlamaAttention`` (layer 0) for the cross-checks; nonzero biases when ``bias``."""
    torch = require("torch")
    require("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    cfg = LlamaConfig(
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=1,
        vocab_size=16,
        rope_theta=rope_theta,
        attention_bias=bias,
        attn_implementation=attn_implementation,
        head_dim=head_dim or hidden_size // num_heads,
    )
    torch.manual_seed(seed)
    module = LlamaAttention(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)  # zero biases would hide bias bugs
    return module
