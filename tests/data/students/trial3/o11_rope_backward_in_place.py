# expect: FAIL
# where: rope_backward
# name: relation mutation
"""Outside the catalogue: the backward saves a copy by rotating the upstream gradient in place (dx = d_out;
dx *= cos; ...): the value it returns is right, but the caller's d_out is overwritten."""

import numpy as np


def rope_forward(x, positions, theta):
    B, H, L, d = x.shape
    half = d // 2
    pos = np.arange(L) if positions is None else np.asarray(positions)
    freqs = np.power(theta, -np.arange(half) * 2.0 / d)
    ang = pos[..., :, None] * freqs  # (..., L, d/2)
    cos = np.cos(np.concatenate([ang, ang], -1))
    sin = np.sin(np.concatenate([ang, ang], -1))
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    rot = np.concatenate([-x2, x1], -1)
    return x * cos + rot * sin, (cos, sin)


def rope_backward(d_out, cache):
    cos, sin = cache
    half = d_out.shape[-1] // 2
    turned = np.concatenate([-d_out[..., half:], d_out[..., :half]], -1)  # rotate_half(d_out), a new array
    dx = d_out
    dx *= cos  # BUG: writes into the caller's d_out
    dx -= turned * sin
    return dx
