"""A student's RoPE backward that turns each pair (i, i + d/2) back by the right angle but writes the two halves of
the result in the wrong order (the forward is right)."""

# relation: rope_backward dx (in rope_backward) has the right indices of axis 3 in another order
import numpy as np


def _cos_sin(shape, positions, theta):
    B, H, L, d = shape
    pos = np.arange(L) if positions is None else np.asarray(positions)
    angles = pos[..., None] / theta ** (np.arange(0, d, 2) / d)  # (..., L, d/2)
    angles = angles if angles.ndim == 2 else angles[:, None]  # (L, d/2) or (B, 1, L, d/2)
    return np.cos(angles), np.sin(angles)


def rope_forward(x, positions, theta):
    c, s = _cos_sin(x.shape, positions, theta)
    x1, x2 = np.split(x, 2, axis=-1)  # the pairs (i, i + d/2)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1), (c, s)


def rope_backward(d_out, cache):
    c, s = cache
    d1, d2 = np.split(d_out, 2, axis=-1)
    return np.concatenate([d2 * c - d1 * s, d1 * c + d2 * s], axis=-1)  # the turn back, its halves written swapped
