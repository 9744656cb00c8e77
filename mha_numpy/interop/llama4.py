"""Llama 4's attention layers against Hugging Face ``Llama4TextAttention``: the importer, one call, decoding.

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

Llama 4 rounds through float32 in four places: its rotary module (float32 angles), ``apply_rotary_emb``
(``xq.float()``, complex64), ``Llama4TextL2Norm`` (``x.float()``) and the temperature's ``positions.float()`` and
log1p. The float64 check gets its ``freqs_cis`` from its own rotary module lifted to float64 (``rope.float64_rope``:
its table, scaling included, read from its config, not from ours) and runs the other three in float64
(``float64_throughout``); the module as shipped is reported in a note.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import numpy as np

from .. import masks as M
from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ._lazy import require
from .convert import module_with_params, numpy_dtype_of
from .decoder_attention import eager_recorded
from .harness import (
    Row,
    autograd,
    compare,
    decode,
    decode_calls,
    eval_mode,
    grad_rows,
    positions_of,
    run_ours,
    shipped_gap,
    tensor,
    theirs_grads,
    upstream,
)
from .llama import PROJECTIONS, hf_rope_theta
from .names import params_from_state
from .report import CrosscheckReport, rtol_for
from .rope import float64_rope, hf_rope_scaling

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


# --------------------------------------------------------------------------- Llama 4 in float64


def hf_freqs_cis(torch, config, positions: np.ndarray):
    """Llama 4's rotation (B, L, d/2) complex128 from its own ``Llama4TextRotaryEmbedding`` (its config's base and
    scaling) lifted to float64 (``rope.float64_rope``)."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding

    with float64_rope(torch), torch.no_grad():
        rotary = Llama4TextRotaryEmbedding(config)
        return rotary(torch.zeros(1, dtype=torch.float64), torch.from_numpy(np.asarray(positions, np.int64)))


@contextmanager
def float64_throughout(torch, module):
    """Within the block, Llama 4's own float32 steps in the input's dtype: ``apply_rotary_emb`` (complex128 for
    float64), the L2 norm (no ``x.float()``) and ``torch.log1p`` of float32 (the temperature's positions) in
    float64. Restored afterwards."""
    modeling = sys.modules[type(module).__module__]
    apply, log1p = modeling.apply_rotary_emb, torch.log1p

    def apply_rotary_emb(xq, xk, freqs_cis):  # Llama 4's, without .float()
        xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))  # (B, L, H, d/2) complex
        xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
        return (torch.view_as_real(xq_ * freqs_cis[:, :, None, :]).flatten(3),
                torch.view_as_real(xk_ * freqs_cis[:, :, None, :]).flatten(3))  # fmt: skip

    def log1p_float64(x, *args, **kwargs):
        return log1p(x.double() if x.dtype == torch.float32 else x, *args, **kwargs)

    norm = getattr(module, "qk_norm", None)
    modeling.apply_rotary_emb, torch.log1p = apply_rotary_emb, log1p_float64
    if norm is not None:
        norm.forward = norm._norm  # x · rsqrt(mean(x²) + eps) without the float32 round trip
    try:
        yield module
    finally:
        modeling.apply_rotary_emb, torch.log1p = apply, log1p
        if norm is not None:
            del norm.forward


def hf_layer_mask(torch, module, x, attention_mask, cache=None):
    """HF's own mask for the layer (``create_chunked_causal_mask`` or ``create_causal_mask``, as Llama4TextModel
    makes it), for the call's inputs x (B, Lq, E) after ``cache``; attention_mask (B, cached + Lq) or None."""
    from transformers.masking_utils import create_causal_mask, create_chunked_causal_mask

    chunked = module.config.layer_types[module.layer_idx] == "chunked_attention"
    make = create_chunked_causal_mask if chunked else create_causal_mask
    am = None if attention_mask is None else torch.from_numpy(np.ascontiguousarray(attention_mask))
    return make(config=module.config, inputs_embeds=tensor(torch, x), attention_mask=am, cache=cache)


def _allowed(hf_mask, shape) -> np.ndarray:
    return np.ones(shape, bool) if hf_mask is None else np.broadcast_to(hf_mask.numpy() == 0, shape)


def _hf_call(torch, module, x, freqs, mask_t, d_output, name_map, float64: bool) -> dict:
    """Llama 4's module on one call with torch autograd, and the Q, K, V its eager attention saw."""
    tx, named = tensor(torch, x, grad=True), dict(module.named_parameters())
    steps = float64_throughout(torch, module) if float64 else nullcontext()
    with eval_mode(module), eager_recorded(torch, module, float64) as seen, steps:
        out_t, w_t = module(tx, freqs, mask_t)
        (dx,), grads = autograd(torch, out_t, [tx], named, d_output)
    theirs = {"output": out_t.detach().numpy(), "weights": w_t.detach().numpy(), "dx": dx}
    theirs.update({n: seen[name].numpy() for n, name in (("Q", "query"), ("K", "key"), ("V", "value"))})
    return {**theirs, **theirs_grads(grads, name_map)}


