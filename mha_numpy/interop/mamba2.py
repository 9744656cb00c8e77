"""Mamba-2 against transformers' ``Mamba2Mixer``: its SSD functions and forward run in float64, the importer, the
checks (``delta_layers``).

transformers (``transformers.models.mamba2.modeling_mamba2``) computes the scan in float32 whatever the module's
dtype: ``mamba2_chunk_scan`` casts x, B, C, dt (``.float()``), ``mamba2_selective_state_update`` (one token of
decoding) the decay ``exp(dt.float() * A.float())``, ``Mamba2Mixer.forward`` takes ``A = −exp(A_log.float())``, and
``MambaRMSNormGated`` normalises in float32 (``.to(torch.float32)``). The ``*_float64`` names and
``mamba2_in_float64`` run that code itself, unedited, with float32 meaning float64 for the call
(``lift.float32_is_float64``, as ``interop.gated_delta`` and ``interop.qwen3_next_deltanet`` do), their results
checked to be float64; the float32 check is against the module as shipped.

Noticed (transformers 5.24): the one-token path (``mamba2_selective_state_update``) does not clamp the time step to
``time_step_limit``, the chunked path does; with a limit that binds, its decoding differs from its own full forward
(measured: 1.6 at the tokens after the prefill). Ours clamps in both (``recurrent.gates.time_step_forward``); the
default limit (0, inf) never binds, and the decoding cross-check uses it.

Layouts: theirs (B, L, H, P), B and C (B, L, G, N), the state (B, H, P, N); ours (B, H, L, P), (B, G, L, N),
(B, H, N, P) (``recurrent.ssd``). The parameters (``recurrent.mamba2``):

============  ================  ==================================================================
ours          Mamba2Mixer       shape
============  ================  ==================================================================
W_in          in_proj.weight    (I + C + H, E): [z (I) | x B C (C = I + 2·G·N) | dt (H)]
conv_weight   conv1d.weight     ours (C, K), theirs (C, 1, K)
conv_bias     conv1d.bias       (C,)
dt_bias       dt_bias           (H,)
A_log         A_log             (H,)
D             D                 (H,)
norm_weight   norm.weight       (I,)
W_out         out_proj.weight   (E, I)
============  ================  ==================================================================

torch and transformers are imported lazily, inside the functions.
"""

from __future__ import annotations

import numpy as np

from ..recurrent.mamba2 import Mamba2Mixer, Mamba2State
from ._lazy import require, to_numpy
from .delta_layers import LayerKind, decode_hf, layer_sides, params_as_ours
from .harness import compare
from .lift import call_in_float64, float32_is_float64
from .report import CrosscheckReport

HF_MAMBA2_NAME_MAP = {
    "W_in": "in_proj.weight",
    "conv_weight": "conv1d.weight",
    "conv_bias": "conv1d.bias",
    "dt_bias": "dt_bias",
    "A_log": "A_log",
    "D": "D",
    "norm_weight": "norm.weight",
    "W_out": "out_proj.weight",
}
"""Our Mamba2Mixer's parameters -> transformers' (conv1d.weight (C, 1, K) is ours (C, K))."""


# --------------------------------------------------------------------------- the SSD functions, casts lifted


def in_float64(name: str, *args, **kwargs):
    """transformers' function ``name`` of ``modeling_mamba2`` called with float32 meaning float64 -> its result,
    every tensor of it float64 (``lift.call_in_float64``: TypeError for a cast the lift did not reach, ValueError
    for a tensor argument that is not float64)."""
    torch = require("torch")
    require("transformers")
    from transformers.models.mamba2 import modeling_mamba2

    return call_in_float64(torch, getattr(modeling_mamba2, name), *args, **kwargs)


def mamba2_chunk_scan_float64(*args, **kwargs):
    """transformers' ``mamba2_chunk_scan`` in float64 (its casts lifted; its arguments and layout, module docstring)."""
    return in_float64("mamba2_chunk_scan", *args, **kwargs)


