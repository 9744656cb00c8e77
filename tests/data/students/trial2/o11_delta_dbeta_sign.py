# expect: FAIL
# where: delta_rule_recurrent_backward beta
# name: relation sign
"""Outside the catalogue: the write strength's gradient with the sign of an error term (minus k_tᵀ dS u_t)."""

import numpy as np


def delta_rule_recurrent_forward(q, k, v, g, beta, initial_state):
    B, H, L, dk = q.shape
    S = np.zeros((B, H, dk, v.shape[-1])) if initial_state is None else initial_state.copy()
    o = np.zeros((B, H, L, v.shape[-1]))
    states = [S.copy()]
    for t in range(L):
        S = np.exp(g[:, :, t])[..., None, None] * S  # decay
        u = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S)
        S = S + beta[:, :, t, None, None] * np.einsum("bhk,bhv->bhkv", k[:, :, t], u)
        o[:, :, t] = np.einsum("bhkv,bhk->bhv", S, q[:, :, t])
        states.append(S.copy())
    return o, (q, k, v, g, beta, initial_state is not None, np.stack(states, axis=2))


def delta_rule_recurrent_backward(d_o, cache):
    q, k, v, g, beta, given, states = cache
    a = np.exp(g)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dg, d_beta = np.zeros(g.shape), np.zeros(beta.shape)
    dS = np.zeros(states[:, :, 0].shape)
    for t in range(q.shape[2] - 1, -1, -1):
        a_t, b_t = a[:, :, t, None, None], beta[:, :, t, None]
        k_t, do_t = k[:, :, t], d_o[:, :, t]
        S_prev = states[:, :, t]
        S_dec = a_t * S_prev
        u = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k_t, S_dec)
        dS = dS + np.einsum("bhk,bhv->bhkv", q[:, :, t], do_t)
        dq[:, :, t] = np.einsum("bhkv,bhv->bhk", states[:, :, t + 1], do_t)
        dS_u = np.einsum("bhkv,bhv->bhk", dS, u)
        d_beta[:, :, t] = -1.0 * np.sum(k_t * dS_u, axis=-1)  # BUG: + k_tᵀ dS u_t
        du = b_t * np.einsum("bhk,bhkv->bhv", k_t, dS)
        dv[:, :, t] = du
        dk[:, :, t] = b_t * dS_u - np.einsum("bhkv,bhv->bhk", S_dec, du)
        dS_dec = dS - np.einsum("bhk,bhv->bhkv", k_t, du)
        dg[:, :, t] = a_t[..., 0, 0] * np.sum(dS_dec * S_prev, axis=(-2, -1))
        dS = a_t * dS_dec
    return dq, dk, dv, dg, d_beta, dS if given else None
