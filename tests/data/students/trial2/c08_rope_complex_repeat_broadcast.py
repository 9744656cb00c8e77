# expect: PASS
"""Correct, unusual style: RoPE as a complex multiplication (features i and i + d/2 as one complex number), its
backward the conjugate turn; repeat_kv by np.broadcast_to, its backward np.add.reduce over the copies."""

import numpy as np


def rope_forward(x, positions, theta):
    _, _, L, d = x.shape
    half = d // 2
    pos = np.arange(L)[None, :] if positions is None else np.asarray(positions)  # (1 or B, L)
    freq = theta ** (-2.0 * np.arange(half) / d)  # (d/2,)
    turn = np.exp(1j * pos[:, None, :, None] * freq)  # (1 or B, 1, L, d/2)
    z = (x[..., :half] + 1j * x[..., half:]) * turn
    return np.concatenate([z.real, z.imag], axis=-1), turn


def rope_backward(d_out, cache):
    turn = cache
    half = d_out.shape[-1] // 2
    g = (d_out[..., :half] + 1j * d_out[..., half:]) * np.conj(turn)  # a rotation's transpose: the turn back
    return np.concatenate([g.real, g.imag], axis=-1)


def repeat_kv_forward(x, n_rep):
    B, Hkv, L, d = x.shape
    copies = np.broadcast_to(x[:, :, None], (B, Hkv, n_rep, L, d))
    return copies.reshape(B, Hkv * n_rep, L, d), n_rep


def repeat_kv_backward(d_out, cache):
    n_rep = cache
    B, H, L, d = d_out.shape
    return np.add.reduce(d_out.reshape(B, H // n_rep, n_rep, L, d), axis=2)