def mamba2_selective_state_update_float64(*args, **kwargs):
    """transformers' ``mamba2_selective_state_update`` (one token, the state updated in place) in float64 (its casts
    lifted)."""
    return in_float64("mamba2_selective_state_update", *args, **kwargs)


def torch_ssd(x, dt, A, B, C, D=None, initial_state=None, chunk_size=64, d_y=None, d_final_state=None,
              shipped=False) -> dict:  # fmt: skip
    """transformers' chunked scan on our arrays (ours' layout in and out; dt given is the time step itself: no
    softplus, no bias) with torch autograd of Σ d_y·y + d_final_state·S -> {"y", "final_state", and d_y given:
    "x", "dt", "A", "B", "C", "D", "initial_state"}. ``shipped``: the function as shipped (float32 inside)."""
    torch = require("torch")
    from transformers.models.mamba2 import modeling_mamba2 as M

    scan = M.mamba2_chunk_scan if shipped else mamba2_chunk_scan_float64  # lifted: float64 tensors in
    named = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "initial_state": initial_state}
    t = {n: torch.tensor(np.asarray(a), requires_grad=True) for n, a in named.items() if a is not None}
    S0 = None if initial_state is None else t["initial_state"].transpose(-1, -2)  # ours (N, P) -> theirs (P, N)
    y, S = scan(t["x"].transpose(1, 2), t["dt"].transpose(1, 2), t["A"], t["B"].transpose(1, 2),
                t["C"].transpose(1, 2), chunk_size, D=t.get("D"), initial_states=S0,
                return_final_states=True)  # fmt: skip
    y, S = y.transpose(1, 2), S.transpose(-1, -2)  # (B, H, L, P), (B, H, N, P)
    out = {"y": to_numpy(y), "final_state": to_numpy(S)}
    if d_y is not None:
        loss = (y * torch.tensor(d_y)).sum()
        if d_final_state is not None:
            loss = loss + (S * torch.tensor(d_final_state)).sum()
        grads = torch.autograd.grad(loss, list(t.values()), allow_unused=True)
        out.update({n: None if g is None else to_numpy(g) for n, g in zip(t, grads, strict=True)})
    return out


# --------------------------------------------------------------------------- the layer


