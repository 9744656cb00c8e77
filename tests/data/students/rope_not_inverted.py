"""A student's RoPE backward that applies the forward's rotation again."""

# expect: rope_backward rope_not_inverted
import numpy as np


def rope_forward(x, positions, theta):
    B, H, L, d = x.shape
    pos = np.arange(L) if positions is None else np.asarray(positions)  # (L,) or (B, L)
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)  # (d/2,)
    angles = pos[..., None] * inv_freq  # (..., L, d/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (..., L, d): feature i and i + d/2 turn together
    if angles.ndim == 3:
        angles = angles[:, None]  # (B, 1, L, d): one rotation per sequence, shared by the heads
    cos, sin = np.cos(angles), np.sin(angles)
    half = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)  # rotate_half: [x1, x2] -> [-x2, x1]
    return x * cos + half * sin, (cos, sin)


def rope_backward(d_out, cache):
    cos, sin = cache
    d = d_out.shape[-1]
    half = np.concatenate([-d_out[..., d // 2 :], d_out[..., : d // 2]], axis=-1)  # rotate_half(d_out)
    return d_out * cos + half * sin
