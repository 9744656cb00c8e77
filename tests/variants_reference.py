"""An independent reference for today's attention variants, for the tests: one batch element and one head at a
time, RoPE as complex multiplication, GQA by indexing the key/value head h // (H / Hkv). Shares no code with
mha_numpy."""

from __future__ import annotations

import numpy as np


def rope_complex(x, positions, theta):
    """x (..., L, d), positions (L,): pair (i, i + d/2) as a complex number times e^{i·p·theta^(-2i/d)}."""
    d = x.shape[-1]
    half = d // 2
    z = x[..., :half] + 1j * x[..., half:]
    angle = np.asarray(positions, dtype=np.float64)[:, None] * theta ** (-2.0 * np.arange(half) / d)  # (L, d/2)
    w = z * np.exp(1j * angle)
    return np.concatenate([w.real, w.imag], axis=-1)


def slopes(H):
    """ALiBi slopes, written from the paper's reference code."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(np.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if np.log2(H).is_integer():
        return np.array(power_of_2(H))
    closest = 2 ** int(np.floor(np.log2(H)))
    return np.array(power_of_2(closest) + power_of_2(2 * closest)[0::2][: H - closest])


def reference_mha(params, query, key, value, H, Hkv=None, theta=None, q_pos=None, k_pos=None, keep=None, alibi=False):
    """Output (B, Lq, E) and weights (B, H, Lq, Lk) of (grouped-query, rotary, ALiBi) attention.

    q_pos (B, Lq) / k_pos (B, Lk): positions for RoPE and ALiBi (default 0.., and for ALiBi the queries at
    the last Lq of the Lk positions); keep: bool (B, H, Lq, Lk) True = may attend, or None.
    """
    Hkv = H if Hkv is None else Hkv
    B, Lq, E = query.shape
    Lk = key.shape[1]
    d = E // H
    q_pos = np.broadcast_to(np.arange(Lq) + (Lk - Lq if alibi else 0), (B, Lq)) if q_pos is None else q_pos
    k_pos = np.broadcast_to(np.arange(Lk), (B, Lk)) if k_pos is None else k_pos
    q = np.einsum("bli,oi->blo", query, params["W_q"]) + params.get("b_q", 0)
    k = np.einsum("bli,oi->blo", key, params["W_k"]) + params.get("b_k", 0)
    v = np.einsum("bli,oi->blo", value, params["W_v"]) + params.get("b_v", 0)
    keep = np.ones((B, H, Lq, Lk), bool) if keep is None else np.broadcast_to(keep, (B, H, Lq, Lk))
    ctx = np.zeros((B, Lq, E))
    weights = np.zeros((B, H, Lq, Lk))
    m = slopes(H)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            qh, kh, vh = q[b, :, h * d : (h + 1) * d], k[b, :, g * d : (g + 1) * d], v[b, :, g * d : (g + 1) * d]
            if theta is not None:
                qh, kh = rope_complex(qh, q_pos[b], theta), rope_complex(kh, k_pos[b], theta)
            s = qh @ kh.T / np.sqrt(d)
            if alibi:
                s = s - m[h] * np.abs(q_pos[b][:, None] - k_pos[b][None, :])
            for i in range(Lq):
                allowed = keep[b, h, i]
                if allowed.any():
                    z = np.exp(s[i, allowed] - s[i, allowed].max())
                    weights[b, h, i, allowed] = z / z.sum()
            ctx[b, :, h * d : (h + 1) * d] = weights[b, h] @ vh
    return np.einsum("bli,oi->blo", ctx, params["W_o"]) + params.get("b_o", 0), weights
