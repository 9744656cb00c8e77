"""The gated delta rule against transformers: its own torch functions, run in float64 with the float32 casts lifted.

transformers computes ``torch_chunk_gated_delta_rule`` and ``torch_recurrent_gated_delta_rule`` (Qwen3-Next,
``transformers.models.qwen3_next.modeling_qwen3_next``) and ``chunk_kimi_delta_attention`` /
``recurrent_kimi_delta_attention`` (Kimi Linear, ``transformers.models.kimi_linear.modeling_kimi_linear``) in
float32 whatever the input (``.to(torch.float32)``; float64 inputs give a float32 state). The ``*_float64`` names
below call those functions themselves, unedited, with float32 meaning float64 for the call
(``lift.float32_is_float64``), so a float64 check runs in float64 end to end (outputs and state float64, else a
TypeError); the float32 check uses the functions as shipped. (They replaced line-for-line copies with the casts
removed: the lifted functions agree with those copies bit for bit.)

Their layout is (B, L, H, d) (g, beta (B, L, H); Kimi's g (B, L, H, dk)); ours is (B, H, L, d):
``torch_gated_delta_rule`` runs either on our arrays, transposing at the edge, with autograd for the gradients.
torch and transformers are imported lazily, inside the functions.
"""

from __future__ import annotations

import numpy as np

from ._lazy import require
from .lift import call_in_float64

_MODULES = {"qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
            "kimi_linear": "transformers.models.kimi_linear.modeling_kimi_linear"}  # fmt: skip


def shipped_function(model: str, name: str):
    """transformers' function ``name`` of ``modeling_<model>`` (``model``: "qwen3_next" or "kimi_linear")."""
    import importlib

    require("transformers")
    return getattr(importlib.import_module(_MODULES[model]), name)


def in_float64(model: str, name: str, *args, **kwargs):
    """transformers' function ``name`` of ``modeling_<model>`` called with float32 meaning float64 -> its result,
    every tensor of it float64 (TypeError otherwise: a cast the lift did not reach). Tensor arguments: float64
    (ValueError naming the first that is not: the lift would compute a float32 input in float64)."""
    return call_in_float64(require("torch"), shipped_function(model, name), *args, **kwargs)


def torch_chunk_gated_delta_rule_float64(*args, **kwargs):
    """transformers' ``torch_chunk_gated_delta_rule`` in float64 (its casts lifted; (B, L, H, d) as there)."""
    return in_float64("qwen3_next", "torch_chunk_gated_delta_rule", *args, **kwargs)


def torch_recurrent_gated_delta_rule_float64(*args, **kwargs):
    """transformers' ``torch_recurrent_gated_delta_rule`` in float64 (its casts lifted; (B, L, H, d) as there)."""
    return in_float64("qwen3_next", "torch_recurrent_gated_delta_rule", *args, **kwargs)


def recurrent_kimi_delta_attention_float64(*args, **kwargs):
    """transformers' ``recurrent_kimi_delta_attention`` in float64 (its casts lifted): (B, L, H, d), g (B, L, H, dk)."""
    return in_float64("kimi_linear", "recurrent_kimi_delta_attention", *args, **kwargs)


def chunk_kimi_delta_attention_float64(*args, **kwargs):
    """transformers' ``chunk_kimi_delta_attention`` in float64 (its casts lifted): (B, L, H, d), g (B, L, H, dk)."""
    return in_float64("kimi_linear", "chunk_kimi_delta_attention", *args, **kwargs)


def _theirs(impl: str, per_channel: bool, shipped: bool):
    """The function to call: transformers' own lifted to float64 or (``shipped``) as shipped."""
    model = "kimi_linear" if per_channel else "qwen3_next"
    names = {"kimi_linear": ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
             "qwen3_next": ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")}  # fmt: skip
    name = names[model][impl == "recurrent"]
    if shipped:
        return shipped_function(model, name)
    return lambda *args, **kwargs: in_float64(model, name, *args, **kwargs)


def torch_gated_delta_rule(
    q, k, v, g, beta, initial_state=None, impl="chunked", chunk_size=64, use_qk_l2norm=False, shipped=False,
    d_o=None, d_final_state=None,
):  # fmt: skip
    """transformers' gated delta rule on our (B, H, L, d) arrays -> (o, final_state, grads or None), arrays.

    q, k (B, Hk, L, dk), v (B, H, L, dv), g (B, H, L), or (B, H, L, dk) for Kimi Delta Attention (its functions,
    Hk = H), beta (B, H, L), initial_state (B, H, dk, dv) or None. ``shipped=False``: transformers' functions
    with their casts lifted (float64 in, float64 throughout); ``shipped=True``: as shipped (float32 inside).
    With ``d_o`` given, torch autograd of <d_o, o> + <d_final_state, final_state> gives
    {"q", "k", "v", "g", "beta", "initial_state"} (the last None when no initial state was given).
    """
    torch = require("torch")
    arrays = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state}
    leaves = {n: torch.from_numpy(np.ascontiguousarray(a)).requires_grad_(d_o is not None)
              for n, a in arrays.items() if a is not None}  # fmt: skip
    per_channel = np.ndim(g) == 4
    bl = {n: t.transpose(1, 2) for n, t in leaves.items() if n != "initial_state"}  # (B, H, L, ·) -> (B, L, H, ·)
    fn = _theirs(impl, per_channel, shipped)
    state = leaves.get("initial_state")
    kw = {"chunk_size": chunk_size} if impl == "chunked" else {}
    if per_channel and impl == "recurrent":  # its signature: initial_state, output_final_state positional
        o, S = fn(bl["q"], bl["k"], bl["v"], bl["g"], bl["beta"], state, True, use_qk_l2norm_in_kernel=use_qk_l2norm)
    else:
        o, S = fn(bl["q"], bl["k"], bl["v"], bl["g"], bl["beta"], initial_state=state, output_final_state=True,
                  use_qk_l2norm_in_kernel=use_qk_l2norm, **kw)  # fmt: skip
    o = o.transpose(1, 2)  # (B, L, H, dv) -> (B, H, L, dv)
    grads = None
    if d_o is not None:
        loss = (o * torch.from_numpy(np.asarray(d_o)).to(o.dtype)).sum()
        if d_final_state is not None:
            loss = loss + (S * torch.from_numpy(np.asarray(d_final_state)).to(S.dtype)).sum()
        names = list(leaves)
        got = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
        grads = {n: None for n in arrays}
        grads.update(
            {n: (t.numpy() if t is not None else np.zeros_like(arrays[n])) for n, t in zip(names, got, strict=True)}
        )
    return o.detach().numpy(), S.detach().numpy(), grads
