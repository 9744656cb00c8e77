"""The gated delta rule token by token (the recurrent form, its definition) and its backward through time.

On prepared arrays: q, k (B, H, L, dk) already normalised, scaled and repeated to the value heads
(``gated_delta`` does that), v (B, H, L, dv), g (B, H, L) one log decay a head or (B, H, L, dk) one a key channel
(Kimi Delta Attention), β (B, H, L), S₀ (B, H, dk, dv). For each token t, as transformers'
``torch_recurrent_gated_delta_rule`` (and ``recurrent_kimi_delta_attention``) computes it, decay first, then the
delta correction read from the decayed state:

    R1  S̃_t = Diag(a_t) S_{t−1}                  (dk, dv)   a_t = exp(g_t): every row (scalar g: all alike)
    R2  u_t = v_t − S̃_tᵀ k_t                    (dv,)      what the decayed memory gets wrong about v_t
    R3  S_t = S̃_t + β_t k_t u_tᵀ                (dk, dv)   = (I − β_t k_t k_tᵀ) S̃_t + β_t k_t v_tᵀ
    R4  o_t = S_tᵀ q_t                           (dv,)

The backward walks t = L … 1 with the state's gradient dS (of S_t) carried backwards (docs/derivation.md § 30):

    ← R4  dS += q_t do_tᵀ,   dq_t = S_t do_t
    ← R3  dβ_t = k_tᵀ dS u_t,   dk_t = β_t dS u_t,   du_t = β_t dSᵀ k_t,   dS̃ = dS
    ← R2  dv_t = du_t,   dk_t −= S̃_t du_t,   dS̃ −= k_t du_tᵀ
    ← R1  dg_t = a_t ⊙ Σ_v (dS̃ ⊙ S_{t−1})  (summed over dk for a scalar gate),   dS ← Diag(a_t) dS̃

The states are not all kept (L·dk·dv a head): the forward keeps S every ``checkpoint`` tokens, and the backward
recomputes one segment's states from its checkpoint before walking it backwards (twice the forward's arithmetic,
memory (L / checkpoint + checkpoint)·dk·dv a head).
"""

from __future__ import annotations

import numpy as np


def delta_rule_token(S, q_t, k_t, v_t, a_t, beta_t):
    """One token of the recurrence: R1–R4 on a whole batch of heads.

    S (B, H, dk, dv); q_t, k_t (B, H, dk); v_t (B, H, dv); a_t (B, H, 1) or (B, H, dk); beta_t (B, H)
    -> o_t (B, H, dv), S_t (B, H, dk, dv), and (S̃_t, u_t) for the backward.
    """
    S_dec = a_t[..., :, None] * S  # R1: (B, H, dk or 1, 1) * (B, H, dk, dv)
    u = v_t - (k_t[..., None, :] @ S_dec)[..., 0, :]  # R2: (B, H, 1, dk) @ (B, H, dk, dv) -> (B, H, dv)
    S_new = S_dec + (beta_t[..., None] * k_t)[..., :, None] * u[..., None, :]  # R3: (B, H, dk, 1) * (B, H, 1, dv)
    o = (q_t[..., None, :] @ S_new)[..., 0, :]  # R4: (B, H, 1, dk) @ (B, H, dk, dv) -> (B, H, dv)
    return o, S_new, (S_dec, u)


def delta_rule_recurrent_forward(q, k, v, g, beta, S0, checkpoint: int = 64):
    """R1–R4 for t = 1 … L.   q, k (B, H, L, dk), v (B, H, L, dv), g (B, H, L) or (B, H, L, dk), beta (B, H, L),
    S0 (B, H, dk, dv)  ->  ((o (B, H, L, dv), S_L (B, H, dk, dv)), cache)."""
    L = q.shape[2]
    a = np.exp(g if g.ndim == 4 else g[..., None])  # (B, H, L, dk or 1)
    o = np.empty(v.shape, dtype=v.dtype)
    S = S0
    saved = []  # S_{t−1} at t = 0, checkpoint, 2·checkpoint, ...
    for t in range(L):
        if t % checkpoint == 0:
            saved.append(S)
        o[:, :, t], S, _ = delta_rule_token(S, q[:, :, t], k[:, :, t], v[:, :, t], a[:, :, t], beta[:, :, t])
    return (o, S), (q, k, v, a, beta, saved, checkpoint, g.shape)


def delta_rule_recurrent_backward(d_o, d_S, cache):
    """Back through time.   d_o (B, H, L, dv), d_S (B, H, dk, dv) the final state's gradient (or None)
    -> (dq, dk, dv, dg, d_beta, dS0), each in its input's shape."""
    q, k, v, a, beta, saved, checkpoint, g_shape = cache
    L = q.shape[2]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dg, d_beta = np.zeros_like(a), np.zeros_like(beta)
    dS = np.zeros((*v.shape[:2], q.shape[3], v.shape[3]), dtype=v.dtype) if d_S is None else d_S.copy()  # (B,H,dk,dv)
    for start in reversed(range(0, L, checkpoint)):
        stop = min(start + checkpoint, L)
        states = [saved[start // checkpoint]]  # S_{t−1} for t in [start, stop), then S_{stop−1}
        inner = []
        for t in range(start, stop):  # recompute the segment's states from its checkpoint
            _, S, kept = delta_rule_token(states[-1], q[:, :, t], k[:, :, t], v[:, :, t], a[:, :, t], beta[:, :, t])
            states.append(S)
            inner.append(kept)
        for t in reversed(range(start, stop)):
            S_prev, S_t, (S_dec, u) = states[t - start], states[t - start + 1], inner[t - start]
            q_t, k_t, do_t, b_t = q[:, :, t], k[:, :, t], d_o[:, :, t], beta[:, :, t]
            dS = dS + q_t[..., :, None] * do_t[..., None, :]  # ← R4: (B, H, dk, 1) * (B, H, 1, dv)
            dq[:, :, t] = (S_t @ do_t[..., :, None])[..., 0]  # ← R4: (B, H, dk, dv) @ (B, H, dv, 1)
            dS_u = (dS @ u[..., :, None])[..., 0]  # ← R3: (B, H, dk, dv) @ (B, H, dv, 1) -> (B, H, dk)
            d_beta[:, :, t] = np.sum(k_t * dS_u, axis=-1)  # ← R3: k_tᵀ dS u_t
            du = b_t[..., None] * (k_t[..., None, :] @ dS)[..., 0, :]  # ← R3: (B, H, 1, dk) @ (B, H, dk, dv)
            dv[:, :, t] = du  # ← R2
            dk[:, :, t] = b_t[..., None] * dS_u - (S_dec @ du[..., :, None])[..., 0]  # ← R3, R2: (B, H, dk)
            dS_dec = dS - k_t[..., :, None] * du[..., None, :]  # ← R2: (B, H, dk, 1) * (B, H, 1, dv)
            a_t = a[:, :, t]  # (B, H, 1 or dk)
            da = np.sum(dS_dec * S_prev, axis=-1)  # ← R1: (B, H, dk)
            dg[:, :, t] = a_t * (da if a_t.shape[-1] != 1 else np.sum(da, axis=-1, keepdims=True))  # ← R1
            dS = a_t[..., :, None] * dS_dec  # ← R1: the gradient of S_{t−1}
    return dq, dk, dv, dg.reshape(g_shape), d_beta, dS  # (B, H, L, 1) -> (B, H, L) for a scalar gate
