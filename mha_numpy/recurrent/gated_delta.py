"""Gated DeltaNet (Qwen3-Next), DeltaNet and Kimi Delta Attention: the public pair and one-token decoding.

``gated_delta_rule_forward(q, k, v, g, beta, ...) -> ((o, final_state), cache)`` and
``gated_delta_rule_backward(d_o, cache, d_final_state=None) -> {"q", "k", "v", "g", "beta", "initial_state"}``.

Layout: the house's (B, H, L, d). transformers' ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``
take (B, L, H, d) and transpose to (B, H, L, d) inside; ``mha_numpy.interop.gated_delta`` converts.

============  ==========================  =================================================================
argument      shape                       meaning
============  ==========================  =================================================================
q, k          (B, Hk, L, dk)              queries and keys (Hk key heads)
v             (B, H, L, dv)               values; H a multiple of Hk (Qwen3-Next's default 16 / 32). Value
                                          head h reads key head h // (H / Hk), transformers'
                                          ``repeat_interleave(H // Hk, dim=heads)``; the backward sums the group
g             (B, H, L) or (B, H, L, dk)  log decay ≤ 0: the state is multiplied by exp(g_t) before token t.
                                          Per key channel (B, H, L, dk) is Kimi Delta Attention's gate;
                                          g ≡ 0 is DeltaNet
beta          (B, H, L)                   the write strength in [0, 1]
initial_state (B, H, dk, dv) or None      S₀ (zeros when None)
============  ==========================  =================================================================

Steps (the backward reads them upwards):

    F1  q, k ← l2norm(q), l2norm(k)             only with use_qk_l2norm (``features.l2norm``, eps 1e-6)
    F2  q ← q · scale                           scale = 1/√dk unless given, as transformers applies it
    F3  Q, K ← q, k repeated to the H value heads (head h reads key head h // (H / Hk))
    F4  the recurrence S_t = (I − β_t k_t k_tᵀ) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t:
        token by token (``delta_rule``, impl="recurrent") or by chunks (``delta_chunked``, impl="chunked")

float64 by default; float32 stays float32 (every input in one dtype).
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .._checks import check_like
from .checks import check_chunk_size, check_delta_inputs, check_impl
from .delta_chunked import delta_chunked_backward, delta_chunked_forward
from .delta_rule import delta_rule_recurrent_backward, delta_rule_recurrent_forward, delta_rule_token
from .features import l2norm_backward, l2norm_forward


def qk_prepare_forward(q, k, scale: float, use_qk_l2norm: bool, groups: int):
    """F1–F3: q, k (B, Hk, L, dk) -> Q, K (B, Hk·groups, L, dk) normalised (optionally), Q scaled, repeated."""
    cq = ck = None
    if use_qk_l2norm:
        q, cq = l2norm_forward(q)  # F1: (B, Hk, L, dk)
        k, ck = l2norm_forward(k)  # F1
    q = q * scale  # F2: a Python float, the dtype kept
    Q, c_rq = F.repeat_kv_forward(q, groups, check=False)  # F3: (B, Hk, L, dk) -> (B, H, L, dk), h <- h // groups
    K, c_rk = F.repeat_kv_forward(k, groups, check=False)  # F3
    return (Q, K), (cq, ck, scale, c_rq, c_rk)


def qk_prepare_backward(dQ, dK, cache):
    """← F3…F1: the group's gradients summed, the scale, the l2norm's projection."""
    cq, ck, scale, c_rq, c_rk = cache
    dq = F.repeat_kv_backward(dQ, c_rq)  # ← F3: (B, H, L, dk) -> (B, Hk, L, dk), each group summed
    dk_ = F.repeat_kv_backward(dK, c_rk)  # ← F3
    dq = dq * scale  # ← F2
    if cq is not None:
        dq, dk_ = l2norm_backward(dq, cq), l2norm_backward(dk_, ck)  # ← F1
    return dq, dk_


def gated_delta_rule_forward(
    q, k, v, g, beta, initial_state=None, chunk_size=64, impl="chunked", scale=None, use_qk_l2norm=False
):
    """The gated delta rule on (B, H, L, d) arrays (module docstring for the shapes).

    Returns ((o (B, H, L, dv), final_state (B, H, dk, dv)), cache). ``chunk_size``: the chunk of the chunked form;
    the recurrent form keeps its state every ``chunk_size`` tokens for the backward. Inputs are never modified.
    """
    impl = check_impl(impl)
    chunk_size = check_chunk_size(chunk_size)
    x = check_delta_inputs(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
    groups = x.v.shape[1] // x.q.shape[1]
    (Q, K), c_prep = qk_prepare_forward(x.q, x.k, x.scale, x.use_qk_l2norm, groups)  # F1–F3
    B, H, _, dk = K.shape
    S0 = np.zeros((B, H, dk, x.v.shape[3]), dtype=x.v.dtype) if x.initial_state is None else x.initial_state.copy()
    if impl == "recurrent":
        (o, S), c_core = delta_rule_recurrent_forward(Q, K, x.v, x.g, x.beta, S0, chunk_size)  # F4
    else:
        (o, S), c_core = delta_chunked_forward(Q, K, x.v, x.g, x.beta, S0, chunk_size)  # F4
    return (o, S), (impl, c_prep, c_core, x.initial_state is not None, o.shape, S.shape, o.dtype)


def gated_delta_rule_backward(d_o, cache, d_final_state=None) -> dict:
    """d_o (B, H, L, dv), d_final_state (B, H, dk, dv) or None -> {"q", "k", "v", "g", "beta", "initial_state"}
    (``initial_state``: None when the forward had none), each in its input's shape and dtype."""
    impl, c_prep, c_core, has_state, o_shape, S_shape, dtype = cache
    d_o = check_like(d_o, "d_o", o_shape, dtype, "o")
    if d_final_state is not None:
        d_final_state = check_like(d_final_state, "d_final_state", S_shape, dtype, "final_state")
    if impl == "recurrent":
        dQ, dK, dv, dg, d_beta, dS0 = delta_rule_recurrent_backward(d_o, d_final_state, c_core)  # ← F4
    else:
        dQ, dK, dv, dg, d_beta, dS0 = delta_chunked_backward(d_o, d_final_state, c_core)  # ← F4
    dq, dk = qk_prepare_backward(dQ, dK, c_prep)  # ← F3…F1
    return {"q": dq, "k": dk, "v": dv, "g": dg, "beta": d_beta, "initial_state": dS0 if has_state else None}


