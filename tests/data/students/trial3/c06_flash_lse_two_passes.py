# expect: PASS
"""Correct, unusual style: FlashAttention whose forward keeps the log-sum-exp per row (lse = m + log ℓ, -inf for a
row with no key allowed) and whose backward runs two passes over the key tiles: first D = Σ_j P_j dP_j from the
tiles themselves, then the gradients; query rows processed all at once, key tiles one by one."""

import numpy as np


def _tile(q, k, mask, j0, j1, scale):
    s = np.matmul(q, np.swapaxes(k[:, :, j0:j1], -1, -2)) * scale  # (B, H, Lq, bk)
    if mask is not None:
        s = np.where(mask[..., j0:j1], s, -np.inf)
    return s


def flash_attention_forward(q, k, v, mask, block):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    scale = 1 / np.sqrt(d)
    if mask is not None:
        mask = np.broadcast_to(mask, (B, H, Lq, Lk))
    run_max = np.full((B, H, Lq, 1), -np.inf)
    run_sum = np.zeros((B, H, Lq, 1))
    num = np.zeros((B, H, Lq, v.shape[-1]))
    for j0 in range(0, Lk, block):
        j1 = min(j0 + block, Lk)
        s = _tile(q, k, mask, j0, j1, scale)
        new_max = np.maximum(run_max, np.max(s, axis=-1, keepdims=True))
        safe = np.where(new_max == -np.inf, 0.0, new_max)
        corr = np.exp(run_max - safe)
        w = np.exp(s - safe)
        run_sum = corr * run_sum + np.sum(w, axis=-1, keepdims=True)
        num = corr * num + np.matmul(w, v[:, :, j0:j1])
        run_max = new_max
    alive = run_sum > 0
    with np.errstate(divide="ignore"):
        lse = np.where(alive, np.where(alive, run_max, 0.0) + np.log(np.where(alive, run_sum, 1.0)), -np.inf)
    o = np.where(alive, num / np.where(alive, run_sum, 1.0), 0.0)
    return o, (q, k, v, mask, lse, block)


def flash_attention_backward(d_o, cache):
    q, k, v, mask, lse, block = cache
    scale = 1 / np.sqrt(q.shape[-1])
    Lk = k.shape[2]
    safe_lse = np.where(np.isneginf(lse), np.inf, lse)  # exp(s - inf) = 0: a dead row has weights 0

    def weights(j0, j1):
        return np.exp(_tile(q, k, mask, j0, j1, scale) - safe_lse)

    D = np.zeros(lse.shape)
    for j0 in range(0, Lk, block):  # pass 1: the row term
        j1 = min(j0 + block, Lk)
        D += np.sum(weights(j0, j1) * np.matmul(d_o, np.swapaxes(v[:, :, j0:j1], -1, -2)), axis=-1, keepdims=True)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for j0 in range(0, Lk, block):  # pass 2: the gradients
        j1 = min(j0 + block, Lk)
        P = weights(j0, j1)
        dP = np.matmul(d_o, np.swapaxes(v[:, :, j0:j1], -1, -2))
        dS = P * (dP - D) * scale
        dv[:, :, j0:j1] = np.matmul(np.swapaxes(P, -1, -2), d_o)
        dk[:, :, j0:j1] = np.matmul(np.swapaxes(dS, -1, -2), q)
        dq += np.matmul(dS, k[:, :, j0:j1])
    return dq, dk, dv
