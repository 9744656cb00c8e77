# expect: FAIL
# where: flash_attention_backward k
# name: relation factor √d
"""Near flash_no_scale: dq keeps the scale, dk forgets it (written on a later line), so dk alone is √d times
too large."""

import numpy as np


def flash_attention_forward(q, k, v, mask, block):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    scale = d**-0.5
    full = None if mask is None else np.broadcast_to(mask, (B, H, Lq, Lk))
    m = np.full((B, H, Lq, 1), -np.inf)
    l = np.zeros((B, H, Lq, 1))  # noqa: E741
    acc = np.zeros((B, H, Lq, v.shape[-1]))
    for j0 in range(0, Lk, block):
        sl = slice(j0, j0 + block)
        s = scale * q @ np.swapaxes(k[:, :, sl], -1, -2)
        if full is not None:
            s = np.where(full[..., sl], s, -np.inf)
        m2 = np.maximum(m, s.max(-1, keepdims=True))
        sh = np.where(np.isinf(m2), 0.0, m2)
        r = np.exp(m - sh)
        e = np.exp(s - sh)
        l = r * l + e.sum(-1, keepdims=True)  # noqa: E741
        acc = r * acc + e @ v[:, :, sl]
        m = m2
    inv = np.where(l > 0, 1.0 / np.maximum(l, 1e-300), 0.0)
    o = acc * inv
    return o, (q, k, v, full, o, np.where(np.isinf(m), 0.0, m), inv, block)


def flash_attention_backward(d_o, cache):
    q, k, v, full, o, m, inv, block = cache
    scale = q.shape[-1] ** -0.5
    D = np.sum(d_o * o, axis=-1, keepdims=True)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for j0 in range(0, k.shape[2], block):
        sl = slice(j0, j0 + block)
        s = scale * q @ np.swapaxes(k[:, :, sl], -1, -2)
        if full is not None:
            s = np.where(full[..., sl], s, -np.inf)
        p = np.exp(s - m) * inv
        dv[:, :, sl] = np.swapaxes(p, -1, -2) @ d_o
        ds = p * (d_o @ np.swapaxes(v[:, :, sl], -1, -2) - D)
        dq += scale * ds @ k[:, :, sl]
        dk[:, :, sl] = np.swapaxes(ds, -1, -2) @ q  # BUG: no scale here
    return dq, dk, dv
