# expect: FAIL
# where: delta_rule_recurrent_forward
# name: relation mutation
"""Outside the catalogue: the forward starts from S = initial_state (no copy) and updates it in place with *= and +=
"to save memory", so the caller's initial state comes back as the final state; the states it caches are copies,
so every value it returns is right."""

import numpy as np


def delta_rule_recurrent_forward(q, k, v, g, beta, initial_state):
    B, H, L, dk = q.shape
    S = np.zeros((B, H, dk, v.shape[-1])) if initial_state is None else initial_state  # BUG: no copy
    outs, states = [], [S.copy()]
    for t in range(L):
        S *= np.exp(g[:, :, t])[:, :, None, None]
        u = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S)
        S += beta[:, :, t][:, :, None, None] * k[:, :, t][..., None] * u[..., None, :]
        outs.append(np.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
        states.append(S.copy())
    return np.stack(outs, axis=2), (q, k, v, g, beta, initial_state is not None, np.stack(states, axis=2))


def delta_rule_recurrent_backward(d_o, cache):
    q, k, v, g, beta, has_s0, states = cache
    a = np.exp(g)
    dq, dk, dv, dg, dbeta = (np.zeros_like(t) for t in (q, k, v, g, beta))
    dS = np.zeros_like(states[:, :, 0])
    for t in reversed(range(q.shape[2])):
        at = a[:, :, t][..., None, None]
        S_prev = states[:, :, t]
        S_dec = at * S_prev
        u = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S_dec)
        dS = dS + q[:, :, t][..., None] * d_o[:, :, t][..., None, :]
        dq[:, :, t] = np.einsum("bhkv,bhv->bhk", states[:, :, t + 1], d_o[:, :, t])
        dSu = np.einsum("bhkv,bhv->bhk", dS, u)
        dbeta[:, :, t] = np.einsum("bhk,bhk->bh", k[:, :, t], dSu)
        du = beta[:, :, t][..., None] * np.einsum("bhk,bhkv->bhv", k[:, :, t], dS)
        dv[:, :, t] = du
        dk[:, :, t] = beta[:, :, t][..., None] * dSu - np.einsum("bhkv,bhv->bhk", S_dec, du)
        dS_dec = dS - k[:, :, t][..., None] * du[..., None, :]
        dg[:, :, t] = a[:, :, t] * np.einsum("bhkv,bhkv->bh", dS_dec, S_prev)
        dS = at * dS_dec
    return dq, dk, dv, dg, dbeta, (dS if has_s0 else None)
