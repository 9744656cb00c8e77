# expect: PASS
"""Correct, unusual style: RoPE with the other rotate_half convention ([x2, -x1]) and the sign of the sin term
flipped to match (the same rotation); GQA's repeat by broadcast_to + reshape, its backward a sum over the group."""

import numpy as np


def _neg_half(x):
    d = x.shape[-1] // 2
    return np.concatenate([x[..., d:], -x[..., :d]], axis=-1)  # = -rotate_half(x)


def _angles(L, d, positions, theta):
    pos = np.arange(L, dtype=float) if positions is None else np.asarray(positions, dtype=float)
    freq = theta ** (-(2.0 * np.arange(d // 2)) / d)  # (d/2,)
    ang = np.einsum("...l,f->...lf", pos, freq)  # (..., L, d/2)
    ang = np.tile(ang, 2)  # (..., L, d): the two halves turn together
    return ang[:, None] if ang.ndim == 3 else ang


def rope_forward(x, positions, theta):
    ang = _angles(x.shape[2], x.shape[3], positions, theta)
    return x * np.cos(ang) - _neg_half(x) * np.sin(ang), ang


def rope_backward(d_out, cache):
    ang = cache
    return d_out * np.cos(ang) + _neg_half(d_out) * np.sin(ang)  # the turn by -θ


def repeat_kv_forward(x, n_rep):
    B, Hkv, L, d = x.shape
    out = np.broadcast_to(x[:, :, None], (B, Hkv, n_rep, L, d)).reshape(B, Hkv * n_rep, L, d)
    return out, n_rep


def repeat_kv_backward(d_out, cache):
    n_rep = cache
    B, H, L, d = d_out.shape
    return np.add.reduce(d_out.reshape(B, H // n_rep, n_rep, L, d), axis=2)
