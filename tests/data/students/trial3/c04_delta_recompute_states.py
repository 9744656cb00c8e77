# expect: PASS
"""Correct, unusual style: the delta rule's forward caches only its inputs, and the backward first replays the
recurrence to rebuild every state (memory traded for compute), then goes back through time with explicit loops
over batch and head."""

import numpy as np


def _replay(k, v, g, beta, S0):
    B, H, L, dk = k.shape
    S = np.zeros((B, H, dk, v.shape[-1])) if S0 is None else np.array(S0, dtype=float)
    out = [S]
    for t in range(L):
        a = np.exp(g[:, :, t])[:, :, None, None]
        Sd = a * S
        pred = np.einsum("bhkv,bhk->bhv", Sd, k[:, :, t])
        u = v[:, :, t] - pred
        S = Sd + beta[:, :, t][:, :, None, None] * np.einsum("bhk,bhv->bhkv", k[:, :, t], u)
        out.append(S)
    return out


def delta_rule_recurrent_forward(q, k, v, g, beta, initial_state):
    states = _replay(k, v, g, beta, initial_state)
    o = np.stack([np.einsum("bhkv,bhk->bhv", states[t + 1], q[:, :, t]) for t in range(q.shape[2])], axis=2)
    return o, (q, k, v, g, beta, initial_state)


def delta_rule_recurrent_backward(d_o, cache):
    q, k, v, g, beta, S0 = cache
    states = _replay(k, v, g, beta, S0)
    B, H, L, _ = q.shape
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dg, dbeta = np.zeros_like(g), np.zeros_like(beta)
    dS = np.zeros_like(states[0])
    for t in range(L - 1, -1, -1):
        for b in range(B):
            for h in range(H):
                a = np.exp(g[b, h, t])
                Sp, St = states[t][b, h], states[t + 1][b, h]
                kt, qt, vt, bt = k[b, h, t], q[b, h, t], v[b, h, t], beta[b, h, t]
                Sd = a * Sp
                u = vt - Sd.T @ kt
                G = dS[b, h] + np.outer(qt, d_o[b, h, t])
                dq[b, h, t] = St @ d_o[b, h, t]
                Gu = G @ u
                dbeta[b, h, t] = kt @ Gu
                du = bt * (G.T @ kt)
                dv[b, h, t] = du
                dk[b, h, t] = bt * Gu - Sd @ du
                G_dec = G - np.outer(kt, du)
                dg[b, h, t] = a * np.sum(G_dec * Sp)
                dS[b, h] = a * G_dec
    return dq, dk, dv, dg, dbeta, (None if S0 is None else dS)
