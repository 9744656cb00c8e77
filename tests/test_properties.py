"""hypothesis sweeps random shapes and masks: weights sum to 1 on rows with an allowed key, blocked
positions are exactly 0, and the forward matches a per-head loop written here, independently."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha_numpy import MultiHeadAttention


def per_head_loop(params, query, key, value, keep, H):
    """One head and one batch element at a time, with einsum: no shared code with mha_numpy."""
    B, Lq, E = query.shape
    d = E // H
    q = np.einsum("bli,oi->blo", query, params["W_q"]) + params.get("b_q", 0)
    k = np.einsum("bli,oi->blo", key, params["W_k"]) + params.get("b_k", 0)
    v = np.einsum("bli,oi->blo", value, params["W_v"]) + params.get("b_v", 0)
    ctx = np.zeros((B, Lq, E))
    weights = np.zeros((B, H, Lq, key.shape[1]))
    for b in range(B):
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            s = np.einsum("id,jd->ij", q[b, :, sl], k[b, :, sl]) / np.sqrt(d)
            allowed = keep[b, h]
            for i in range(Lq):
                if allowed[i].any():
                    z = np.exp(s[i, allowed[i]] - s[i, allowed[i]].max())
                    weights[b, h, i, allowed[i]] = z / z.sum()
            ctx[b, :, sl] = weights[b, h] @ v[b, :, sl]
    return np.einsum("bli,oi->blo", ctx, params["W_o"]) + params.get("b_o", 0), weights


@st.composite
def configs(draw):
    H = draw(st.integers(1, 3))
    d = draw(st.integers(1, 4))
    B, Lq, Lk = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    kdim, vdim = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    bias = draw(st.booleans())
    mask_shape = draw(st.sampled_from([None, (Lq, Lk), (B, 1, 1, Lk), (B, H, Lq, Lk), (1, H, 1, Lk)]))
    seed = draw(st.integers(0, 2**31 - 1))
    return H, d, B, Lq, Lk, kdim, vdim, bias, mask_shape, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_shapes_and_masks(cfg):
    H, d, B, Lq, Lk, kdim, vdim, bias, mask_shape, seed = cfg
    rng = np.random.default_rng(seed)
    mha = MultiHeadAttention(H * d, H, bias=bias, kdim=kdim, vdim=vdim, rng=rng)
    for n, p in mha.params.items():
        if n.startswith("b_"):
            p[...] = rng.normal(size=p.shape)
    query = rng.standard_normal((B, Lq, H * d))
    key, value = rng.standard_normal((B, Lk, kdim)), rng.standard_normal((B, Lk, vdim))
    mask = None if mask_shape is None else rng.random(mask_shape) < 0.6  # rows may be fully masked
    keep = np.broadcast_to(True if mask is None else mask, (B, H, Lq, Lk))

    out, cache = mha.forward(query, key, value, mask=mask)
    w = cache.attn_weights
    assert out.shape == (B, Lq, H * d) and w.shape == (B, H, Lq, Lk)
    assert np.all(w[~keep] == 0.0)  # blocked: exactly zero
    rows_with_key = keep.any(-1)
    np.testing.assert_allclose(w.sum(-1)[rows_with_key], 1.0, rtol=1e-12)
    assert np.all(w.sum(-1)[~rows_with_key] == 0.0)  # fully masked rows: all zero, no NaN
    ref_out, ref_w = per_head_loop(mha.params, query, key, value, keep, H)
    np.testing.assert_allclose(w, ref_w, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    grads = mha.backward(rng.standard_normal(out.shape), cache)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
