# expect: FAIL
# where: rope_backward x
# name: relation last-row
"""Outside the catalogue: the backward turns each position back in a loop that stops one position early."""

import numpy as np


def _rotate_half(t):
    d = t.shape[-1] // 2
    return np.concatenate([-t[..., d:], t[..., :d]], axis=-1)


def rope_forward(x, positions, theta):
    L, d = x.shape[-2:]
    pos = np.arange(L) if positions is None else np.asarray(positions)
    ang = pos[..., None] / theta ** (np.arange(0, d, 2) / d)  # (..., L, d/2)
    ang = np.concatenate([ang, ang], axis=-1)
    if ang.ndim == 3:
        ang = ang[:, None]  # (B, 1, L, d)
    cos, sin = np.cos(ang), np.sin(ang)
    return x * cos + _rotate_half(x) * sin, (cos, sin, x.shape)


def rope_backward(d_out, cache):
    cos, sin, shape = cache
    cos, sin = np.broadcast_to(cos, shape), np.broadcast_to(sin, shape)
    dx = np.zeros(shape)
    for t in range(shape[-2] - 1):  # BUG: range(L)
        g = d_out[..., t, :]
        dx[..., t, :] = g * cos[..., t, :] - _rotate_half(g) * sin[..., t, :]
    return dx
