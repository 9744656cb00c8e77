"""The gated RMSNorm at the output of the delta rule's layers: out = RMSNorm(x) · w · act(z), per value head.

    x̂ = x / sqrt(mean(x²) + eps)       F1   (RMSNorm without its weight: ``functional.rms_norm_forward``)
    n = x̂ · w                          F1
    a = act(z)                          F2   silu (Qwen3-Next's ``Qwen3NextRMSNormGated``)
                                             or sigmoid (Kimi's ``KimiLinearRMSNormGated``)
    out = n · a                         F3

x, z: (…, d), the core's output and the gate of each value head; w: (d,), shared by the heads. The norm comes
before the gate ("norm before gate" in transformers).

Casts in transformers: ``Qwen3NextRMSNormGated`` computes x̂ in float32, casts it back to the input's dtype, then
w · x̂ in that dtype and silu(z) in float32 (so a float64 layer rounds x̂ and silu(z) to float32);
``KimiLinearRMSNormGated`` keeps everything in float32 and casts the product back. Ours computes in the input's
dtype throughout (the float64 cross-check lifts their casts: ``interop/qwen3_next_deltanet.py``).
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .._checks import as_float_array
from ..models.layers import silu_backward, silu_forward
from .gates import sigmoid_backward, sigmoid_forward

GATE_ACTIVATIONS = {"silu": (silu_forward, silu_backward), "sigmoid": (sigmoid_forward, sigmoid_backward)}


def gated_rms_norm_forward(x, z, weight, eps: float = 1e-6, activation: str = "silu"):
    """RMSNorm(x) · weight · act(z) (module docstring).

    x: (…, d)   z: (…, d) (x's shape)   weight: (d,)   eps > 0   activation "silu" | "sigmoid"
    ->   (out (…, d), cache)
    """
    x = as_float_array(x, "x")
    z = as_float_array(z, "z")
    weight = as_float_array(weight, "weight", ndim=1)
    if x.ndim < 1 or z.shape != x.shape:
        raise ValueError(f"z with shape {z.shape} must have x's shape {x.shape}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight with shape {weight.shape} must be (d,) = ({x.shape[-1]},) for x with shape {x.shape}")
    if not x.dtype == z.dtype == weight.dtype:
        raise ValueError(f"x, z, weight must share one dtype: got {x.dtype}, {z.dtype}, {weight.dtype}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(GATE_ACTIVATIONS)}, got {activation!r}")
    act_forward, _ = GATE_ACTIVATIONS[activation]
    n, c_n = F.rms_norm_forward(x, weight, eps, check=False)  # F1: (…, d) x̂ · w
    a, c_a = act_forward(z)  # F2: (…, d)
    return n * a, (n, c_n, a, c_a, activation)  # F3: (…, d)


def gated_rms_norm_backward(d_out, cache):
    """d_out: (…, d) -> dx (…, d), dz (…, d), dweight (d,)."""
    n, c_n, a, c_a, activation = cache
    d_out = as_float_array(d_out, "d_out")
    if d_out.shape != n.shape:
        raise ValueError(f"d_out with shape {d_out.shape} must be the output's shape {n.shape}")
    _, act_backward = GATE_ACTIVATIONS[activation]
    d_n, d_a = d_out * a, d_out * n  # ← F3: each factor gets the other one times d_out
    dz = act_backward(d_a, c_a)  # ← F2
    dx, dweight = F.rms_norm_backward(d_n, c_n)  # ← F1
    return dx, dz, dweight