def _ours_as_attended(mha, ours: dict, module, L: int, cached: int = 0) -> None:
    """Our Q times the temperature's gains (ours scales the scores, Llama 4 the queries: the same scores)."""
    if mha.log_length_scale is not None:
        p = np.arange(cached, cached + L)
        gain = np.log1p(np.floor((p + 1) / mha.log_length_floor)) * mha.log_length_scale + 1.0  # (L,)
        ours["Q"] = ours["Q"] * gain[:, None]


def _title(module, mha, what: str) -> str:
    kind = f"RoPE θ={mha.rope_theta:g}" if module.use_rope else "NoPE"
    extras = [x for x, on in (("L2 QK-norm", mha.qk_norm), ("temperature", mha.log_length_scale)) if on]
    layer = module.config.layer_types[module.layer_idx]
    chunk = f" {module.config.attention_chunk_size}" if layer == "chunked_attention" else ""
    return (f"{what} transformers Llama4TextAttention (layer {module.layer_idx}: {kind}, {', '.join(extras) or '-'}, "
            f"{layer}{chunk}; H={mha.num_heads}, Hkv={mha.num_kv_heads}, d={mha.head_dim}, {mha.impl})")  # fmt: skip


def _imported(module, kernel, recompute: bool) -> MultiHeadAttention:
    if module.config._attn_implementation != "eager":
        raise ValueError(f"the cross-check runs HF's eager attention (it returns the weights); the module has "
                         f"attn_implementation={module.config._attn_implementation!r}")  # fmt: skip
    mha = from_hf_llama4_attention(module)
    if kernel is not None:
        mha.kernel = kernel
    mha.recompute = recompute
    return mha


def _checked_mask(mask, shape) -> np.ndarray:
    """Our mask's entries (B, 1, Lq, Lk); ValueError naming attention_mask when a query is left no key (HF's eager
    mask is finfo.min: it would average such a row over every key, ours gives it zero weights)."""
    dense = np.broadcast_to(np.asarray(mask), shape)
    if not dense.any(axis=-1).all():
        b, _, i = np.argwhere(~dense.any(axis=-1))[0]
        raise ValueError(f"attention_mask leaves query {i} of batch item {b} no key in its chunk; pad on the right")
    return dense


def _rows(module, name_map) -> tuple[Row, ...]:
    """The rows of ``crosscheck_hf_llama4_attention``."""
    seen = (("Q", "query"), ("K", "key"), ("V", "value"))
    return (
        Row("mask (allowed keys)", "create_chunked_causal_mask" if module.use_rope else "create_causal_mask", "mask"),
        Row("output", "module(x, freqs_cis, mask)", "output"),
        Row("attention weights", "module(...)[1] (eager)", "weights"),
        *(Row(f"{n} (as attended)", f"eager_attention_forward {theirs}", n) for n, theirs in seen),
        Row("dL/dx (q+k+v paths)", "hidden_states.grad", "dx"),
        *grad_rows(name_map),
    )


def crosscheck_hf_llama4_attention(
    module: Llama4TextAttention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    positions=None,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    rtol: float | None = None,
    kernel=None,
    recompute: bool = False,
) -> CrosscheckReport:
    """A transformers ``Llama4TextAttention`` (eager) against ``from_hf_llama4_attention(module)`` and torch autograd.

    hidden_states (B, L, E); attention_mask (B, L) HF style (1 = keep) or None; positions None (0 ... L - 1), (L,)
    or (B, L) (RoPE's; the temperature counts the call's positions from 0, as Llama 4 does). Ours gets the layer's
    mask (``llama4_layer_mask``), HF its own (``create_chunked_causal_mask`` / ``create_causal_mask``); rows: the
    masks, the output, the weights, Q, K, V as attended, dL/dx and every parameter's gradient. Default pass
    threshold 1e-10 in float64 (Llama 4's float32 steps in float64, the as-shipped gap in a note), 1e-5 in float32.
    """
    torch = require("torch")
    mha = _imported(module, kernel, recompute)
    x = np.asarray(hidden_states).astype(mha.dtype, copy=False)
    B, L, _ = x.shape
    pos, d_output = positions_of(positions, B, L), upstream(d_output, x.shape, mha.dtype, rng)
    mask = llama4_layer_mask(module.config, module.layer_idx, L, L, attention_mask)
    dense = _checked_mask(mask, (B, 1, L, L))
    rope = {"positions": pos} if module.use_rope else {}  # a NoPE layer reads no position (but the temperature's)
    ours, _ = run_ours(mha, (x, x, x), d_output, mask=mask, **rope)
    _ours_as_attended(mha, ours, module, L)
    freqs = hf_freqs_cis(torch, module.config, pos)
    mask_t, name_map = hf_layer_mask(torch, module, x, attention_mask), llama4_name_map(module)
    call = (torch, module, x, freqs, mask_t, d_output, name_map)
    theirs = _hf_call(*call, float64=mha.dtype == np.float64)
    ours["mask"], theirs["mask"] = dense, _allowed(mask_t, dense.shape)
    notes = [f"batch {B} x {L} tokens, kernel {mha.impl}, random upstream gradient", *_shipped_note(mha, ours, call)]
    title, rtol = _title(module, mha, "ours vs"), rtol_for(mha.dtype, rtol)
    return compare(title, mha.dtype, rtol, _rows(module, name_map), ours, theirs, notes)


