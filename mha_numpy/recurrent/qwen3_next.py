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

import numpy as np

from .._checks import as_float_array, as_int

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
