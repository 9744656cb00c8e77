# expect: FAIL
# where: rope_forward out
# name: relation first-row
"""Outside the catalogue: the rotation loop starts at the second row ("position 0 turns by 0 anyway"), which is true
only when the first row is at position 0: with positions given (a KV cache's offset) it is not."""

import numpy as np


def rope_forward(x, positions, theta):
    B, H, L, d = x.shape
    pos = np.broadcast_to(np.arange(L) if positions is None else np.asarray(positions), (B, L))
    inv_freq = theta ** (-np.arange(0, d, 2) / d)  # (d/2,)
    out = x.copy()
    for t in range(1, L):  # BUG: range(L)
        ang = pos[:, t, None] * inv_freq  # (B, d/2)
        cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]  # (B, 1, d/2)
        x1, x2 = x[:, :, t, : d // 2], x[:, :, t, d // 2 :]
        out[:, :, t] = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out, (pos, inv_freq)


def rope_backward(d_out, cache):
    pos, inv_freq = cache
    d = d_out.shape[-1]
    ang = pos[:, None, :, None] * inv_freq  # (B, 1, L, d/2)
    cos, sin = np.cos(ang), np.sin(ang)
    g1, g2 = d_out[..., : d // 2], d_out[..., d // 2 :]
    return np.concatenate([g1 * cos + g2 * sin, g2 * cos - g1 * sin], axis=-1)
