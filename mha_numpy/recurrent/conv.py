"""The short causal depthwise convolution in front of the delta rule (Qwen3-Next's ``Qwen3NextGatedDeltaNet``, Kimi
Linear's ``KimiLinearDeltaAttention``), with its backward and its decoding state.

Each channel c of x (B, L, C) is filtered by its own K taps w[c] (``nn.Conv1d(C, C, K, groups=C, padding=K-1)``
keeping the first L outputs: causal), then SiLU:

    x̃ = [s ; x]                                   (B, K-1+L, C): the K-1 inputs before the sequence, then x
    y[t, c] = silu( Σ_{j<K} w[c, j] · x̃[t+j, c] + b[c] )      tap K-1 reads x[t] itself, tap 0 reads x[t-K+1]

s is zeros at the start of a sequence (the padding of nn.Conv1d). The state after the call is the last K-1 rows of
x̃, the inputs the next token's taps still reach: running a sequence in pieces, each piece given the previous
piece's final state, gives the outputs of one call (decoding one token at a time is L = 1).

The backward is the convolution turned around: each tap's gradient is the correlation of dy with the input it
read, and each input's gradient gathers dy from the K outputs that read it. The final state is a slice of x̃, so
its gradient (from the next piece) adds into x̃'s last K-1 rows; the first K-1 rows' gradient is the initial state's.

transformers (``causal_conv1d_fn``, ``causal_conv1d_update``): x as (B, C, L), weight (C, 1, K) (ours (C, K)),
and its cache holds the last K inputs, one more than the taps reach (the oldest is never read). Derivation:
docs/deltanet_layer.md.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array
from ..models.layers import silu_backward, silu_forward

ACTIVATIONS = ("silu", None)


def check_conv(x, weight, bias, initial_state, activation):
    """x (B, L, C), weight (C, K), bias (C,) or None, initial_state (B, K-1, C) or None, all of x's dtype."""
    x = as_float_array(x, "x", ndim=3)
    weight = as_float_array(weight, "weight", ndim=2)
    B, _, C = x.shape
    if weight.shape[0] != C or weight.shape[1] < 1:
        raise ValueError(f"weight with shape {weight.shape} must be (C, K) = ({C}, K >= 1) for x with shape {x.shape}")
    K = weight.shape[1]
    named = {"weight": weight}
    if bias is not None:
        bias = named["bias"] = as_float_array(bias, "bias", ndim=1)
        if bias.shape != (C,):
            raise ValueError(f"bias with shape {bias.shape} must be (C,) = ({C},) for x with shape {x.shape}")
    if initial_state is not None:
        initial_state = named["initial_state"] = as_float_array(initial_state, "initial_state", ndim=3)
        if initial_state.shape != (B, K - 1, C):
            raise ValueError(f"initial_state with shape {initial_state.shape} must be (B, K-1, C) = "
                             f"({B}, {K - 1}, {C}): the last K-1 inputs before x")  # fmt: skip
    for name, arr in named.items():
        if arr.dtype != x.dtype:
            raise ValueError(f"{name} has dtype {arr.dtype}, x has {x.dtype}: one dtype for the call")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return x, weight, bias, initial_state


def causal_conv1d_forward(x, weight, bias=None, initial_state=None, activation="silu"):
    """The causal depthwise convolution of each channel of x by its K taps, then SiLU (module docstring).

    x: (B, L, C)   weight: (C, K)   bias: (C,) or None   initial_state: (B, K-1, C) or None (zeros)
    ->   ((y (B, L, C), final_state (B, K-1, C)), cache). activation "silu" or None. Inputs are not modified.
    """
    x, weight, bias, initial_state = check_conv(x, weight, bias, initial_state, activation)
    B, L, C = x.shape
    K = weight.shape[1]
    s = np.zeros((B, K - 1, C), x.dtype) if initial_state is None else initial_state
    xs = np.concatenate([s, x], axis=1)  # F1: (B, K-1+L, C) x̃, a fresh array
    u = np.zeros((B, L, C), x.dtype)
    for j in range(K):
        u += weight[:, j] * xs[:, j : j + L]  # F2: (B, L, C) tap j reads x̃[t+j]
    if bias is not None:
        u += bias  # F3: (B, L, C) + (C,)
    y, c_act = silu_forward(u) if activation == "silu" else (u, None)  # F4: (B, L, C)
    final_state = xs[:, L:].copy()  # F5: (B, K-1, C) the last K-1 rows of x̃
    return (y, final_state), (xs, weight, bias is not None, initial_state is not None, c_act, L)


def causal_conv1d_backward(d_y, cache, d_final_state=None):
    """d_y: (B, L, C), d_final_state: (B, K-1, C) or None  ->  {"x", "weight", "bias", "initial_state"}
    (bias and initial_state None when not given to the forward)."""
    xs, weight, has_bias, has_state, c_act, L = cache
    B, _, C = xs.shape
    K = weight.shape[1]
    d_y = as_float_array(d_y, "d_y", ndim=3)
    if d_y.shape != (B, L, C):
        raise ValueError(f"d_y with shape {d_y.shape} must be the output's shape {(B, L, C)}")
    du = silu_backward(d_y, c_act) if c_act is not None else d_y  # ← F4: (B, L, C)
    d_bias = du.sum(axis=(0, 1)) if has_bias else None  # ← F3: (C,)
    d_xs = np.zeros_like(xs)  # (B, K-1+L, C)
    d_weight = np.empty_like(weight)  # (C, K)
    for j in range(K):
        d_weight[:, j] = (du * xs[:, j : j + L]).sum(axis=(0, 1))  # ← F2: (C,) dy correlated with tap j's input
        d_xs[:, j : j + L] += du * weight[:, j]  # ← F2: (B, L, C) each input gathers from the outputs that read it
    if d_final_state is not None:
        d_final_state = as_float_array(d_final_state, "d_final_state", ndim=3)
        if d_final_state.shape != (B, K - 1, C):
            raise ValueError(f"d_final_state with shape {d_final_state.shape} must be the state's {(B, K - 1, C)}")
        d_xs[:, L:] += d_final_state  # ← F5
    d_initial = d_xs[:, : K - 1] if has_state else None  # ← F1: (B, K-1, C)
    return {"x": d_xs[:, K - 1 :], "weight": d_weight, "bias": d_bias, "initial_state": d_initial}  # ← F1
