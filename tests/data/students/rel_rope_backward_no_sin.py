"""A student's RoPE backward that keeps the cos term and drops the sin term ("the rotation is orthogonal, its
derivative is cos")."""

# relation: rope_backward dx (in rope_backward) lacks the contribution of the sin term
import numpy as np


def rope_forward(x, positions, theta):
    B, H, L, d = x.shape
    pos = np.arange(L) if positions is None else np.asarray(positions)  # (L,) or (B, L)
    angles = np.tile(pos[..., None] / theta ** (np.arange(0, d, 2) / d), 2)  # (..., L, d)
    if angles.ndim == 3:
        angles = angles[:, None]  # (B, 1, L, d)
    x1, x2 = np.split(x, 2, axis=-1)
    return x * np.cos(angles) + np.concatenate([-x2, x1], axis=-1) * np.sin(angles), (np.cos(angles), np.sin(angles))


def rope_backward(d_out, cache):
    cos, sin = cache
    return d_out * cos
