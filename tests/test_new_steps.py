"""Steps added on the data path after it became data: each one works with every kernel, with recompute=True and with
the KV cache without a line written for either (docs/architecture.md counts what each cost).

- softcap: cap · tanh(s / cap) of the scores (Gemma 2), a score change every kernel applies inside its tiles;
- qk_norm: a per-head RMSNorm of Q and K before RoPE (Qwen3), with learned weights q_norm, k_norm (d,).

Each against an independent einsum reference, gradient-checked (central differences, random upstream gradient),
recompute against the default path, decoding against the full causal forward.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_recompute_and_decoding, grad_check, grad_check_self_attention

from mha_numpy import MultiHeadAttention, kernels, masks
from mha_numpy import functional as F

KERNELS = {"vectorized": {}, "naive": {}, "chunked": dict(block_size=2, num_threads=2), "auto": {}}
STEPS = {"softcap": dict(softcap=0.7), "qk_norm": dict(qk_norm=True), "both": dict(softcap=0.7, qk_norm=True)}
B, H, HKV, D, L = 2, 4, 2, 4, 5
E = H * D


def make(step, impl, **kw):
    mha = MultiHeadAttention(E, H, num_kv_heads=HKV, rope_theta=30.0, rng=0,
                             impl=kernels.get_kernel(impl, **KERNELS[impl]), **STEPS[step], **kw)  # fmt: skip
    rng = np.random.default_rng(1)
    for name, p in mha.params.items():  # nonzero biases, norm weights away from 1
        p[...] = rng.normal(1.0 if name.endswith("_norm") else 0.0, 0.5, p.shape) if p.ndim == 1 else p
    return mha


def reference(mha, x, mask):
    """The module written out with einsum, one formula per step (Qwen3's and Gemma 2's order)."""
    P, Hkv, d = mha.params, mha.num_kv_heads, mha.head_dim
    q, k, v = (x @ P[f"W_{n}"].T + P[f"b_{n}"] for n in "qkv")
    Q = q.reshape(B, -1, H, d).transpose(0, 2, 1, 3)  # (B, H, L, d)
    K, V = (a.reshape(B, -1, Hkv, d).transpose(0, 2, 1, 3) for a in (k, v))  # (B, Hkv, L, d)
    if mha.qk_norm:
        rms = lambda a, w: a / np.sqrt((a * a).mean(-1, keepdims=True) + mha.qk_norm_eps) * w  # noqa: E731
        Q, K = rms(Q, P["q_norm"]), rms(K, P["k_norm"])
    Q, K = F.rope_forward(Q, None, 30.0)[0], F.rope_forward(K, None, 30.0)[0]
    K, V = np.repeat(K, H // Hkv, axis=1), np.repeat(V, H // Hkv, axis=1)  # (B, H, L, d)
    s = np.einsum("bhid,bhjd->bhij", Q, K) / np.sqrt(d)
    if mha.softcap is not None:
        s = mha.softcap * np.tanh(s / mha.softcap)
    s = np.where(mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    ctx = np.einsum("bhij,bhjd->bhid", w, V).transpose(0, 2, 1, 3).reshape(B, -1, E)
    return ctx @ P["W_o"].T + P["b_o"], w


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("step", list(STEPS))
def test_forward_matches_the_reference_and_every_gradient_checks(step, impl, rng):
    mha = make(step, impl)
    x = 3 * rng.standard_normal((B, L, E))  # large enough that the cap flattens some scores
    mask = masks.causal_mask(L)
    out, cache = mha.forward(x, x, x, mask=mask)
    ref_out, ref_w = reference(mha, x, mask)
    assert np.abs(out - ref_out).max() <= 1e-12 * np.abs(ref_out).max()
    assert np.abs(cache.attn_weights - ref_w).max() <= 1e-13
    grad_check_self_attention(mha, x, mask)


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("step", list(STEPS))
def test_recompute_and_decoding_need_no_line_of_their_own(step, impl, rng):
    default, lean = make(step, impl), make(step, impl, recompute=True)
    x = 3 * rng.standard_normal((B, L, E))
    check_recompute_and_decoding(default, lean, x, rng)


def test_the_pairs_on_their_own(rng):
    s = 3 * rng.standard_normal((1, 2, 3, 4))  # a few entries: the difference quotient of their sum stays exact
    capped, cache = F.soft_cap_forward(s, 2.0)
    assert np.abs(capped).max() < 2.0 and np.allclose(F.soft_cap_forward(s * 1e-6, 2.0)[0], s * 1e-6)
    grad_check(lambda s: F.soft_cap_forward(s, 2.0), lambda d, c: (F.soft_cap_backward(d, c),), dict(s=s), ["s"])
    x, w = rng.standard_normal((2, 3, 4, 5)), rng.normal(1, 0.3, 5)
    grad_check(lambda x, w: F.rms_norm_forward(x, w, 1e-6), F.rms_norm_backward, dict(x=x, w=w), ["x", "w"])
    with pytest.raises(ValueError, match="softcap must be a positive finite number"):
        MultiHeadAttention(8, 2, softcap=0.0)
    with pytest.raises(ValueError, match="qk_norm_eps"):
        MultiHeadAttention(8, 2, qk_norm=True, qk_norm_eps=-1.0)
