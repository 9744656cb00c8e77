"""Mamba-2's layer (transformers' ``Mamba2Mixer``) with a hand-written backward, and its decoding state.

    zxbcdt = x W_inᵀ                                    F1   in_proj (no bias, Mamba-2's default)
    z, xBC, dt = split(zxbcdt)                          F2   [z (I) | x B C (I + 2·G·N) | dt (H)]
    xBC = silu(causal_conv(xBC) + conv_bias)            F3   one depthwise conv over the I + 2·G·N channels
    x, B, C = split(xBC)                                F4   x (B, H, L, P), B, C (B, G, L, N)
    Δ = clamp(softplus(dt + dt_bias), time_step_limit)  F5   ``gates.time_step_forward``
    A = −exp(A_log)                                     F6   (H,), < 0
    y, S = ssd(x, Δ, A, B, C, D, S₀)                    F7   ``ssd`` (the chunked scan), D the skip
    n = RMSNorm(y · silu(z)) · w                        F8   over n_groups groups: ``norms.grouped_gated_rms_norm``
    out = n W_outᵀ                                      F9   out_proj

I = H·P (Mamba2Config's expand · hidden_size), G = n_groups (head h reads B, C of group h // (H / G)), N the state
size. A padding token (attention_mask False) has its input zeroed before F1 and its conv output zeroed after F3,
as transformers' ``apply_mask_to_padding_states``: it writes nothing (x = B = 0) but its time step still decays the
state (dt_bias alone). The state after a call (``Mamba2State``): the conv's last K−1 inputs and S.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import as_int, as_number, check_like
from .conv import causal_conv1d_backward, causal_conv1d_forward
from .gates import check_time_step_limit, time_step_backward, time_step_forward
from .layer import RecurrentLayer
from .norms import grouped_gated_rms_norm_backward, grouped_gated_rms_norm_forward
from .ssd import IMPLS, ssd_backward, ssd_forward


@dataclass(frozen=True)
class Mamba2State:
    """A Mamba-2 layer's decoding state, all it keeps of the tokens before: the conv's last K-1 inputs and the SSM
    state. Zeros are the start of a sequence; ``forward`` returns the state after the call (a new object)."""

    conv: np.ndarray  # (B, K-1, C): the last K-1 inputs of the conv (x B C before it), C = I + 2·G·N
    recurrent: np.ndarray  # (B, H, N, P): S of each head (transformers keeps its transpose, (B, H, P, N))


@dataclass
class Mamba2Cache:
    """Intermediates of ``Mamba2Mixer.forward`` for its backward, one a forward line (F0 … F9)."""

    mask: np.ndarray | None  # F0, F3: (B, L, 1) or None
    c_in: tuple  # F1
    c_conv: tuple  # F3
    c_dt: tuple  # F5
    A: np.ndarray  # F6
    c_ssd: tuple  # F7
    c_norm: tuple  # F8
    c_out: tuple  # F9
    has_state: bool


class Mamba2Mixer(RecurrentLayer):
    """Mamba-2's layer (module docstring), forward and backward; decoding is ``forward`` with the state.

    hidden_size E; num_heads H, head_dim P (I = H·P), state_size N, n_groups G (dividing H); conv_kernel_size K;
    eps of the gated RMSNorm; time_step_limit (lo, hi) of the time step; chunk_size and impl ("chunked" |
    "quadratic") of the SSD. ``params``: a dict of the eight arrays below (copied, in ``dtype``), or None for a random
    start from ``rng``:

    ============  ================  ================================================
    name          shape             transformers (``interop.mamba2``)
    ============  ================  ================================================
    W_in          (I + C + H, E)    in_proj.weight, C = I + 2·G·N
    conv_weight   (C, K)            conv1d.weight (C, 1, K)
    conv_bias     (C,)              conv1d.bias
    dt_bias       (H,)              dt_bias
    A_log         (H,)              A_log
    D             (H,)              D
    norm_weight   (I,)              norm.weight
    W_out         (E, I)            out_proj.weight
    ============  ================  ================================================
    """

    PARAM_NAMES = ("W_in", "conv_weight", "conv_bias", "dt_bias", "A_log", "D", "norm_weight", "W_out")
    STATE = Mamba2State

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        state_size: int,
        n_groups: int = 1,
        conv_kernel_size: int = 4,
        eps: float = 1e-6,
        *,
        time_step_limit=(0.0, float("inf")),
        params: dict | None = None,
        rng=0,
        dtype=np.float64,
        chunk_size: int = 64,
        impl: str = "chunked",
    ) -> None:
        self.hidden_size = as_int(hidden_size, "hidden_size", minimum=1)
        self.num_heads = as_int(num_heads, "num_heads", minimum=1)
        self.head_v_dim = self.head_dim = as_int(head_dim, "head_dim", minimum=1)
        self.head_k_dim = self.state_size = as_int(state_size, "state_size", minimum=1)
        self.n_groups = as_int(n_groups, "n_groups", minimum=1)
        if self.num_heads % self.n_groups:
            raise ValueError(f"n_groups = {self.n_groups} must divide num_heads = {self.num_heads}")
        self.conv_kernel_size = as_int(conv_kernel_size, "conv_kernel_size", minimum=1)
        self.eps = as_number(eps, "eps", positive=True)
        self.time_step_limit = check_time_step_limit(time_step_limit)
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.impl, self.chunk_size = impl, as_int(chunk_size, "chunk_size", minimum=1)
        self._set_params(params, rng, dtype)

    def __repr__(self) -> str:
        return (
            f"Mamba2Mixer(E={self.hidden_size}, H={self.num_heads}, P={self.head_dim}, N={self.state_size}, "
            f"G={self.n_groups}, K={self.conv_kernel_size}, {self.impl})"
        )

    @property
    def intermediate_size(self) -> int:
        """I = H·P, the width of x, z and the norm."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """C = I + 2·G·N: the channels of the conv, [x | B | C]."""
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def state_heads(self) -> int:
        """H: the SSM state is one (N, P) matrix a head."""
        return self.num_heads

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each parameter's shape, by name (the class docstring's table)."""
        E, H, I, C = self.hidden_size, self.num_heads, self.intermediate_size, self.conv_dim
        return {
            "W_in": (I + C + H, E),
            "conv_weight": (C, self.conv_kernel_size),
            "conv_bias": (C,),
            "dt_bias": (H,),
            "A_log": (H,),
            "D": (H,),
            "norm_weight": (I,),
            "W_out": (E, I),
        }

    def forward(self, x, attention_mask=None, state: Mamba2State | None = None):
        """x (B, L, E), attention_mask (B, L) bool or None (False: a padding token, module docstring), state: the
        previous call's or None (zeros) ->   ((out (B, L, E), the state after the call), cache). Nothing passed in
        is modified."""
        x, attention_mask = self._check(x, attention_mask, state)
        p, B, L = self.params, x.shape[0], x.shape[1]
        H, P, N, G, I = self.num_heads, self.head_dim, self.state_size, self.n_groups, self.intermediate_size
        mask = None if attention_mask is None else attention_mask[..., None]  # (B, L, 1)
        if mask is not None:
            x = x * mask  # F0: (B, L, E) padding tokens' inputs zeroed
        zxbcdt, c_in = F.linear_forward(x, p["W_in"], check=False)  # F1: (B, L, E) @ (E, I + C + H)
        z, xBC, dt = zxbcdt[..., :I], zxbcdt[..., I : I + self.conv_dim], zxbcdt[..., I + self.conv_dim :]  # F2
        conv0 = None if state is None else state.conv
        (xBC, conv_state), c_conv = causal_conv1d_forward(xBC, p["conv_weight"], p["conv_bias"], conv0)  # F3
        if mask is not None:
            xBC = xBC * mask  # F3: (B, L, C) padding tokens' conv outputs zeroed
        xs = xBC[..., :I].reshape(B, L, H, P).transpose(0, 2, 1, 3)  # F4: (B, L, I) -> (B, H, L, P)
        Bm = xBC[..., I : I + G * N].reshape(B, L, G, N).transpose(0, 2, 1, 3)  # F4: (B, G, L, N)
        Cm = xBC[..., I + G * N :].reshape(B, L, G, N).transpose(0, 2, 1, 3)  # F4: (B, G, L, N)
        delta, c_dt = time_step_forward(dt, p["dt_bias"], self.time_step_limit)  # F5: (B, L, H)
        A = -np.exp(p["A_log"])  # F6: (H,)
        (y, S), c_ssd = ssd_forward(
            xs, delta.transpose(0, 2, 1), A, Bm, Cm, p["D"], None if state is None else state.recurrent,
            chunk_size=self.chunk_size, impl=self.impl,
        )  # F7: Δ (B, H, L); y (B, H, L, P), S (B, H, N, P)  # fmt: skip
        y = y.transpose(0, 2, 1, 3).reshape(B, L, I)  # F7: (B, L, H, P) -> (B, L, I)
        n, c_norm = grouped_gated_rms_norm_forward(y, z, p["norm_weight"], I // G, self.eps)  # F8: (B, L, I)
        out, c_out = F.linear_forward(n, p["W_out"], check=False)  # F9: (B, L, I) @ (I, E) -> (B, L, E)
        cache = Mamba2Cache(mask, c_in, c_conv, c_dt, A, c_ssd, c_norm, c_out, state is not None)
        return (out, Mamba2State(conv_state, S)), cache

    def backward(self, d_out, cache: Mamba2Cache, d_state: Mamba2State | None = None) -> dict:
        """d_out (B, L, E), d_state: the gradient of the returned state (or None) -> {"x" (B, L, E), one entry a
        parameter, "state": a Mamba2State of the initial state's gradients (None when none was given)}."""
        c, H, P, N, G, I = cache, self.num_heads, self.head_dim, self.state_size, self.n_groups, self.intermediate_size
        d_out = check_like(d_out, "d_out", c.c_out[3][:-1] + (self.hidden_size,), self.dtype, "out")
        B, L, _ = d_out.shape
        self._check_d_state(d_state)
        dn, dW_out, _ = F.linear_backward(d_out, c.c_out)  # ← F9: (B, L, E) @ (E, I) -> (B, L, I)
        dy, dz, d_norm = grouped_gated_rms_norm_backward(dn, c.c_norm)  # ← F8: (B, L, I)
        dy = dy.reshape(B, L, H, P).transpose(0, 2, 1, 3)  # ← F7: (B, H, L, P)
        g = ssd_backward(dy, c.c_ssd, None if d_state is None else d_state.recurrent)  # ← F7
        dA_log = g["A"] * c.A  # ← F6: d(−exp(A_log)) = −exp(A_log) = A
        d_dt, d_dt_bias = time_step_backward(g["dt"].transpose(0, 2, 1), c.c_dt)  # ← F5: (B, L, H)
        d_xBC = np.concatenate(  # ← F4: (B, L, C) [x | B | C]
            [g["x"].transpose(0, 2, 1, 3).reshape(B, L, I)]
            + [g[n].transpose(0, 2, 1, 3).reshape(B, L, G * N) for n in ("B", "C")],
            axis=-1,
        )
        if c.mask is not None:
            d_xBC = d_xBC * c.mask  # ← F3: the mask after the conv
        cv = causal_conv1d_backward(d_xBC, c.c_conv, None if d_state is None else d_state.conv)  # ← F3
        d_zxbcdt = np.concatenate([dz, cv["x"], d_dt], axis=-1)  # ← F2: (B, L, I + C + H)
        dx, dW_in, _ = F.linear_backward(d_zxbcdt, c.c_in)  # ← F1: (B, L, I + C + H) @ (I + C + H, E)
        if c.mask is not None:
            dx = dx * c.mask  # ← F0
        d_initial = Mamba2State(cv["initial_state"], g["initial_state"]) if c.has_state else None
        grads = [dW_in, cv["weight"], cv["bias"], d_dt_bias, dA_log, g["D"], d_norm, dW_out]  # PARAM_NAMES' order
        return {"x": dx, **dict(zip(self.PARAM_NAMES, grads, strict=True)), "state": d_initial}
