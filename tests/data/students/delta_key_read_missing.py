"""A student's delta rule backward whose key gradient forgets the read of R2."""

# expect: delta_rule_recurrent_backward delta_key_read_missing
import numpy as np


def delta_rule_recurrent_forward(q, k, v, g, beta, initial_state):
    B, H, L, dk = q.shape
    S = np.zeros((B, H, dk, v.shape[-1])) if initial_state is None else initial_state
    o, states = np.zeros(v.shape), [S]
    for t in range(L):
        S_dec = np.exp(g[:, :, t, None, None]) * S
        u = v[:, :, t] - np.einsum("bhk,bhkv->bhv", k[:, :, t], S_dec)
        S = S_dec + beta[:, :, t, None, None] * k[:, :, t, :, None] * u[:, :, None, :]
        o[:, :, t] = np.einsum("bhkv,bhk->bhv", S, q[:, :, t])
        states.append(S)
    return o, (q, k, v, g, beta, initial_state, np.stack(states, axis=2))


def delta_rule_recurrent_backward(d_o, cache):
    q, k, v, g, beta, initial_state, states = cache
    B, H, L, _ = q.shape
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dg, db = np.zeros(g.shape), np.zeros(beta.shape)
    dS0 = np.zeros(states[:, :, 0].shape)
    for b in range(B):
        for h in range(H):  # one head at a time: 2-D arrays
            dS = np.zeros(states.shape[3:])
            for t in range(L - 1, -1, -1):
                a = np.exp(g[b, h, t])
                S_prev = states[b, h, t]
                S_dec = a * S_prev
                u = v[b, h, t] - S_dec.T @ k[b, h, t]
                dS = dS + np.outer(q[b, h, t], d_o[b, h, t])
                dq[b, h, t] = states[b, h, t + 1] @ d_o[b, h, t]
                db[b, h, t] = k[b, h, t] @ dS @ u
                du = beta[b, h, t] * (dS.T @ k[b, h, t])
                dv[b, h, t] = du
                dk[b, h, t] = beta[b, h, t] * (dS @ u)  # BUG: k_t also reads the memory in u_t
                dS_dec = dS - np.outer(k[b, h, t], du)
                dg[b, h, t] = a * np.sum(dS_dec * S_prev)
                dS = a * dS_dec
            dS0[b, h] = dS
    return dq, dk, dv, dg, db, None if initial_state is None else dS0
