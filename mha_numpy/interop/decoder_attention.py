"""What the cross-checks against a Hugging Face decoder's attention share (``gemma2``: ``Gemma2Attention``,
``qwen3``: ``Qwen3Attention``): the mask a layer of the model uses, HF's eager attention recorded (and in float64
kept in float64), the check of one full-sequence call and the check of decoding with a cache.

Both modules are called as the model calls them, ``module(hidden_states, (cos, sin), attention_mask, cache=)``:

- (cos, sin) in float64 from torch ops (``llama.torch_cos_sin``), not from the model's rotary module, which
  computes its angles in float32 (a note gives that gap);
- attention_mask: HF's own, from ``masking_utils.create_causal_mask`` or ``create_sliding_window_causal_mask``
  (the one the model makes for a full or a sliding layer), with the padding of an HF ``attention_mask`` (B, L).
  Ours is made independently (``layer_mask``) and the two are compared, a row of the report;
- eager attention, the only one that applies Gemma 2's soft-cap and returns the weights. It takes its softmax in
  float32 even for float64 inputs, which costs ~1e-7: in float64 the check runs it with the softmax in float64
  (``eager_recorded``) and reports the as-shipped gap in a note. A model's own float32 steps (Qwen3's RMSNorm)
  are switched off by the ``float64_steps`` context its module passes in.

torch and transformers are imported lazily, inside the functions.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

from .. import masks as M
from ..kv_cache import KVCache
from ._harness import add_grad_rows, decode_calls, random_like
from ._lazy import require
from .llama import torch_cos_sin
from .names import NameMap, params_from_state
from .report import CrosscheckReport, rtol_for


@dataclass(frozen=True)
class DecoderAttention:
    """What the shared checks need to know of one kind of HF decoder attention.

    name: its class ("Gemma2Attention"); name_map: where each of our parameters lives in it (every one of its
    parameters must be mapped: a gradient not compared would pass unseen); rotary: the name of its model's rotary
    class in the same modeling file (for the note on float32 angles); float64_steps(module): a context manager that
    runs the module's own float32 steps in float64 (none: ``nullcontext``), float64_what names them for the note.
    """

    name: str
    name_map: NameMap
    rotary: str
    float64_steps: Callable = nullcontext
    float64_what: str = ""


def layer_mask(B: int, Lq: int, Lk: int, window: int | None = None, attention_mask=None) -> np.ndarray:
    """(B, 1, Lq, Lk) bool, True = may attend: the mask of a decoder layer for Lq queries, the last of Lk positions.

    window None: causal (bottom-right, ``masks.causal_mask(Lq, Lk, diagonal=Lk - Lq)``); an int: the sliding window
    p - window < j <= p (``masks.sliding_window_mask``, Mistral's and Hugging Face's convention). attention_mask
    (B, Lk), HF style (1 = keep): padded keys blocked. A query left with no key is refused (ValueError naming
    attention_mask): HF's eager mask is finfo.min, not -inf, so HF averages such a row over every key where ours
    gives zero weights; pad on the right, with fewer pads than the window.
    """
    offset = Lk - Lq
    if window is None:
        allowed = M.causal_mask(Lq, Lk, diagonal=offset)  # (Lq, Lk)
    else:
        allowed = M.sliding_window_mask(Lq, Lk, window, offset=offset)  # (Lq, Lk)
    mask = np.broadcast_to(allowed, (B, 1, Lq, Lk))  # (B, 1, Lq, Lk)
    if attention_mask is not None:
        pad = M.padding_mask(attention_mask=attention_mask)  # (B, 1, 1, Lk)
        if pad.shape != (B, 1, 1, Lk):
            raise ValueError(f"attention_mask must be (B, L) = {(B, Lk)}, got {pad.shape[::3]}")
        mask = mask & pad
    empty = ~mask.any(axis=-1)  # (B, 1, Lq)
    if empty.any():
        b, _, i = np.argwhere(empty)[0]
        raise ValueError(
            f"attention_mask leaves query {i + offset} of batch item {b} no key to attend to: HF's eager attention "
            "averages such a row over every key, ours gives it zero weights; pad on the right, fewer than the window"
        )
    return np.ascontiguousarray(mask)


def hf_layer_mask(torch, module, inputs, attention_mask, cache=None):
    """HF's own mask for the layer of ``module`` (full or sliding), as its model makes it before the layer runs.

    inputs: the call's (B, Lq, E) tensor (only its shape and dtype are read); attention_mask: (B, cached + Lq) HF
    style or None; cache: the ``DynamicCache`` before the call. -> (B, 1, Lq, Lk) additive tensor (0 / finfo.min),
    Lk the keys the layer sees (a sliding layer's cache keeps only window - 1 of the past).
    """
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    make = create_causal_mask if module.sliding_window is None else create_sliding_window_causal_mask
    am = None if attention_mask is None else torch.from_numpy(np.ascontiguousarray(attention_mask))
    return make(config=module.config, inputs_embeds=inputs, attention_mask=am, cache=cache)


def allowed_of(hf_mask, shape) -> np.ndarray:
    """HF's additive mask (None: everything allowed) -> bool (True where 0), broadcast to ``shape``."""
    if hf_mask is None:
        return np.ones(shape, bool)
    return np.broadcast_to(hf_mask.numpy() == 0, shape)


@contextmanager
def softmax_in_input_dtype(torch):
    """Within the block, ``torch.nn.functional.softmax(x, dim, dtype=torch.float32)`` of a float64 x stays in
    float64 (HF's eager attention asks for float32 whatever the input's dtype). Restored afterwards."""
    functional = torch.nn.functional
    softmax = functional.softmax

    def in_float64(input, dim=None, _stacklevel=3, dtype=None):
        if dtype == torch.float32 and input.dtype == torch.float64:
            dtype = torch.float64
        return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    functional.softmax = in_float64
    try:
        yield
    finally:
        functional.softmax = softmax


def require_eager(module) -> None:
    """ValueError unless ``module`` runs HF's eager attention."""
    if module.config._attn_implementation != "eager":
        raise ValueError(
            f"the cross-check runs HF's eager attention (it applies Gemma 2's soft-cap and returns the weights); "
            f"the module has attn_implementation={module.config._attn_implementation!r}"
        )


@contextmanager
def eager_recorded(torch, module, float64: bool):
    """Within the block, ``module``'s eager attention (its modeling file's ``eager_attention_forward``) records the
    query, key and value it receives (after QK-norm, RoPE and the cache) in the dict it yields; with float64 its
    softmax runs in float64 (``softmax_in_input_dtype``). The modeling file's function is restored afterwards."""
    require_eager(module)
    modeling = sys.modules[type(module).__module__]
    eager = modeling.eager_attention_forward
    seen: dict = {}

    def recorded(mod, query, key, value, *args, **kwargs):
        seen.update(query=query.detach(), key=key.detach(), value=value.detach())
        with softmax_in_input_dtype(torch) if float64 else nullcontext():
            return eager(mod, query, key, value, *args, **kwargs)

    modeling.eager_attention_forward = recorded
    try:
        yield seen
    finally:
        modeling.eager_attention_forward = eager


def rotary_note(torch, kind: DecoderAttention, module, positions: np.ndarray, cos_t) -> str:
    """How far the model's own rotary module (float32 angles) is from the float64 (cos, sin) the check uses."""
    rotary = getattr(sys.modules[type(module).__module__], kind.rotary)
    cos_hf, _ = rotary(module.config)(torch.zeros(1, dtype=torch.float64), torch.from_numpy(positions))
    err = float((cos_hf.double() - cos_t.double()).abs().max())
    return f"HF's {rotary.__name__} (float32 angles) differs from the float64 cos by {err:.1e}; not used here"


def _positions(positions, B: int, L: int) -> np.ndarray:
    """None -> 0..L-1; (L,) or (B, L) -> (B, L) int64."""
    pos = np.arange(L) if positions is None else np.asarray(positions)
    return np.broadcast_to(pos, (B, L)).astype(np.int64)


def _own_steps(kind: DecoderAttention, module, float64: bool):
    """The module's own float32 steps in float64 (float64 only; in float32 the module runs as shipped)."""
    return kind.float64_steps(module) if float64 else nullcontext()


def _run(torch, kind, module, tx, cos_sin, mask_t, d_output, float64, named):
    """One call of the HF module in eval mode -> (output, weights, seen, gradients of x and the parameters);
    float64: with its softmax and own float32 steps in float64."""
    was_training = module.training
    module.eval()
    try:
        with eager_recorded(torch, module, float64) as seen, _own_steps(kind, module, float64):
            out_t, w_t = module(tx, cos_sin, mask_t)
            g = torch.autograd.grad(out_t, [tx, *named.values()], torch.from_numpy(d_output))
    finally:
        module.train(was_training)
    return out_t.detach().numpy(), w_t.detach().numpy(), seen, [t.numpy() for t in g]


def _checked(kind: DecoderAttention, module, mha, hidden_states) -> np.ndarray:
    """Before any arithmetic: the module runs eager attention and every parameter of it is mapped; hidden_states
    (B, L, E) -> an array of the module's dtype."""
    require_eager(module)
    mapped = {torch_name for torch_name, _ in kind.name_map.values()}
    unmapped = sorted(set(dict(module.named_parameters())) - mapped)
    if unmapped:
        raise ValueError(f"{kind.name} has parameters the import does not map: {unmapped}")
    x = np.asarray(hidden_states)
    if x.ndim != 3 or x.shape[-1] != mha.embed_dim or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"hidden_states must be float (B, L, E={mha.embed_dim}), got {x.dtype} {x.shape}")
    return x.astype(mha.dtype, copy=False)


