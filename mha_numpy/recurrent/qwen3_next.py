"""Qwen3-Next's Gated DeltaNet layer (``Qwen3NextGatedDeltaNet``) with a hand-written backward, and its pieces.

    qkvz, ba = x W_qkvzᵀ, x W_baᵀ                       F1   in_proj_qkvz, in_proj_ba (no biases)
    q, k, v, z, b, a = split(qkvz, ba)                  F2   ``in_proj_split_forward`` (fix_query_key_value_ordering)
    [q|k|v] = silu(causal_conv([q|k|v]))                F3   one depthwise conv over the 2·Hk·dk + Hv·dv channels
    β = σ(b),  g = −exp(A_log)·softplus(a + dt_bias)    F4   ``gates``
    o, S = gated_delta_rule(q, k, v, g, β, S₀)          F5   q, k L2-normalised, q scaled by dk^-1/2
    n = RMSNorm(o)·w·silu(z)                            F6   ``norms``, per value head
    y = n W_outᵀ                                        F7   out_proj

Hk key heads (q, k) and Hv value heads (v, z, β, g, the state), Hv a multiple of Hk: value head j reads key head
j // (Hv / Hk). The pieces are pairs of their own (``recurrent.conv``, ``recurrent.gates``, ``recurrent.norms``,
``in_proj_split_forward`` here); docs/deltanet_layer.md says what each one checks against transformers.
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

# --------------------------------------------------------------------------- the in-projection's layout


def check_split_sizes(num_k_heads, num_v_heads, head_k_dim, head_v_dim) -> tuple[int, int, int, int]:
    """Hk, Hv, dk, dv as positive ints with Hv a multiple of Hk, or ValueError naming the argument."""
    Hk = as_int(num_k_heads, "num_k_heads", minimum=1)
    Hv = as_int(num_v_heads, "num_v_heads", minimum=1)
    dk = as_int(head_k_dim, "head_k_dim", minimum=1)
    dv = as_int(head_v_dim, "head_v_dim", minimum=1)
    if Hv % Hk:
        raise ValueError(f"num_v_heads = {Hv} must be a multiple of num_k_heads = {Hk} (each key head serves "
                         f"Hv / Hk value heads)")  # fmt: skip
    return Hk, Hv, dk, dv


def in_proj_split_forward(mixed_qkvz, mixed_ba, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int):
    """The outputs of ``in_proj_qkvz`` and ``in_proj_ba`` as the layer's six tensors (``fix_query_key_value_ordering``).

    The features are grouped by key head: group i of ``mixed_qkvz`` is [q_i (dk), k_i (dk), v_i (r·dv), z_i (r·dv)],
    of ``mixed_ba`` [b_i (r), a_i (r)], r = Hv / Hk, and value head j belongs to key head j // r.

    mixed_qkvz: (…, Hk·(2dk + 2r·dv))   mixed_ba: (…, 2Hv)
    ->   ((q, k (…, Hk, dk), v, z (…, Hv, dv), b, a (…, Hv)), cache): views of the inputs (read, never written).
    """
    Hk, Hv, dk, dv = check_split_sizes(num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    r = Hv // Hk
    mixed_qkvz = as_float_array(mixed_qkvz, "mixed_qkvz")
    mixed_ba = as_float_array(mixed_ba, "mixed_ba")
    width = Hk * (2 * dk + 2 * r * dv)
    if mixed_qkvz.ndim < 1 or mixed_qkvz.shape[-1] != width:
        raise ValueError(f"mixed_qkvz with shape {mixed_qkvz.shape} must end in Hk·(2dk + 2·dv·Hv/Hk) = {width}")
    if mixed_ba.shape != (*mixed_qkvz.shape[:-1], 2 * Hv):
        raise ValueError(f"mixed_ba with shape {mixed_ba.shape} must be {(*mixed_qkvz.shape[:-1], 2 * Hv)}")
    lead = mixed_qkvz.shape[:-1]
    m = mixed_qkvz.reshape(*lead, Hk, 2 * dk + 2 * r * dv)  # F1: (…, Hk, 2dk + 2r·dv) one group a key head
    q, k = m[..., :dk], m[..., dk : 2 * dk]  # F2: (…, Hk, dk) each
    v = m[..., 2 * dk : 2 * dk + r * dv].reshape(*lead, Hv, dv)  # F3: (…, Hk, r·dv) -> (…, Hv, dv)
    z = m[..., 2 * dk + r * dv :].reshape(*lead, Hv, dv)  # F4: (…, Hk, r·dv) -> (…, Hv, dv)
    n = mixed_ba.reshape(*lead, Hk, 2 * r)  # F5: (…, Hk, 2r)
    b, a = n[..., :r].reshape(*lead, Hv), n[..., r:].reshape(*lead, Hv)  # F6: (…, Hk, r) -> (…, Hv) each
    return (q, k, v, z, b, a), (lead, Hk, Hv, dk, dv)


def in_proj_split_backward(d_parts, cache):
    """d_parts: (dq, dk, dv, dz, db, da), the outputs' gradients -> d_mixed_qkvz, d_mixed_ba (the inverse layout)."""
    lead, Hk, Hv, dk, dv = cache
    r = Hv // Hk
    dq, dkey, dval, dz, db, da = d_parts
    d_m = np.concatenate(  # ← F4 … F1: (…, Hk, 2dk + 2r·dv), each key head's group back in place
        [dq, dkey, dval.reshape(*lead, Hk, r * dv), dz.reshape(*lead, Hk, r * dv)], axis=-1
    )
    d_n = np.concatenate([db.reshape(*lead, Hk, r), da.reshape(*lead, Hk, r)], axis=-1)  # ← F6, F5: (…, Hk, 2r)
    return d_m.reshape(*lead, Hk * (2 * dk + 2 * r * dv)), d_n.reshape(*lead, 2 * Hv)  # ← F1, F5


