# expect: FAIL
# where: delta_rule_recurrent_backward q
# name: relation cache
"""Outside the catalogue: the forward updates the state in place (S *= a; S += β k uᵀ) and appends the same array
to its list every step, so every cached state is the final one; the outputs are right (read at each step), the
backward reads the wrong states."""

import numpy as np


def delta_rule_recurrent_forward(q, k, v, g, beta, initial_state):
    B, H, L, dk = q.shape
    S = np.zeros((B, H, dk, v.shape[-1])) if initial_state is None else initial_state.copy()
    out = np.empty((B, H, L, v.shape[-1]))
    hist = [S.copy()]
    for t in range(L):
        S *= np.exp(g[:, :, t])[..., None, None]
        err = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S)
        S += beta[:, :, t, None, None] * np.einsum("bhk,bhv->bhkv", k[:, :, t], err)
        out[:, :, t] = np.einsum("bhkv,bhk->bhv", S, q[:, :, t])
        hist.append(S)  # BUG: the same array every step
    return out, (q, k, v, g, beta, initial_state, hist)


def delta_rule_recurrent_backward(d_o, cache):
    q, k, v, g, beta, S0, hist = cache
    a = np.exp(g)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dg, dbeta = np.zeros_like(g), np.zeros_like(beta)
    dS = np.zeros_like(hist[0])
    for t in range(q.shape[2] - 1, -1, -1):
        at = a[:, :, t, None, None]
        S_prev, S_t = hist[t], hist[t + 1]
        S_dec = at * S_prev
        u = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S_dec)
        dS = dS + np.einsum("bhk,bhv->bhkv", q[:, :, t], d_o[:, :, t])
        dq[:, :, t] = np.einsum("bhkv,bhv->bhk", S_t, d_o[:, :, t])
        dSu = np.einsum("bhkv,bhv->bhk", dS, u)
        dbeta[:, :, t] = (k[:, :, t] * dSu).sum(-1)
        du = beta[:, :, t, None] * np.einsum("bhk,bhkv->bhv", k[:, :, t], dS)
        dv[:, :, t] = du
        dk[:, :, t] = beta[:, :, t, None] * dSu - np.einsum("bhkv,bhv->bhk", S_dec, du)
        dS_dec = dS - np.einsum("bhk,bhv->bhkv", k[:, :, t], du)
        dg[:, :, t] = a[:, :, t] * (dS_dec * S_prev).sum(axis=(-2, -1))
        dS = at * dS_dec
    return dq, dk, dv, dg, dbeta, (None if S0 is None else dS)
