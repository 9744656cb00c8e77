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

import inspect
import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np

from .. import masks as M
from ..kv_cache import KVCache
from ._lazy import require
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
    shipped_gap,
    tensor,
    upstream,
)
from .llama import rope_note, torch_cos_sin
from .names import NameMap
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
    cos_sin: Callable | None = None  # (torch, module, positions, dtype) -> HF's (cos, sin) from its own config

    def theirs_cos_sin(self, torch, module, mha, positions, dtype):
        """HF's (cos, sin) (B, L, d) in float64, cast to dtype: from the module's own config when the kind says how
        (Gemma 3: its layer type's base and scaling, so a base imported wrong fails the check), else from our base
        (``llama.torch_cos_sin``)."""
        if self.cos_sin is not None:
            return self.cos_sin(torch, module, positions, dtype)
        return torch_cos_sin(torch, positions, mha.head_dim, mha.rope_theta, dtype)


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
    if "layer_type" in inspect.signature(rotary.forward).parameters:  # one rotation per layer type (Gemma 3)
        rotary = _of_layer_type(rotary, module.layer_type)
    return rope_note(torch, rotary, module.config, positions, cos_t)


def _of_layer_type(rotary, layer_type: str):
    """The rotary class whose forward(x, position_ids) turns by the angles of ``layer_type`` (Gemma 3 keeps one
    rotation per layer type, chosen by a third argument)."""

    def forward(self, x, position_ids):
        return rotary.forward(self, x, position_ids, layer_type)

    return type(rotary.__name__, (rotary,), {"forward": forward})


def _own_steps(kind: DecoderAttention, module, float64: bool):
    """The module's own float32 steps in float64 (float64 only; in float32 the module runs as shipped)."""
    return kind.float64_steps(module) if float64 else nullcontext()


@contextmanager
def in_float64(torch, kind: DecoderAttention, module, float64: bool):
    """Within the block, ``eager_recorded`` (the dict it yields) and, with float64, the module's float32 steps in
    float64."""
    with eager_recorded(torch, module, float64) as seen, _own_steps(kind, module, float64):
        yield seen


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


QKV_SEEN = (("Q", "query"), ("K", "key"), ("V", "value"))


def attention_rows(module, name_map: NameMap) -> tuple[Row, ...]:
    """The rows of ``crosscheck_decoder_attention``: the masks, the output, the weights, Q, K, V as the attention
    takes them, the gradients of the input and of every parameter."""
    hf_mask = "create_sliding_window_causal_mask" if module.sliding_window else "create_causal_mask"
    return (
        Row("mask (allowed keys)", hf_mask, "mask"),
        Row("output", "module(x, (cos, sin), mask)", "output"),
        Row("attention weights", "module(...)[1] (eager)", "weights"),
        *(Row(f"{n} (as attended)", f"eager_attention_forward {theirs}", n) for n, theirs in QKV_SEEN),
        Row("dL/dx (q+k+v paths)", "hidden_states.grad", "dx"),
        *grad_rows(name_map),
    )


def _hf_call(torch, kind: DecoderAttention, module, x, cos_sin, mask_t, d_output, float64: bool) -> dict:
    """HF's module on one call with autograd (``run_hf_attention``), and the Q, K, V its eager attention saw."""
    with in_float64(torch, kind, module, float64) as seen:
        theirs = run_hf_attention(torch, module, x, cos_sin, mask_t, d_output, kind.name_map)
    return {**theirs, **{n: seen[name].numpy() for n, name in QKV_SEEN}}


def crosscheck_decoder_attention(
    kind: DecoderAttention, module, mha, title, hidden_states, attention_mask, positions, d_output, rng, rtol
) -> CrosscheckReport:
    """One call of a decoder's attention, ours (``mha``, imported from ``module``) against HF's eager module and
    torch autograd: see ``gemma2.crosscheck_hf_gemma2_attention``."""
    torch = require("torch")
    x, dtype = _checked(kind, module, mha, hidden_states), mha.dtype
    B, L, E = x.shape
    pos, d_output = positions_of(positions, B, L), upstream(d_output, x.shape, dtype, rng)
    mask = layer_mask(B, L, L, module.sliding_window, attention_mask)  # (B, 1, L, L)
    ours, _ = run_ours(mha, (x, x, x), d_output, mask=mask, positions=pos)
    cos_sin = kind.theirs_cos_sin(torch, module, mha, pos, dtype)
    mask_t = hf_layer_mask(torch, module, tensor(torch, x), attention_mask)
    float64 = dtype == np.float64
    theirs = _hf_call(torch, kind, module, x, cos_sin, mask_t, d_output, float64)
    ours["mask"], theirs["mask"] = mask, allowed_of(mask_t, mask.shape)
    notes = [rotary_note(torch, kind, module, pos, cos_sin[0])]
    if float64:  # the module as shipped: its softmax (and any own step) in float32
        err_y, err_g = shipped_gap(ours, _hf_call(torch, kind, module, x, cos_sin, mask_t, d_output, False))
        notes.append(
            f"HF run with its eager softmax{kind.float64_what} in float64; as shipped (in float32) it differs "
            f"from ours by {err_y:.1e} (output) and {err_g:.1e} (worst parameter gradient), relative"
        )
    real = B * L if attention_mask is None else int(np.sum(attention_mask))
    window = "full causal" if module.sliding_window is None else f"sliding window {module.sliding_window}"
    notes.append(f"batch {B} x {L} tokens ({real} real), {window}, kernel {mha.impl}, random upstream gradient")
    return compare(title, dtype, rtol_for(dtype, rtol), attention_rows(module, kind.name_map), ours, theirs, notes)


