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

Mamba-2's ``MambaRMSNormGated`` gates first and normalises over groups (``grouped_gated_rms_norm_forward``):

    u = x · silu(z)                     G1   the gate before the norm
    û = u / sqrt(mean_group(u²) + eps)  G2   the mean over each of the d / group_size groups of features
    out = û · w                         G3   w: (d,), one weight a feature

(``Mamba2Mixer``: d = the intermediate size, one group per n_groups, float32 inside; ours in the input's dtype.)
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .._checks import as_float_array, as_int
from ..models.layers import silu_backward, silu_forward
from .gates import sigmoid_backward, sigmoid_forward

GATE_ACTIVATIONS = {"silu": (silu_forward, silu_backward), "sigmoid": (sigmoid_forward, sigmoid_backward)}


def check_gated_norm(x, z, weight, eps):
    """x, z (…, d) of one shape, weight (d,), one dtype, eps > 0; or ValueError naming the argument."""
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
    return x, z, weight


def gated_rms_norm_forward(x, z, weight, eps: float = 1e-6, activation: str = "silu"):
    """RMSNorm(x) · weight · act(z) (module docstring).

    x: (…, d)   z: (…, d) (x's shape)   weight: (d,)   eps > 0   activation "silu" | "sigmoid"
    ->   (out (…, d), cache)
    """
    x, z, weight = check_gated_norm(x, z, weight, eps)
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


def grouped_gated_rms_norm_forward(x, z, weight, group_size: int, eps: float = 1e-6):
    """RMSNorm(x · silu(z)) · weight over groups of ``group_size`` features (Mamba-2's order; module docstring).

    x: (…, d)   z: (…, d)   weight: (d,)   group_size dividing d   eps > 0   ->   (out (…, d), cache)
    """
    x, z, weight = check_gated_norm(x, z, weight, eps)
    d = x.shape[-1]
    group_size = as_int(group_size, "group_size", minimum=1)
    if d % group_size:
        raise ValueError(f"group_size {group_size} must divide x's last dimension {d} (x with shape {x.shape})")
    ones = np.ones(group_size, dtype=x.dtype)  # RMSNorm's own weight: w is applied per feature in G3
    a, c_a = silu_forward(z)  # G1: (…, d)
    u = x * a  # G1
    grouped = u.reshape(*x.shape[:-1], d // group_size, group_size)  # G2: (…, d/g, g)
    u_hat, c_n = F.rms_norm_forward(grouped, ones, eps, check=False)  # G2: (…, d/g, g) unit rms within each group
    u_hat = u_hat.reshape(x.shape)  # G2: (…, d)
    return u_hat * weight, (x, a, c_a, c_n, u_hat, weight)  # G3: (…, d)


def grouped_gated_rms_norm_backward(d_out, cache):
    """d_out: (…, d) -> dx (…, d), dz (…, d), dweight (d,)."""
    x, a, c_a, c_n, u_hat, weight = cache
    d_out = as_float_array(d_out, "d_out")
    if d_out.shape != x.shape:
        raise ValueError(f"d_out with shape {d_out.shape} must be the output's shape {x.shape}")
    dweight = (d_out * u_hat).sum(axis=tuple(range(d_out.ndim - 1)))  # ← G3: (d,)
    d_hat = (d_out * weight).reshape(c_n[0].shape)  # ← G3, G2: (…, d/g, g)
    du = F.rms_norm_backward(d_hat, c_n)[0].reshape(x.shape)  # ← G2: (…, d)
    return du * a, silu_backward(du * x, c_a), dweight  # ← G1: each factor gets the other one times du
