"""Causal linear attention (Katharopoulos et al., 2020) with the feature map φ = elu + 1, recurrent and chunked.

Softmax attention's weights exp(q·k) replaced by a product of features φ(q)ᵀφ(k) makes the causal sum a state:

    F1  Q, K = φ(q), φ(k)                      ``features.elu_plus_one`` (positive features)
    F2  Q, K repeated to the value heads       (head h reads key head h // (H / Hk), as ``gated_delta``)
    F3  S_t = S_{t−1} + K_t V_tᵀ,  o_t = S_tᵀ Q_t          (dk, dv) state, S₀ given or 0

which is the (L, L) masked form O = (Q Kᵀ ⊙ M) V + Q S₀ (M the causal mask, the diagonal included) read one token
at a time, never building the (L, L) matrix. Unnormalised, as flash-linear-attention's ``chunk_linear_attn``
(normalize=False) and the delta rule of ``gated_delta``: the delta rule is this with the write corrected by what
S already predicts and a decay. Two forms of F3, one function:

- recurrent (t = 1 … L):   o_t = S_tᵀ Q_t; its backward carries dS_t = dS_{t+1} + Q_t do_tᵀ backwards, and
  dQ_t = S_t do_t, dK_t = dS_t V_t, dV_t = dS_tᵀ K_t (the states recomputed from checkpoints, as ``delta_rule``).
- chunked (chunks of C):   O = Q S + (Q Kᵀ ⊙ M_C) V,  S ← S + Kᵀ V; backward dS ← dS + Qᵀ dO chunk by chunk.

Layout (B, H, L, d): q, k (B, Hk, L, dk), v (B, H, L, dv), initial_state (B, H, dk, dv) or None.
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .._checks import as_float_array, check_like
from .checks import check_chunk_size, check_impl, check_qkv_heads
from .delta_chunked import to_chunks
from .features import elu_plus_one_backward, elu_plus_one_forward


def linear_attention_forward(q, k, v, initial_state=None, chunk_size=64, impl="chunked"):
    """Causal linear attention, φ = elu + 1 -> ((o (B, H, L, dv), final_state (B, H, dk, dv)), cache)."""
    impl, chunk_size = check_impl(impl), check_chunk_size(chunk_size)
    q, k, v = check_qkv_heads(q, k, v)
    B, Hk, L, dk = q.shape
    H, dv = v.shape[1], v.shape[3]
    if initial_state is not None:
        initial_state = as_float_array(initial_state, "initial_state")
        if initial_state.shape != (B, H, dk, dv) or initial_state.dtype != q.dtype:
            raise ValueError(f"initial_state must be (B, H, dk, dv) = {(B, H, dk, dv)} of q's dtype {q.dtype}, got "
                             f"{initial_state.shape} {initial_state.dtype}")  # fmt: skip
    phi_q, c_q = elu_plus_one_forward(q)  # F1: (B, Hk, L, dk)
    phi_k, c_k = elu_plus_one_forward(k)  # F1
    Q, c_rq = F.repeat_kv_forward(phi_q, H // Hk, check=False)  # F2: (B, H, L, dk)
    K, c_rk = F.repeat_kv_forward(phi_k, H // Hk, check=False)  # F2
    S0 = np.zeros((B, H, dk, dv), dtype=v.dtype) if initial_state is None else initial_state.copy()
    run = linear_recurrent_forward if impl == "recurrent" else linear_chunked_forward
    (o, S), c_core = run(Q, K, v, S0, chunk_size)  # F3
    return (o, S), (impl, c_q, c_k, c_rq, c_rk, c_core, initial_state is not None, o.shape, S.shape, o.dtype)


def linear_attention_backward(d_o, cache, d_final_state=None) -> dict:
    """d_o (B, H, L, dv), d_final_state (B, H, dk, dv) or None -> {"q", "k", "v", "initial_state"}."""
    impl, c_q, c_k, c_rq, c_rk, c_core, has_state, o_shape, S_shape, dtype = cache
    d_o = check_like(d_o, "d_o", o_shape, dtype, "o")
    if d_final_state is not None:
        d_final_state = check_like(d_final_state, "d_final_state", S_shape, dtype, "final_state")
    run = linear_recurrent_backward if impl == "recurrent" else linear_chunked_backward
    dQ, dK, dv, dS0 = run(d_o, d_final_state, c_core)  # ← F3
    dq = elu_plus_one_backward(F.repeat_kv_backward(dQ, c_rq), c_q)  # ← F2, F1
    dk = elu_plus_one_backward(F.repeat_kv_backward(dK, c_rk), c_k)  # ← F2, F1
    return {"q": dq, "k": dk, "v": dv, "initial_state": dS0 if has_state else None}


def linear_recurrent_forward(Q, K, V, S0, checkpoint: int = 64):
    """F3 token by token.   Q, K (B, H, L, dk), V (B, H, L, dv), S0 (B, H, dk, dv) -> ((o, S_L), cache)."""
    o = np.empty(V.shape, dtype=V.dtype)
    S, saved = S0, []
    for t in range(V.shape[2]):
        if t % checkpoint == 0:
            saved.append(S)
        S = S + K[:, :, t, :, None] * V[:, :, t, None, :]  # F3: (B, H, dk, 1) * (B, H, 1, dv)
        o[:, :, t] = (Q[:, :, t, None, :] @ S)[..., 0, :]  # F3: (B, H, 1, dk) @ (B, H, dk, dv) -> (B, H, dv)
    return (o, S), (Q, K, V, saved, checkpoint)


def linear_recurrent_backward(d_o, d_S, cache):
    """Back through time -> (dQ, dK, dV, dS0)."""
    Q, K, V, saved, checkpoint = cache
    L = V.shape[2]
    dQ, dK, dV = np.empty_like(Q), np.empty_like(K), np.empty_like(V)
    dS = np.zeros((*V.shape[:2], Q.shape[3], V.shape[3]), dtype=V.dtype) if d_S is None else d_S.copy()
    for start in reversed(range(0, L, checkpoint)):
        states = [saved[start // checkpoint]]
        for t in range(start, min(start + checkpoint, L)):  # the segment's states again, from its checkpoint
            states.append(states[-1] + K[:, :, t, :, None] * V[:, :, t, None, :])  # F3
        for t in reversed(range(start, min(start + checkpoint, L))):
            dS = dS + Q[:, :, t, :, None] * d_o[:, :, t, None, :]  # ← F3: o_t = S_tᵀ Q_t, (B, H, dk, dv)
            dQ[:, :, t] = (states[t - start + 1] @ d_o[:, :, t, :, None])[..., 0]  # ← F3: (B, H, dk, dv) @ (…, dv, 1)
            dK[:, :, t] = (dS @ V[:, :, t, :, None])[..., 0]  # ← F3: S_t ∋ K_t V_tᵀ, (B, H, dk, dv) @ (…, dv, 1)
            dV[:, :, t] = (K[:, :, t, None, :] @ dS)[..., 0, :]  # ← F3: (B, H, 1, dk) @ (B, H, dk, dv)
    return dQ, dK, dV, dS


def linear_chunked_forward(Q, K, V, S0, chunk_size: int = 64):
    """F3 by chunks: O = Q S + (Q Kᵀ ⊙ M_C) V, S ← S + Kᵀ V (the last chunk zero-padded: zeros write nothing)."""
    B, H, L, dv = V.shape
    C = min(chunk_size, max(L, 1))
    Qc, Kc, Vc = (to_chunks(x, C) for x in (Q, K, V))  # (B, H, N, C, ·)
    N = Qc.shape[2]
    A = np.tril(Qc @ Kc.swapaxes(-1, -2))  # (…, C, dk) @ (…, dk, C) -> (…, C, C), the causal mask M_C
    states = np.empty((B, H, N, *S0.shape[2:]), dtype=V.dtype)  # the state entering each chunk
    S = S0
    for n in range(N):
        states[:, :, n] = S
        S = S + Kc[:, :, n].swapaxes(-1, -2) @ Vc[:, :, n]  # (B, H, dk, C) @ (B, H, C, dv)
    O = Qc @ states + A @ Vc  # (…, C, dk) @ (…, dk, dv) + (…, C, C) @ (…, C, dv)
    return (O.reshape(B, H, N * C, dv)[:, :, :L], S), (Qc, Kc, Vc, A, states, L)


def linear_chunked_backward(d_o, d_S, cache):
    """-> (dQ, dK, dV, dS0): the state's gradient carried backwards over the chunks, the rest all chunks at once."""
    Qc, Kc, Vc, A, states, L = cache
    B, H, N, C = Qc.shape[:4]
    dO = to_chunks(d_o, C)  # (B, H, N, C, dv)
    QtdO = Qc.swapaxes(-1, -2) @ dO  # (…, dk, C) @ (…, C, dv): what each chunk's outputs add to dS
    dS = np.zeros((B, H, *states.shape[3:]), dtype=states.dtype) if d_S is None else d_S.copy()
    dS_out = np.empty_like(states)  # the gradient of the state leaving each chunk
    for n in reversed(range(N)):
        dS_out[:, :, n] = dS
        dS = dS + QtdO[:, :, n]  # ← S ← S + Kᵀ V (identity) and O = Q S
    dA = np.tril(dO @ Vc.swapaxes(-1, -2))  # (…, C, dv) @ (…, dv, C)
    dQ = dO @ states.swapaxes(-1, -2) + dA @ Kc  # (…, C, dv) @ (…, dv, dk) + (…, C, C) @ (…, C, dk)
    dK = dA.swapaxes(-1, -2) @ Qc + Vc @ dS_out.swapaxes(-1, -2)  # (…, C, C) @ (…, C, dk) + (…, C, dv) @ (…, dv, dk)
    dV = A.swapaxes(-1, -2) @ dO + Kc @ dS_out  # (…, C, C) @ (…, C, dv) + (…, C, dk) @ (…, dk, dv)

    def unchunk(x):  # (B, H, N, C, d) -> (B, H, L, d)
        return x.reshape(B, H, N * C, x.shape[-1])[:, :, :L]

    return unchunk(dQ), unchunk(dK), unchunk(dV), dS