# --------------------------------------------------------------------------- the layer


@dataclass
class DeltaNetCache:
    """Intermediates of ``GatedDeltaNet.forward`` for its backward, one a forward line (F0 … F7)."""

    mask: np.ndarray | None  # F0: (B, L, 1) or None
    c_qkvz: tuple  # F1
    c_ba: tuple  # F1
    c_split: tuple  # F2
    c_conv: tuple  # F3
    c_beta: np.ndarray  # F4
    c_g: tuple  # F4
    c_core: object  # F5
    c_norm: tuple  # F6
    c_out: tuple  # F7
    has_state: bool


class GatedDeltaNet(RecurrentLayer):
    """Qwen3-Next's Gated DeltaNet layer (``Qwen3NextGatedDeltaNet``; module docstring), forward and backward.

    hidden_size E; num_k_heads Hk, num_v_heads Hv (a multiple of Hk), head_k_dim dk, head_v_dim dv;
    conv_kernel_size K; eps of the gated RMSNorm; chunk_size and impl ("chunked" | "recurrent") of the core.
    ``params``: a dict of the seven arrays below (copied, in ``dtype``), or None for a random start from ``rng``:

    ==============  =======================  ==========================================================
    name            shape                    transformers (``interop.qwen3_next_deltanet``)
    ==============  =======================  ==========================================================
    W_qkvz          (2·Hk·dk + 2·Hv·dv, E)   in_proj_qkvz.weight (grouped by key head, see the split)
    W_ba            (2·Hv, E)                in_proj_ba.weight
    conv_weight     (C, K), C = 2·Hk·dk+Hv·dv  conv1d.weight (C, 1, K)
    dt_bias         (Hv,)                    dt_bias
    A_log           (Hv,)                    A_log
    norm_weight     (dv,)                    norm.weight
    W_out           (E, Hv·dv)               out_proj.weight
    ==============  =======================  ==========================================================
    """

    PARAM_NAMES = ("W_qkvz", "W_ba", "conv_weight", "dt_bias", "A_log", "norm_weight", "W_out")

    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel_size: int = 4,
        eps: float = 1e-6,
        *,
        params: dict | None = None,
        rng=0,
        dtype=np.float64,
        chunk_size: int = 64,
        impl: str = "chunked",
    ) -> None:
        self.hidden_size = as_int(hidden_size, "hidden_size", minimum=1)
        self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim = check_split_sizes(
            num_k_heads, num_v_heads, head_k_dim, head_v_dim
        )
        self.conv_kernel_size = as_int(conv_kernel_size, "conv_kernel_size", minimum=1)
        self.eps = as_number(eps, "eps", positive=True)
        self.impl, self.chunk_size = check_layer_options(impl, chunk_size)
        self._set_params(params, rng, dtype)

    def __repr__(self) -> str:
        return (
            f"GatedDeltaNet(E={self.hidden_size}, Hk={self.num_k_heads}, Hv={self.num_v_heads}, "
            f"dk={self.head_k_dim}, dv={self.head_v_dim}, K={self.conv_kernel_size}, {self.impl})"
        )

    @property
    def conv_dim(self) -> int:
        """C = 2·Hk·dk + Hv·dv: the channels of the conv, [q | k | v]."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def state_heads(self) -> int:
        """Hv: the recurrent state is one (dk, dv) matrix a value head."""
        return self.num_v_heads

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each parameter's shape, by name (the class docstring's table)."""
        E, Hk, Hv, dk, dv = self.hidden_size, self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        return {
            "W_qkvz": (2 * Hk * dk + 2 * Hv * dv, E),
            "W_ba": (2 * Hv, E),
            "conv_weight": (self.conv_dim, self.conv_kernel_size),
            "dt_bias": (Hv,),
            "A_log": (Hv,),
            "norm_weight": (dv,),
            "W_out": (E, Hv * dv),
        }

    def forward(self, x, attention_mask=None, state: DeltaNetState | None = None):
        """x (B, L, E), attention_mask (B, L) bool or None (False: a padding token, its input zeroed, as
        transformers' ``apply_mask_to_padding_states``), state: the previous call's or None (zeros)
        ->   ((y (B, L, E), the state after the call), cache). Nothing passed in is modified."""
        x, attention_mask = self._check(x, attention_mask, state)
        p, B, L = self.params, x.shape[0], x.shape[1]
        Hk, Hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        mask = None if attention_mask is None else attention_mask[..., None]  # (B, L, 1)
        if mask is not None:
            x = x * mask  # F0: (B, L, E) padding tokens' inputs zeroed
        qkvz, c_qkvz = F.linear_forward(x, p["W_qkvz"], check=False)  # F1: (B, L, E) @ (E, P) -> (B, L, P)
        ba, c_ba = F.linear_forward(x, p["W_ba"], check=False)  # F1: (B, L, E) @ (E, 2Hv) -> (B, L, 2Hv)
        (q, k, v, z, b, a), c_split = in_proj_split_forward(qkvz, ba, Hk, Hv, dk, dv)  # F2
        mixed = np.concatenate(
            [q.reshape(B, L, Hk * dk), k.reshape(B, L, Hk * dk), v.reshape(B, L, Hv * dv)], axis=-1
        )  # F3: (B, L, C) [q | k | v]
        conv_state = None if state is None else state.conv
        (mixed, conv_state), c_conv = causal_conv1d_forward(mixed, p["conv_weight"], None, conv_state)  # F3
        q = mixed[..., : Hk * dk].reshape(B, L, Hk, dk).transpose(0, 2, 1, 3)  # F3: (B, Hk, L, dk)
        k = mixed[..., Hk * dk : 2 * Hk * dk].reshape(B, L, Hk, dk).transpose(0, 2, 1, 3)  # F3: (B, Hk, L, dk)
        v = mixed[..., 2 * Hk * dk :].reshape(B, L, Hv, dv).transpose(0, 2, 1, 3)  # F3: (B, Hv, L, dv)
        beta, c_beta = sigmoid_forward(b)  # F4: (B, L, Hv)
        g, c_g = decay_forward(a, p["A_log"], p["dt_bias"])  # F4: (B, L, Hv), ≤ 0
        (o, S), c_core = gated_delta_rule_forward(
            q, k, v, g.transpose(0, 2, 1), beta.transpose(0, 2, 1), None if state is None else state.recurrent,
            chunk_size=self.chunk_size, impl=self.impl, use_qk_l2norm=True,
        )  # F5: g, β (B, Hv, L); o (B, Hv, L, dv), S (B, Hv, dk, dv)  # fmt: skip
        o = o.transpose(0, 2, 1, 3)  # F5: (B, L, Hv, dv)
        n, c_norm = gated_rms_norm_forward(o, z, p["norm_weight"], self.eps, "silu")  # F6: (B, L, Hv, dv)
        y, c_out = F.linear_forward(n.reshape(B, L, Hv * dv), p["W_out"], check=False)  # F7: (B, L, Hv·dv) -> (B, L, E)
        cache = DeltaNetCache(
            mask, c_qkvz, c_ba, c_split, c_conv, c_beta, c_g, c_core, c_norm, c_out, state is not None
        )
        return (y, DeltaNetState(conv_state, S)), cache

    def backward(self, d_y, cache: DeltaNetCache, d_state: DeltaNetState | None = None) -> dict:
        """d_y (B, L, E), d_state: the gradient of the returned state (or None) -> {"x" (B, L, E), one entry a
        parameter, "state": a DeltaNetState of the initial state's gradients (None when none was given)}."""
        c, Hk, Hv, dk, dv = cache, self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        d_y = as_float_array(d_y, "d_y", ndim=3)
        B, L, _ = d_y.shape
        self._check_d_state(d_state)
        dn, dW_out, _ = F.linear_backward(d_y, c.c_out)  # ← F7: (B, L, E) @ (E, Hv·dv) -> (B, L, Hv·dv)
        do, dz, d_norm = gated_rms_norm_backward(dn.reshape(B, L, Hv, dv), c.c_norm)  # ← F6: (B, L, Hv, dv)
        d_S = None if d_state is None else d_state.recurrent
        gc = gated_delta_rule_backward(do.transpose(0, 2, 1, 3), c.c_core, d_S)  # ← F5: (B, H, L, d) each
        db = sigmoid_backward(gc["beta"].transpose(0, 2, 1), c.c_beta)  # ← F4: (B, L, Hv)
        da, dA_log, d_dt_bias = decay_backward(gc["g"].transpose(0, 2, 1), c.c_g)  # ← F4: (B, L, Hv)
        sizes = {"q": Hk * dk, "k": Hk * dk, "v": Hv * dv}  # ← F3: the (B, H, L, d) gradients as (B, L, C) [q|k|v]
        d_mixed = np.concatenate([gc[n].transpose(0, 2, 1, 3).reshape(B, L, sizes[n]) for n in "qkv"], axis=-1)
        cv = causal_conv1d_backward(d_mixed, c.c_conv, None if d_state is None else d_state.conv)  # ← F3
        dm = cv["x"]  # (B, L, C)
        dq = dm[..., : Hk * dk].reshape(B, L, Hk, dk)  # ← F3: (B, L, Hk, dk)
        dkey = dm[..., Hk * dk : 2 * Hk * dk].reshape(B, L, Hk, dk)  # ← F3
        dv_ = dm[..., 2 * Hk * dk :].reshape(B, L, Hv, dv)  # ← F3: (B, L, Hv, dv)
        d_qkvz, d_ba = in_proj_split_backward((dq, dkey, dv_, dz, db, da), c.c_split)  # ← F2
        dx_qkvz, dW_qkvz, _ = F.linear_backward(d_qkvz, c.c_qkvz)  # ← F1: (B, L, P) @ (P, E) -> (B, L, E)
        dx_ba, dW_ba, _ = F.linear_backward(d_ba, c.c_ba)  # ← F1
        dx = dx_qkvz + dx_ba  # x fed both projections
        if c.mask is not None:
            dx = dx * c.mask  # ← F0
        d_initial = DeltaNetState(cv["initial_state"], gc["initial_state"]) if c.has_state else None
        grads = [dW_qkvz, dW_ba, cv["weight"], d_dt_bias, dA_log, d_norm, dW_out]  # in PARAM_NAMES' order
        return {"x": dx, **dict(zip(self.PARAM_NAMES, grads, strict=True)), "state": d_initial}
