"""A torch FlexAttention call, a soft-cap with a learned cap per head under a causal mask, and "your kernel's"
backward, for ``mha_numpy verify --flex`` (docs/flex.md, "Checking your own FlexAttention kernel"):

    python -m mha_numpy verify --flex examples/verify/flex_soft_cap.py:soft_cap --mask-mod causal \\
        --numpy-twin soft_cap_np --params PARAMS --backward backward                      # every case PASS
    ... --backward backward_without_tanh_prime                                           # FAIL: dq named first

A NAME alone (``causal``) is looked up in the target's module. The backward here is dense NumPy written by hand
(a GPU kernel's would be called the same way): it gets float64 q (B, Hq, Lq, d), k, v (B, Hkv, Lk, d), the params
and d_out, and returns (dq, dk, dv, {"cap": d_cap}).
"""

import numpy as np
import torch

PARAMS = {"cap": np.array([1.0, 2.0, 4.0, 8.0])}  # one cap per head: the cases have 4 query heads


def soft_cap(score, b, h, q_idx, kv_idx, *, cap):
    """torch's score_mod; ``cap`` is the captured tensor, given here as a keyword so that both sides read it."""
    return cap[h] * torch.tanh(score / cap[h])


def soft_cap_np(score, b, h, q_idx, kv_idx, *, cap):
    """Its NumPy twin (``torch.tanh`` does not run on NumPy arrays)."""
    return cap[h] * np.tanh(score / cap[h])


def causal(b, h, q_idx, kv_idx):
    """torch's mask_mod: plain operators, so it runs unchanged on NumPy arrays (no twin needed)."""
    return q_idx >= kv_idx


def backward(q, k, v, params, d_out, tanh_prime=True, mask_mod=causal):
    """The soft-capped attention's gradients under ``mask_mod`` (NumPy), by hand: the forward F1-F4 again, then
    ← F4 ... ← F1."""
    B, H, Lq, d = q.shape
    group = H // k.shape[1]
    K, V = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (B, H, Lk, d): query head h reads h // group
    cap = params["cap"][None, :, None, None]  # (1, H, 1, 1)
    s = q @ K.swapaxes(-1, -2) / np.sqrt(d)  # F1: (B, H, Lq, Lk)
    t = np.tanh(s / cap)
    allowed = mask_mod(*np.ix_(*(np.arange(n) for n in s.shape)))  # (b, h, Lq, Lk) bool, broadcastable to s
    z = np.where(allowed, cap * t, -np.inf)  # F2: capped, then masked
    m = z.max(axis=-1, keepdims=True)
    e = np.exp(z - np.where(np.isneginf(m), 0.0, m))
    p = e / np.maximum(e.sum(axis=-1, keepdims=True), np.finfo(float).tiny)  # F3: a row with no key: 0
    dV = p.swapaxes(-1, -2) @ d_out  # ← F4 (out = p V): (B, H, Lk, d)
    dp = d_out @ V.swapaxes(-1, -2)  # ← F4: (B, H, Lq, Lk)
    dz = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # ← F3: the softmax's VJP
    ds = dz * (1.0 - t * t) if tanh_prime else dz  # ← F2: d(cap tanh(s / cap))/ds = 1 - tanh²
    d_cap = (dz * (t - s / cap * (1.0 - t * t))).sum(axis=(0, 2, 3))  # ← F2: d/dcap, summed per head (H,)
    dq = ds @ K / np.sqrt(d)  # ← F1: (B, H, Lq, d)
    dK = ds.swapaxes(-1, -2) @ q / np.sqrt(d)  # ← F1: (B, H, Lk, d)
    dk = dK.reshape(B, -1, group, *dK.shape[2:]).sum(axis=2)  # (B, Hkv, Lk, d): summed over each group
    dv = dV.reshape(B, -1, group, *dV.shape[2:]).sum(axis=2)
    return dq, dk, dv, {"cap": d_cap}


def backward_without_tanh_prime(q, k, v, params, d_out):
    """The classic mistake: the soft-cap's derivative without its tanh' factor (dq and dk wrong, dv right)."""
    return backward(q, k, v, params, d_out, tanh_prime=False)