def _relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    """max |ours - theirs| relative to the largest entry of theirs (a CrosscheckReport row's measure)."""
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), np.finfo(np.float64).tiny))


def crosscheck_decoder_attention(
    kind: DecoderAttention, module, mha, title, hidden_states, attention_mask, positions, d_output, rng, rtol
) -> CrosscheckReport:
    """One call of a decoder's attention, ours (``mha``, imported from ``module``) against HF's eager module and
    torch autograd: see ``gemma2.crosscheck_hf_gemma2_attention``."""
    torch = require("torch")
    x, name_map = _checked(kind, module, mha, hidden_states), kind.name_map
    dtype, d = mha.dtype, mha.head_dim
    rtol = rtol_for(dtype, rtol)
    B, L, E = x.shape
    pos = _positions(positions, B, L)  # (B, L)
    d_output = random_like((B, L, E), dtype, rng) if d_output is None else np.asarray(d_output, dtype=dtype)
    mask = layer_mask(B, L, L, module.sliding_window, attention_mask)  # (B, 1, L, L)

    out, cache = mha.forward(x, x, x, mask=mask, positions=pos)
    ours = dict(Q=cache.Q, K=cache.K, V=cache.V, weights=cache.attn_weights)  # read before the backward
    grads = mha.backward(d_output, cache)

    tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
    cos_sin = torch_cos_sin(torch, pos, d, mha.rope_theta, dtype)
    mask_t = hf_layer_mask(torch, module, tx, attention_mask)
    named = dict(module.named_parameters())
    float64 = dtype == np.float64
    out_t, w_t, seen, g = _run(torch, kind, module, tx, cos_sin, mask_t, d_output, float64, named)

    report = CrosscheckReport(title, dtype, rtol)
    hf_mask = "create_sliding_window_causal_mask" if module.sliding_window else "create_causal_mask"
    report.compare("mask (allowed keys)", hf_mask, mask, allowed_of(mask_t, mask.shape))
    report.compare("output", "module(x, (cos, sin), mask)", out, out_t)
    report.compare("attention weights", "module(...)[1] (eager)", ours["weights"], w_t)
    for name, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
        report.compare(f"{name} (as attended)", f"eager_attention_forward {theirs}", ours[name], seen[theirs].numpy())
    report.compare("dL/dx (q+k+v paths)", "hidden_states.grad", grads["query"] + grads["key"] + grads["value"], g[0])
    add_grad_rows(report, grads, params_from_state(dict(zip(named, g[1:])), name_map), name_map)
    report.notes.append(rotary_note(torch, kind, module, pos, cos_sin[0]))
    if float64:  # the module as shipped: its softmax (and any own step) in float32
        shipped, _, _, g_shipped = _run(torch, kind, module, tx, cos_sin, mask_t, d_output, False, named)
        theirs_g = params_from_state(dict(zip(named, g_shipped[1:])), name_map)
        err_y, err_g = _relative(out, shipped), max(_relative(grads[n], theirs_g[n]) for n in name_map)
        report.notes.append(
            f"HF run with its eager softmax{kind.float64_what} in float64; as shipped (in float32) "
            f"it differs from ours by {err_y:.1e} (output) and {err_g:.1e} (worst parameter gradient), relative"
        )
    real = B * L if attention_mask is None else int(np.sum(attention_mask))
    window = "full causal" if module.sliding_window is None else f"sliding window {module.sliding_window}"
    report.notes.append(f"batch {B} x {L} tokens ({real} real), {window}, kernel {mha.impl}, random upstream gradient")
    return report


