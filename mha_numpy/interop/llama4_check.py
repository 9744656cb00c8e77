"""Llama 4's attention layers against Hugging Face ``Llama4TextAttention``: one call and decoding (the importer and
the layers' options: ``llama4``).

Llama 4 rounds through float32 in four places: its rotary module (float32 angles), ``apply_rotary_emb``
(``xq.float()``, complex64), ``Llama4TextL2Norm`` (``x.float()``) and the temperature's ``positions.float()`` and
log1p. The float64 check gets its ``freqs_cis`` from its own rotary module lifted to float64 (``rope.float64_rope``:
its table, scaling included, read from its config, not from ours) and runs the other three in float64
(``float64_throughout``); the module as shipped is reported in a note. torch and transformers are imported lazily.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import numpy as np

from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from ._lazy import require
from .decoder_attention import eager_recorded
from .harness import (
    Row,
    autograd,
    compare,
    decode,
    decode_calls,
    eval_mode,
    grad_rows,
    on_kernel,
    positions_of,
    run_ours,
    shipped_gap,
    tensor,
    theirs_grads,
    upstream,
)
from .llama4 import from_hf_llama4_attention, llama4_layer_mask, llama4_name_map
from .report import CrosscheckReport, rtol_for
from .rope import float64_rope

if TYPE_CHECKING:  # annotations only
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention


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
    return on_kernel(from_hf_llama4_attention(module), kernel, recompute)


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