def hf_mamba2_mixer(
    hidden_size: int = 8,
    num_heads: int = 4,
    head_dim: int = 4,
    state_size: int = 5,
    n_groups: int = 2,
    conv_kernel: int = 3,
    chunk_size: int = 4,
    time_step_limit=(0.0, float("inf")),
    layer_norm_epsilon: float = 1e-6,
    dtype=np.float64,
    seed: int = 0,
):
    """A small random transformers ``Mamba2Mixer`` (layer 0 of a tiny ``Mamba2Config``, expand = H·P / E), in eval
    mode (in training mode without a cache the module asks for the fused kernel first).

    Weights N(0, 0.3²), the conv's N(0, 0.5²), the norm's N(1, 0.3²) and D N(1, 0.3²) (all ones would hide a swapped
    weight), dt_bias N(0, 0.5²), A_log N(0, 0.5²): the decays e^{A·Δ} spread over (0, 1).
    """
    torch = require("torch")
    require("transformers")
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer as HFMamba2Mixer

    expand = num_heads * head_dim // hidden_size
    if expand * hidden_size != num_heads * head_dim:
        raise ValueError(f"num_heads · head_dim = {num_heads * head_dim} must be a multiple of hidden_size = "
                         f"{hidden_size} (Mamba2Config's expand)")  # fmt: skip
    cfg = Mamba2Config(
        hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim, state_size=state_size, n_groups=n_groups,
        expand=expand, conv_kernel=conv_kernel, chunk_size=chunk_size, time_step_limit=tuple(time_step_limit),
        layer_norm_epsilon=layer_norm_epsilon, num_hidden_layers=1, vocab_size=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    module = HFMamba2Mixer(cfg, layer_idx=0).to(getattr(torch, np.dtype(dtype).name)).eval()
    std = {"conv1d.weight": 0.5, "conv1d.bias": 0.5, "dt_bias": 0.5, "A_log": 0.5}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(1.0 if name in ("norm.weight", "D") else 0.0, std.get(name, 0.3))
    return module


def from_hf_mamba2_mixer(module, chunk_size: int | None = None, impl: str = "chunked") -> Mamba2Mixer:
    """transformers ``Mamba2Mixer`` -> our ``Mamba2Mixer``, same weights (copied), same dtype; the chunk size the
    module's unless given."""
    if module.activation != "silu":
        raise ValueError(f"the module's activation is {module.activation!r}; Mamba2Mixer's conv uses silu")
    if module.use_bias or module.conv1d.bias is None:
        raise ValueError("the module's in_proj/out_proj have biases or its conv1d has none; ours: Mamba-2's default "
                         "(use_bias=False, use_conv_bias=True)")  # fmt: skip
    sizes = (module.hidden_size, module.num_heads, module.head_dim, module.ssm_state_size, module.n_groups,
             module.conv_kernel_size, module.layer_norm_epsilon)  # fmt: skip
    options = dict(time_step_limit=tuple(module.time_step_limit), impl=impl,
                   chunk_size=module.chunk_size if chunk_size is None else chunk_size)  # fmt: skip
    shapes = Mamba2Mixer(*sizes, rng=0, **options).param_shapes()
    params = params_as_ours(dict(module.named_parameters()), HF_MAMBA2_NAME_MAP, shapes)
    return Mamba2Mixer(*sizes, params=params, dtype=params["W_out"].dtype, **options)


def mamba2_in_float64(module):
    """Within the block the module computes in float64 where it says float32 (``lift.float32_is_float64``; the
    module is not edited): transformers' own forward, chunked scan, one-token update and gated RMSNorm, unedited."""
    return float32_is_float64(require("torch"))


def _config():
    from transformers import Mamba2Config

    return Mamba2Config(num_hidden_layers=1)


KIND = LayerKind("Mamba2Mixer", HF_MAMBA2_NAME_MAP, _config, Mamba2State, lambda s: s.transpose(0, 1, 3, 2))


def crosscheck_hf_mamba2_mixer(
    module, hidden_states, attention_mask=None, d_output=None, rng=0, rtol=None, impl: str = "chunked",
    chunk_size: int | None = None,
) -> CrosscheckReport:  # fmt: skip
    """A transformers ``Mamba2Mixer`` against ``from_hf_mamba2_mixer(module)``: output, the state after the call
    (conv and SSM), dL/dx and every parameter's gradient by torch autograd.

    hidden_states (B, L, E); attention_mask (B, L) bool (True = a token) or None. float64: against the module with
    its casts lifted (``mamba2_in_float64``), default 1e-10, the as-shipped gap in a note; float32: against the
    module as shipped, default 1e-5.
    """
    layer = from_hf_mamba2_mixer(module, chunk_size=chunk_size, impl=impl)
    title = (f"ours vs transformers Mamba2Mixer (H={layer.num_heads}, P={layer.head_dim}, N={layer.state_size}, "
             f"G={layer.n_groups}, K={layer.conv_kernel_size}, {impl}"
             f"{', padding' if attention_mask is not None else ''})")  # fmt: skip
    return compare(title, *layer_sides(KIND, module, layer, hidden_states, attention_mask, d_output, rng, rtol))


def decode_hf_mamba2_mixer(module, hidden_states, prefill: int = 3, lifted: bool = True):
    """transformers' decoding with its cache (a prefill, then one token a call) -> (outputs, Mamba2State)."""
    return decode_hf(KIND, module, hidden_states, prefill, lifted)