def _shipped_note(mha, ours, call) -> list[str]:
    """In float64, how far Llama 4 as shipped (its float32 steps) is from ours (b_k's gradient, 0 in theory, left
    out); nothing in float32."""
    if mha.dtype != np.float64:
        return []
    err_y, err_g = shipped_gap(ours, _hf_call(*call, float64=False), grads=[n for n in mha.params if n != "b_k"])
    return [f"HF run with its rope, L2 norm and temperature in float64; as shipped (float32) it differs from ours "
            f"by {err_y:.1e} (output) and {err_g:.1e} (worst parameter gradient), relative"]  # fmt: skip


def _ours_decoding(mha, module, x, calls, am) -> dict:
    """Our decoding (``KVCache``, the layer's mask each call) and one forward of the whole sequence."""
    cfg, L, kv = module.config, x.shape[1], KVCache()

    def step(a, b):
        mask = llama4_layer_mask(cfg, module.layer_idx, b - a, b, None if am is None else am[:, :b])
        return mha.forward(x[:, a:b], x[:, a:b], x[:, a:b], mask=mask, kv_cache=kv)[0]

    outputs = decode(calls, step)
    return {
        "outputs": outputs,
        "full": mha.forward(x, x, x, mask=llama4_layer_mask(cfg, module.layer_idx, L, L, am))[0],
    }


def _hf_decoding(torch, module, x, calls, am, float64: bool) -> dict:
    """Llama 4's decoding with a ``DynamicCache`` and HF's mask each call, in float64 as ``float64_throughout``."""
    from transformers import DynamicCache

    cfg, (B, L, _) = module.config, x.shape
    hf_cache, freqs = DynamicCache(config=cfg), hf_freqs_cis(torch, cfg, positions_of(None, B, L))

    def step(a, b):
        mask_t = hf_layer_mask(torch, module, x[:, a:b], None if am is None else am[:, :b], hf_cache)
        return module(tensor(torch, x[:, a:b]), freqs[:, a:b], mask_t, cache=hf_cache)[0].numpy()

    with eval_mode(module), torch.no_grad(), eager_recorded(torch, module, float64):
        with float64_throughout(torch, module) if float64 else nullcontext():
            return {"outputs": decode(calls, step)}


def crosscheck_hf_llama4_kv_cache(
    module: Llama4TextAttention,
    hidden_states: np.ndarray,
    attention_mask: np.ndarray | None = None,
    prefill: int = 3,
    chunk: int = 1,
    rtol: float | None = None,
    kernel=None,
) -> CrosscheckReport:
    """Decoding: ours (``KVCache``, the layer's mask each call) against ``Llama4TextAttention`` with a transformers
    ``DynamicCache`` (a chunked layer's keeps attention_chunk_size positions) and HF's mask each call; the first
    ``prefill`` tokens in one call, then ``chunk`` a call. Rows: every call's outputs; ours cached against ours in
    one forward. The temperature counts the cached positions (Llama 4's ``past_seen_tokens``)."""
    torch = require("torch")
    mha = _imported(module, kernel, False)
    x = np.asarray(hidden_states).astype(mha.dtype, copy=False)
    calls = decode_calls(x.shape[1], prefill, chunk)
    ours = _ours_decoding(mha, module, x, calls, attention_mask)
    theirs = _hf_decoding(torch, module, x, calls, attention_mask, mha.dtype == np.float64)
    rows = (
        Row("outputs, every call", "module(..., cache=)", "outputs"),
        Row("cached ≡ full forward", "ours, one masked forward", "outputs", note="ours vs ours", reference="full"),
    )
    note = f"calls {calls}; {module.config.layer_types[module.layer_idx]}; kernel {mha.impl}"  # fmt: skip
    title = _title(module, mha, f"KV cache (prefill {prefill}, then {chunk} a call) vs")
    return compare(title, mha.dtype, rtol_for(mha.dtype, rtol), rows, ours, theirs, [note])


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
