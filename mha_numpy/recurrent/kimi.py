"""Kimi Linear's delta attention layer (``KimiLinearDeltaAttention``, Kimi Delta Attention) with a hand-written
backward: Gated DeltaNet's layer with one decay a key channel instead of a head.

    q, k, v = x W_qᵀ, x W_kᵀ, x W_vᵀ                     F1   (B, L, H·d) each, no biases
    [q|k|v] = silu(causal_conv([q|k|v]))                 F2   one depthwise conv over the 3·H·d channels
    f = (x W_faᵀ) W_fbᵀ                                  F3   the forget gate's low-rank projection, (B, L, H, d)
    g = −exp(A_log) · softplus(f + dt_bias)              F4   ``gates.decay_forward`` per channel, A_log (H,)
    β = σ(x W_bᵀ)                                        F5   (B, L, H)
    o, S = gated_delta_rule(q, k, v, g, β, S₀)           F6   g per channel; q, k L2-normalised
    n = RMSNorm(o)·w·σ((x W_gaᵀ) W_gbᵀ)                  F7   ``norms`` with a sigmoid gate (KimiLinearRMSNormGated)
    y = n W_oᵀ                                           F8   o_proj

H heads of width d for q, k and v alike (``linear_num_heads``, ``linear_head_dim``). transformers runs the prefill
by ``chunk_kimi_delta_attention`` and one-token decoding by ``recurrent_kimi_delta_attention``, both in float32;
ours runs the core's form ``impl`` ("chunked" | "recurrent") in the input's dtype. The decoding state is the layer's
``DeltaNetState`` (``recurrent.layer``): the conv's last K-1 inputs and the (d, d) matrix of each head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import as_float_array, as_int, as_number
from .conv import causal_conv1d_backward, causal_conv1d_forward
from .gated_delta import gated_delta_rule_backward, gated_delta_rule_forward
from .gates import decay_backward, decay_forward, sigmoid_backward, sigmoid_forward
from .layer import DeltaNetState, RecurrentLayer, check_layer_options
from .norms import gated_rms_norm_backward, gated_rms_norm_forward


@dataclass
class KimiCache:
    """Intermediates of ``KimiDeltaAttention.forward`` for its backward, by forward line (F0 … F8)."""

    mask: np.ndarray | None  # F0: (B, L, 1) or None
    c_proj: list  # F1: q, k, v's linear caches
    c_conv: tuple  # F2
    c_fa: tuple  # F3
    c_fb: tuple  # F3
    c_g: tuple  # F4
    c_b: tuple  # F5
    c_beta: np.ndarray  # F5
    c_core: object  # F6
    c_ga: tuple  # F7
    c_gb: tuple  # F7
    c_norm: tuple  # F7
    c_out: tuple  # F8
    has_state: bool


class KimiDeltaAttention(RecurrentLayer):
    """Kimi Linear's ``KimiLinearDeltaAttention`` (module docstring), forward and backward.

    hidden_size E, num_heads H, head_dim d, conv_kernel_size K, eps of the gated RMSNorm; chunk_size and impl
    ("chunked" | "recurrent") of the core. ``params`` a dict of the arrays below or None (random, from ``rng``):

    ===========  ==========  ===================================================
    name         shape       transformers
    ===========  ==========  ===================================================
    W_q, W_k     (H·d, E)    q_proj.weight, k_proj.weight
    W_v          (H·d, E)    v_proj.weight
    conv_weight  (3·H·d, K)  conv1d.weight (3·H·d, 1, K)
    W_fa, W_fb   (d, E), (H·d, d)  forget_gate.f_a_proj.weight, f_b_proj.weight
    dt_bias      (H, d)      forget_gate.dt_bias (H·d,)
    A_log        (H,)        forget_gate.A_log (1, 1, H, 1)
    W_b          (H, E)      b_proj.weight
    W_ga, W_gb   (d, E), (H·d, d)  g_a_proj.weight, g_b_proj.weight
    norm_weight  (d,)        o_norm.weight
    W_o          (E, H·d)    o_proj.weight
    ===========  ==========  ===================================================
    """

    PARAM_NAMES = ("W_q", "W_k", "W_v", "conv_weight", "W_fa", "W_fb", "dt_bias", "A_log", "W_b", "W_ga", "W_gb",
                   "norm_weight", "W_o")  # fmt: skip

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        conv_kernel_size: int = 4,
        eps: float = 1e-5,
        *,
        params: dict | None = None,
        rng=0,
        dtype=np.float64,
        chunk_size: int = 64,
        impl: str = "chunked",
    ) -> None:
        self.hidden_size = as_int(hidden_size, "hidden_size", minimum=1)
        self.num_heads = as_int(num_heads, "num_heads", minimum=1)
        self.head_k_dim = self.head_v_dim = as_int(head_dim, "head_dim", minimum=1)
        self.conv_kernel_size = as_int(conv_kernel_size, "conv_kernel_size", minimum=1)
        self.eps = as_number(eps, "eps", positive=True)
        self.impl, self.chunk_size = check_layer_options(impl, chunk_size)
        self._set_params(params, rng, dtype)

    def __repr__(self) -> str:
        return (
            f"KimiDeltaAttention(E={self.hidden_size}, H={self.num_heads}, d={self.head_k_dim}, "
            f"K={self.conv_kernel_size}, {self.impl})"
        )

    @property
    def conv_dim(self) -> int:
        """C = 3·H·d: the conv's channels, [q | k | v]."""
        return 3 * self.num_heads * self.head_k_dim

    @property
    def state_heads(self) -> int:
        """H: one (d, d) state matrix a head."""
        return self.num_heads

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each parameter's shape, by name (the class docstring's table)."""
        E, H, d = self.hidden_size, self.num_heads, self.head_k_dim
        return {
            "W_q": (H * d, E), "W_k": (H * d, E), "W_v": (H * d, E), "conv_weight": (3 * H * d, self.conv_kernel_size),
            "W_fa": (d, E), "W_fb": (H * d, d), "dt_bias": (H, d), "A_log": (H,), "W_b": (H, E), "W_ga": (d, E),
            "W_gb": (H * d, d), "norm_weight": (d,), "W_o": (E, H * d),
        }  # fmt: skip

    def forward(self, x, attention_mask=None, state: DeltaNetState | None = None):
        """x (B, L, E), attention_mask (B, L) bool or None (False: padding, its input zeroed), state the previous
        call's or None (zeros)  ->  ((y (B, L, E), the state after the call), cache). Nothing passed in is modified."""
        x, attention_mask = self._check(x, attention_mask, state)
        p, (B, L, _) = self.params, x.shape
        H, d = self.num_heads, self.head_k_dim
        mask = None if attention_mask is None else attention_mask[..., None]  # (B, L, 1)
        if mask is not None:
            x = x * mask  # F0: (B, L, E) padding tokens' inputs zeroed
        proj = [F.linear_forward(x, p[n], check=False) for n in ("W_q", "W_k", "W_v")]  # F1: (B, L, H·d) each
        mixed = np.concatenate([y for y, _ in proj], axis=-1)  # F2: (B, L, 3·H·d) [q | k | v]
        (mixed, conv_state), c_conv = causal_conv1d_forward(
            mixed, p["conv_weight"], None, None if state is None else state.conv
        )  # F2: (B, L, 3·H·d)
        q, k, v = (mixed[..., i * H * d : (i + 1) * H * d].reshape(B, L, H, d).transpose(0, 2, 1, 3) for i in range(3))
        # F2: q, k, v (B, L, H·d) -> (B, L, H, d) -> (B, H, L, d)
        fa, c_fa = F.linear_forward(x, p["W_fa"], check=False)  # F3: (B, L, E) @ (E, d) -> (B, L, d)
        f, c_fb = F.linear_forward(fa, p["W_fb"], check=False)  # F3: (B, L, d) @ (d, H·d) -> (B, L, H·d)
        g, c_g = decay_forward(f.reshape(B, L, H, d), p["A_log"], p["dt_bias"])  # F4: (B, L, H, d), ≤ 0
        b, c_b = F.linear_forward(x, p["W_b"], check=False)  # F5: (B, L, E) @ (E, H) -> (B, L, H)
        beta, c_beta = sigmoid_forward(b)  # F5: (B, L, H)
        (o, S), c_core = gated_delta_rule_forward(
            q, k, v, g.transpose(0, 2, 1, 3), beta.transpose(0, 2, 1), None if state is None else state.recurrent,
            chunk_size=self.chunk_size, impl=self.impl, use_qk_l2norm=True,
        )  # F6: g (B, H, L, d), o (B, H, L, d), S (B, H, d, d)  # fmt: skip
        ga, c_ga = F.linear_forward(x, p["W_ga"], check=False)  # F7: (B, L, E) @ (E, d) -> (B, L, d)
        gate, c_gb = F.linear_forward(ga, p["W_gb"], check=False)  # F7: (B, L, d) @ (d, H·d) -> (B, L, H·d)
        n, c_norm = gated_rms_norm_forward(
            o.transpose(0, 2, 1, 3), gate.reshape(B, L, H, d), p["norm_weight"], self.eps, "sigmoid"
        )  # F7: (B, L, H, d)
        y, c_out = F.linear_forward(n.reshape(B, L, H * d), p["W_o"], check=False)  # F8: (B, L, H·d) -> (B, L, E)
        cache = KimiCache(mask, [c for _, c in proj], c_conv, c_fa, c_fb, c_g, c_b, c_beta, c_core, c_ga, c_gb,
                          c_norm, c_out, state is not None)  # fmt: skip
        return (y, DeltaNetState(conv_state, S)), cache

    def backward(self, d_y, cache: KimiCache, d_state: DeltaNetState | None = None) -> dict:
        """d_y (B, L, E), d_state: the gradient of the returned state (or None) -> {"x" (B, L, E), one entry a
        parameter, "state": a DeltaNetState of the initial state's gradients (None when none was given)}."""
        c, H, d = cache, self.num_heads, self.head_k_dim
        d_y = as_float_array(d_y, "d_y", ndim=3)
        self._check_d_state(d_state)
        B, L, _ = d_y.shape
        grads = {}
        dn, grads["W_o"], _ = F.linear_backward(d_y, c.c_out)  # ← F8: (B, L, E) @ (E, H·d) -> (B, L, H·d)
        do, d_gate, grads["norm_weight"] = gated_rms_norm_backward(dn.reshape(B, L, H, d), c.c_norm)  # ← F7
        d_ga, grads["W_gb"], _ = F.linear_backward(d_gate.reshape(B, L, H * d), c.c_gb)  # ← F7: (B, L, d)
        dx, grads["W_ga"], _ = F.linear_backward(d_ga, c.c_ga)  # ← F7: (B, L, E)
        gc = gated_delta_rule_backward(
            do.transpose(0, 2, 1, 3), c.c_core, None if d_state is None else d_state.recurrent
        )  # ← F6: (B, H, L, d) each
        db = sigmoid_backward(gc["beta"].transpose(0, 2, 1), c.c_beta)  # ← F5: (B, L, H)
        dx_b, grads["W_b"], _ = F.linear_backward(db, c.c_b)  # ← F5
        df, grads["A_log"], grads["dt_bias"] = decay_backward(gc["g"].transpose(0, 2, 1, 3), c.c_g)  # ← F4
        d_fa, grads["W_fb"], _ = F.linear_backward(df.reshape(B, L, H * d), c.c_fb)  # ← F3: (B, L, d)
        dx_f, grads["W_fa"], _ = F.linear_backward(d_fa, c.c_fa)  # ← F3: (B, L, E)
        # ← F2: the three (B, H, L, d) gradients back in the conv's layout [q | k | v], (B, L, 3·H·d)
        d_mixed = np.concatenate([gc[n].transpose(0, 2, 1, 3).reshape(B, L, H * d) for n in "qkv"], axis=-1)
        cv = causal_conv1d_backward(d_mixed, c.c_conv, None if d_state is None else d_state.conv)  # ← F2
        grads["conv_weight"] = cv["weight"]
        dx = dx + dx_b + dx_f  # x fed every projection
        for i, name in enumerate(("W_q", "W_k", "W_v")):
            dx_i, grads[name], _ = F.linear_backward(cv["x"][..., i * H * d : (i + 1) * H * d], c.c_proj[i])  # ← F1
            dx = dx + dx_i
        if c.mask is not None:
            dx = dx * c.mask  # ← F0
        d_initial = DeltaNetState(cv["initial_state"], gc["initial_state"]) if c.has_state else None
        return {"x": dx, **{n: grads[n] for n in self.PARAM_NAMES}, "state": d_initial}
