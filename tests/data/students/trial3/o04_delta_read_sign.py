# expect: FAIL
# where: delta_rule_recurrent_backward k
# name: relation term-sign | relation path
"""Outside the catalogue: dk's read term (R2, u = v − S̃ᵀk) added with a plus: the minus of the error forgotten on
the way back through the read."""

import numpy as np


def delta_rule_recurrent_forward(q, k, v, g, beta, initial_state):
    B, H, L, dk = q.shape
    dv = v.shape[-1]
    S = np.zeros((B, H, dk, dv)) if initial_state is None else initial_state
    a = np.exp(g)  # (B, H, L): the decay of each token
    o = np.zeros((B, H, L, dv))
    states = [S]  # S_0, then the state after each token
    for t in range(L):
        S_dec = a[:, :, t, None, None] * S  # R1: (B, H, dk, dv)
        u = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S_dec)  # R2: v_t − S̃ᵀ k_t, (B, H, dv)
        S = S_dec + beta[:, :, t, None, None] * k[:, :, t, :, None] * u[:, :, None, :]  # R3: + β k uᵀ
        o[:, :, t] = np.einsum("bhkv,bhk->bhv", S, q[:, :, t])  # R4: Sᵀ q_t, (B, H, dv)
        states.append(S)
    return o, (q, k, v, g, beta, initial_state, np.stack(states, axis=2))  # states (B, H, L + 1, dk, dv)


def delta_rule_recurrent_backward(d_o, cache):
    q, k, v, g, beta, initial_state, states = cache
    a = np.exp(g)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dg, d_beta = np.zeros(g.shape), np.zeros(beta.shape)
    dS = np.zeros(states.shape[:2] + states.shape[3:])  # the gradient of S_t, carried back: (B, H, dk, dv)
    for t in reversed(range(q.shape[2])):
        a_t, b_t = a[:, :, t, None, None], beta[:, :, t, None]  # (B, H, 1, 1), (B, H, 1)
        q_t, k_t, v_t, do_t = q[:, :, t], k[:, :, t], v[:, :, t], d_o[:, :, t]
        S_prev, S_t = states[:, :, t], states[:, :, t + 1]  # S_{t−1}, S_t
        S_dec = a_t * S_prev  # R1 again
        u = v_t - np.einsum("bhk,bhkv->bhv", k_t, S_dec)  # R2 again
        dS = dS + q_t[..., :, None] * do_t[..., None, :]  # ← R4: o_t = S_tᵀ q_t
        dq[:, :, t] = np.einsum("bhkv,bhv->bhk", S_t, do_t)  # ← R4
        dS_u = np.einsum("bhkv,bhv->bhk", dS, u)  # dS u_t, (B, H, dk)
        d_beta[:, :, t] = np.sum(k_t * dS_u, axis=-1)  # ← R3: k_tᵀ dS u_t
        du = b_t * np.einsum("bhk,bhkv->bhv", k_t, dS)  # ← R3: β_t dSᵀ k_t
        dv[:, :, t] = du  # ← R2
        dk[:, :, t] = b_t * dS_u + np.einsum("bhkv,bhv->bhk", S_dec, du)  # BUG: + for the read (R2)
        dS_dec = dS - k_t[..., :, None] * du[..., None, :]  # ← R3 (identity), R2: the gradient of S̃_t
        dg[:, :, t] = a_t[..., 0, 0] * np.sum(dS_dec * S_prev, axis=(-2, -1))  # ← R1: ∂a/∂g = a
        dS = a_t * dS_dec  # ← R1: the gradient of S_{t−1}
    return dq, dk, dv, dg, d_beta, None if initial_state is None else dS