def gated_delta_rule_step(q_t, k_t, v_t, g_t, beta_t, state=None, scale=None, use_qk_l2norm=False):
    """One token of decoding with the state: the recurrent form's line R1–R4, the same arithmetic.

    q_t, k_t (B, Hk, dk), v_t (B, H, dv), g_t (B, H) or (B, H, dk), beta_t (B, H), state (B, H, dk, dv) or None
    -> (o_t (B, H, dv), new_state (B, H, dk, dv)). The inputs, ``state`` included, are not modified.
    """
    arrays = [np.asarray(a) for a in (q_t, k_t, v_t, g_t, beta_t)]
    names, ndims = ("q_t", "k_t", "v_t", "g_t", "beta_t"), ((3,), (3,), (3,), (2, 3), (2,))
    for name, a, ndim in zip(names, arrays, ndims, strict=True):
        if a.ndim not in ndim:
            raise ValueError(f"{name} must have {' or '.join(map(str, ndim))} dimensions, got shape {a.shape}")
    q, k, v, g, beta = (a[:, :, None] for a in arrays)  # (B, heads, 1, ...): a sequence of one token
    try:
        x = check_delta_inputs(q, k, v, g, beta, state, scale, use_qk_l2norm)
    except ValueError as e:  # named as the caller knows them: q -> q_t, initial_state -> state (shapes with L = 1)
        name, _, rest = str(e).partition(" ")
        name = {"initial_state": "state", "scale": "scale", "use_qk_l2norm": "use_qk_l2norm"}.get(name, f"{name}_t")
        raise ValueError(f"{name} {rest}") from None
    groups = x.v.shape[1] // x.q.shape[1]
    (Q, K), _ = qk_prepare_forward(x.q, x.k, x.scale, x.use_qk_l2norm, groups)
    B, H, _, dk = K.shape
    S = x.initial_state if x.initial_state is not None else np.zeros((B, H, dk, x.v.shape[3]), dtype=x.v.dtype)
    a = np.exp(x.g[:, :, 0] if x.g.ndim == 4 else x.g[:, :, 0, None])  # (B, H, dk or 1)
    o, S, _ = delta_rule_token(S, Q[:, :, 0], K[:, :, 0], x.v[:, :, 0], a, x.beta[:, :, 0])
    return o, S