def crosscheck_decoder_kv_cache(
    kind: DecoderAttention, module, mha, title, hidden_states, attention_mask, prefill, chunk, rtol
) -> CrosscheckReport:
    """Decoding with a cache, ours (``KVCache``) against ``module`` with a transformers ``DynamicCache`` (a sliding
    layer's keeps window - 1 past positions): see ``gemma2.crosscheck_hf_gemma2_kv_cache``."""
    torch = require("torch")
    from transformers import DynamicCache

    x, dtype, d = _checked(kind, module, mha, hidden_states), mha.dtype, mha.head_dim
    rtol = rtol_for(dtype, rtol)
    B, L, E = x.shape
    calls = decode_calls(L, prefill, chunk)
    am = None if attention_mask is None else np.asarray(attention_mask)
    window = module.sliding_window

    kv, ours, ours_masks = KVCache(), [], np.zeros((B, 1, L, L), bool)
    for a, b in calls:  # the call's queries are positions a .. b - 1; its keys every position up to b - 1
        mask = layer_mask(B, b - a, b, window, None if am is None else am[:, :b])  # (B, 1, b - a, b)
        ours.append(mha.forward(x[:, a:b], x[:, a:b], x[:, a:b], mask=mask, kv_cache=kv)[0])
        ours_masks[:, :, a:b, :b] = mask
    ours = np.concatenate(ours, axis=1)  # (B, L, E)
    full, _ = mha.forward(x, x, x, mask=layer_mask(B, L, L, window, am))

    hf_cache = DynamicCache(config=module.config)
    cos_t, sin_t = torch_cos_sin(torch, _positions(None, B, L), d, mha.rope_theta, dtype)
    tx = torch.from_numpy(np.ascontiguousarray(x))
    theirs, theirs_masks = [], np.zeros((B, 1, L, L), bool)
    was_training = module.training
    module.eval()
    try:
        float64 = dtype == np.float64
        with torch.no_grad(), eager_recorded(torch, module, float64), _own_steps(kind, module, float64):
            for a, b in calls:
                mask_t = hf_layer_mask(torch, module, tx[:, a:b], None if am is None else am[:, :b], hf_cache)
                theirs.append(module(tx[:, a:b], (cos_t[:, a:b], sin_t[:, a:b]), mask_t, cache=hf_cache)[0].numpy())
                seen = mask_t.shape[-1]  # the keys HF's layer attends to: the last `seen` of positions 0 .. b - 1
                theirs_masks[:, :, a:b, b - seen : b] = allowed_of(mask_t, (B, 1, b - a, seen))
    finally:
        module.train(was_training)
    layer = hf_cache.layers[module.layer_idx]
    kept = layer.keys.shape[2]  # a sliding layer keeps window - 1 past positions

    report = CrosscheckReport(title, dtype, rtol)
    report.compare("masks, every call", "create_*_mask(..., cache)", ours_masks, theirs_masks)
    report.compare("outputs, every call", "module(..., cache=)", ours, np.concatenate(theirs, axis=1))
    report.compare("cached ≡ full forward", "ours, one masked forward", ours, full, note="ours vs ours")
    report.compare("cached keys (as attended)", "DynamicCache keys", kv.keys[:, :, L - kept :], layer.keys.numpy())
    report.compare("cached values", "DynamicCache values", kv.values[:, :, L - kept :], layer.values.numpy())
    what = "full causal" if window is None else f"sliding window {window}: HF's cache keeps the last {kept}"
    report.notes.append(f"calls {calls}; {what}; kernel {mha.impl}; our KVCache holds {len(kv)} positions")
    return report
