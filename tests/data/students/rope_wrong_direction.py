"""A student's RoPE whose rotate_half is [x2, -x1]: the turn by -θ (its backward is right for it)."""

# expect: rope_forward rope_wrong_direction
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
    half = np.concatenate([x[..., d // 2 :], -x[..., : d // 2]], axis=-1)  # rotate_half: [x1, x2] -> [-x2, x1]
    return x * cos + half * sin, (cos, sin)
