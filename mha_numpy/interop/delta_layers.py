"""The cross-check of a recurrent layer (``qwen3_next_deltanet``, ``kimi_linear_kda``, ``mamba2``) against its
transformers module, declared for ``harness.compare``: one call under torch autograd with a fresh cache (to read the
state after it), and decoding token by token.

A model file declares a ``LayerKind``: the module's class name, its name map (ours -> the torch parameter, reshaped
to our parameter's shape), the tiny config its cache is made from, our state's class and how their recurrent state
maps to ours; its ``crosscheck_*`` is ``compare(title, *layer_sides(...))``. In float64 the module runs as shipped
with float32 meaning float64 for the call (``lift.float32_is_float64``: its gates, core, gated RMSNorm and cache cast
with ``.float()`` and ``torch.float32``), its outputs and cached state checked to be float64. torch and transformers
are imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from ..recurrent.layer import DeltaNetState
from ._lazy import require, to_numpy
from .harness import Row, random_like, relative, tensor
from .lift import float32_is_float64
from .report import rtol_for


@dataclass(frozen=True)
class LayerKind:
    """How one transformers layer is called and read: ``name`` (its class), ``name_map`` (ours -> its parameter),
    ``config`` (a tiny config whose layer 0 is a linear-attention layer: the cache is made from it), ``state``
    (our state's class) and ``recurrent_as_ours`` (their cache's recurrent state -> ours; None: the same layout)."""

    name: str
    name_map: dict[str, str]
    config: Callable
    state: type = DeltaNetState
    recurrent_as_ours: Callable | None = None


def params_as_ours(named, name_map, shapes) -> dict[str, np.ndarray]:
    """torch tensors (or their gradients) by torch name -> ours by our name, copied and reshaped to ``shapes``
    (conv1d.weight (C, 1, K) -> (C, K); Kimi's dt_bias (H·d,) -> (H, d), A_log (1, 1, H, 1) -> (H,))."""
    return {
        ours: np.array(to_numpy(named[theirs]), copy=True).reshape(shapes[ours]) for ours, theirs in name_map.items()
    }


def hf_cache(kind: LayerKind):
    """A transformers ``DynamicCache`` for a model whose layer 0 is the module's (a linear-attention layer)."""
    require("transformers")
    from transformers import DynamicCache

    return DynamicCache(config=kind.config())


def _state(kind: LayerKind, cache):
    """transformers' cache of layer 0 -> our state (a ``kind.state``): its conv state (B, C, K) keeps the last K
    inputs, ours K-1."""
    conv = to_numpy(cache.get_conv_state(0, state_idx=0).detach())
    recurrent = to_numpy(cache.get_recurrent_state(0, state_idx=0).detach())
    if kind.recurrent_as_ours is not None:
        recurrent = kind.recurrent_as_ours(recurrent)
    return kind.state(conv[:, :, 1:].transpose(0, 2, 1), recurrent)  # (B, C, K-1) -> (B, K-1, C)


def run_hf(kind: LayerKind, module, shapes, x, attention_mask, d_output, lifted: bool) -> dict:
    """The module on x with a fresh cache, and torch autograd of d_output -> {"output", "dx", "conv_state",
    "recurrent_state", "grad NAME" (ours' names and shapes)}."""
    torch = require("torch")
    tx, named = tensor(torch, x, grad=True), dict(module.named_parameters())
    mask_t = None if attention_mask is None else tensor(torch, np.asarray(attention_mask).astype(np.int64))
    cache = hf_cache(kind)
    with float32_is_float64(torch) if lifted else nullcontext():
        out = module(tx, cache=cache, attention_mask=mask_t)
    if lifted:
        in_float64(out, cache)
    grads = torch.autograd.grad(out, [tx, *named.values()], tensor(torch, d_output))
    state = _state(kind, cache)
    res = {"output": out.detach().numpy(), "dx": grads[0].numpy(), "conv_state": state.conv,
           "recurrent_state": state.recurrent}  # fmt: skip
    by_name = params_as_ours(dict(zip(named, grads[1:])), kind.name_map, shapes)
    return {**res, **{f"grad {n}": g for n, g in by_name.items()}}


def in_float64(out, cache) -> None:
    """TypeError unless the lifted module's output and its cache's states are float64 (a cast the lift missed)."""
    states = (out, cache.get_conv_state(0, state_idx=0), cache.get_recurrent_state(0, state_idx=0))
    if any(str(t.dtype) != "torch.float64" for t in states):
        raise TypeError(f"lifted module gave {[t.dtype for t in states]} (output, conv, recurrent): not all float64")


def run_ours(layer, x, attention_mask, d_out) -> dict:
    """Our layer's forward with a fresh state and backward of d_out -> the values of ``layer_rows``."""
    (y, state), cache = layer.forward(x, attention_mask)
    g = layer.backward(d_out, cache)
    ours = {"output": y, "dx": g["x"], "conv_state": state.conv, "recurrent_state": state.recurrent}
    return {**ours, **{f"grad {name}": g[name] for name in layer.PARAM_NAMES}}


def layer_rows(kind: LayerKind) -> tuple[Row, ...]:
    """The rows of a layer's check: output, the state after the call, dL/dx, every parameter's gradient."""
    return (
        Row("output", "module(x)", "output"),
        Row("state: conv", "cache conv state [:, :, 1:]", "conv_state"),
        Row("state: recurrent", "cache recurrent state", "recurrent_state"),
        Row("dL/dx", "autograd", "dx"),
        *(Row(f"dL/d{n}", f"{t}.grad", f"grad {n}") for n, t in kind.name_map.items()),
    )


def shipped_note(ours, shipped) -> str:
    """How far the module as shipped (float32 inside) is from ours, for a float64 check's notes."""
    worst = max(relative(ours[k], shipped[k]) for k in shipped if k.startswith("grad "))
    return (f"as shipped (float32 casts inside): output {relative(ours['output'], shipped['output']):.1e}, "
            f"state {relative(ours['recurrent_state'], shipped['recurrent_state']):.1e}, "
            f"gradients up to {worst:.1e} from ours")  # fmt: skip


def layer_sides(kind: LayerKind, module, layer, hidden_states, attention_mask, d_output, rng, rtol) -> tuple:
    """Our ``layer`` (imported from ``module``) and the module on the same input -> ``harness.compare``'s arguments
    after the title: (dtype, rtol, rows, ours, theirs, notes). float64 against the module with its casts lifted
    (the as-shipped gap in a note), float32 against the module as shipped."""
    x = np.asarray(hidden_states)
    d_out = random_like(x.shape, x.dtype, rng) if d_output is None else np.asarray(d_output, dtype=x.dtype)
    ours, lifted, shapes = run_ours(layer, x, attention_mask, d_out), x.dtype == np.float64, layer.param_shapes()
    theirs = run_hf(kind, module, shapes, x, attention_mask, d_out, lifted)
    notes = [shipped_note(ours, run_hf(kind, module, shapes, x, attention_mask, d_out, False))] if lifted else []
    return x.dtype, rtol_for(x.dtype, rtol), layer_rows(kind), ours, theirs, notes


def decode_hf(kind: LayerKind, module, hidden_states, prefill: int = 3, lifted: bool = True):
    """transformers' decoding: a prefill of ``prefill`` tokens with a fresh cache, then one token a call ->
    (outputs (B, L, E), the state after the last call in our layout, a ``kind.state``)."""
    torch = require("torch")
    x = np.asarray(hidden_states)
    if not 1 <= prefill <= x.shape[1]:
        raise ValueError(f"prefill must lie in [1, L={x.shape[1]}], got {prefill}")
    cache, outs = hf_cache(kind), []
    with torch.no_grad(), float32_is_float64(torch) if lifted else nullcontext():
        for a, b in [(0, prefill)] + [(t, t + 1) for t in range(prefill, x.shape[1])]:
            out = module(tensor(torch, x[:, a:b]), cache=cache)
            if lifted:
                in_float64(out, cache)
            outs.append(out.numpy())
    return np.concatenate(outs, axis=1), _state(kind, cache)