DECODING_ROWS = (
    Row("masks, every call", "create_*_mask(..., cache)", "masks"),
    *decoding_rows("module(..., cache=)", full=("cached ≡ full forward", "ours, one masked forward"),
                   keys=("cached keys (as attended)", "DynamicCache keys")),
)  # fmt: skip
"""The rows of ``crosscheck_decoder_kv_cache``."""


def _ours_decoding(mha, x, calls, window, am) -> dict:
    """Our decoding: ``KVCache`` and the layer's mask each call (recorded), and one forward of the whole sequence."""
    B, L, _ = x.shape
    kv, masks = KVCache(), np.zeros((B, 1, L, L), bool)

    def step(a, b):  # the call's queries are positions a .. b - 1; its keys every position up to b - 1
        mask = layer_mask(B, b - a, b, window, None if am is None else am[:, :b])  # (B, 1, b - a, b)
        masks[:, :, a:b, :b] = mask
        return mha.forward(x[:, a:b], x[:, a:b], x[:, a:b], mask=mask, kv_cache=kv)[0]

    outputs = decode(calls, step)
    full = mha.forward(x, x, x, mask=layer_mask(B, L, L, window, am))[0]
    return {"masks": masks, "outputs": outputs, "full": full, "keys": kv.keys, "values": kv.values}


def _hf_decoding(torch, kind: DecoderAttention, module, mha, x, calls, am) -> dict:
    """HF's decoding with a ``DynamicCache`` and its own mask each call (recorded, on the positions 0 .. L - 1)."""
    B, L, _ = x.shape
    masks, float64 = np.zeros((B, 1, L, L), bool), mha.dtype == np.float64

    def mask_of(a, b, cache):
        mask_t = hf_layer_mask(torch, module, tensor(torch, x[:, a:b]), None if am is None else am[:, :b], cache)
        seen = mask_t.shape[-1]  # the keys HF's layer attends to: the last `seen` of positions 0 .. b - 1
        masks[:, :, a:b, b - seen : b] = allowed_of(mask_t, (B, 1, b - a, seen))
        return mask_t

    cos_sin = kind.theirs_cos_sin(torch, module, mha, positions_of(None, B, L), mha.dtype)
    context = partial(in_float64, torch, kind, module, float64)
    outputs, layer = hf_decode(torch, module, x, calls, cos_sin, mask_of, context)
    return {"masks": masks, "outputs": outputs, "keys": layer.keys.numpy(), "values": layer.values.numpy()}


def crosscheck_decoder_kv_cache(
    kind: DecoderAttention, module, mha, title, hidden_states, attention_mask, prefill, chunk, rtol
) -> CrosscheckReport:
    """Decoding with a cache, ours (``KVCache``) against ``module`` with a transformers ``DynamicCache`` (a sliding
    layer's keeps window - 1 past positions): see ``gemma2.crosscheck_hf_gemma2_kv_cache``."""
    torch = require("torch")
    x, window = _checked(kind, module, mha, hidden_states), module.sliding_window
    L = x.shape[1]
    calls = decode_calls(L, prefill, chunk)
    am = None if attention_mask is None else np.asarray(attention_mask)
    ours = _ours_decoding(mha, x, calls, window, am)
    theirs = _hf_decoding(torch, kind, module, mha, x, calls, am)
    kept = theirs["keys"].shape[2]  # a sliding layer keeps window - 1 past positions
    ours["keys"], ours["values"] = ours["keys"][:, :, L - kept :], ours["values"][:, :, L - kept :]
    what = "full causal" if window is None else f"sliding window {window}: HF's cache keeps the last {kept}"
    note = f"calls {calls}; {what}; kernel {mha.impl}; our KVCache holds {L} positions"
    return compare(title, mha.dtype, rtol_for(mha.dtype, rtol), DECODING_ROWS, ours, theirs, [note])
