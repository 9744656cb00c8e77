"""Differential attention (``diff_attention=True``, Hugging Face DiffLlama): query heads p and p + H/2 make a pair
whose two softmax maps read the same 2d-wide values and are subtracted with a learned λ, then normalised.

- against an einsum reference written from the paper's formula, one pair at a time, on every kernel (float64 and
  float32), with GQA, RoPE, padding and causal masks, a fully masked row, batch > 1 and Lq != Lk;
- every gradient, the four λ vectors included, against central differences with a random upstream gradient;
- against transformers' ``DiffLlamaAttention`` (tiny random configs built here, eager attention) and its
  ``DynamicCache``: outputs, the maps it returns and every gradient, to 1e-10 in float64 and 1e-5 in float32;
- with each other optional step (ALiBi, relative bias, QK-norm, soft-cap, appended keys, head_dim and scale);
- decoding token by token equal to the full causal forward; recompute=True, dropout > 0 and an odd num_kv_heads
  refused naming both options; the pairs on their own;
- what the subtraction does to a map: the common-mode noise two maps share cancels (docs/derivation.md § 24).

Expected numbers come from the reference, finite differences or transformers; decoding is compared with the
module's own full causal forward.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers import grad_check, grad_check_self_attention, require_torch
from reference import attention

from mha_numpy import KVCache, MultiHeadAttention, interop, kernels, masks
from mha_numpy import functional as F

KERNELS = {"vectorized": {}, "naive": {}, "chunked": dict(block_size=2, num_threads=2), "auto": {}}
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def make(H=4, Hkv=2, d=4, impl="vectorized", dtype=np.float64, seed=0, **options):
    """A differential module with nonzero biases and λ vectors large enough to move λ well away from λ_init."""
    mha = MultiHeadAttention(H * d, H, num_kv_heads=Hkv, diff_attention=True, diff_layer_idx=3, dtype=dtype, rng=seed,
                             impl=kernels.get_kernel(impl, **KERNELS[impl]), **options)  # fmt: skip
    rng = np.random.default_rng(seed + 1)
    for p in mha.params.values():
        if p.ndim == 1:
            p[...] = rng.normal(0.0, 0.5, p.shape)
    return mha


def rope_by_hand(x, positions, theta):
    """(..., L, d) turned pair by pair (features i and i + d/2) by positions · theta^(-2i/d)."""
    d = x.shape[-1]
    angles = np.asarray(positions, np.float64)[:, None] * theta ** (-np.arange(0, d, 2) / d)  # (L, d/2)
    c, s = np.cos(angles), np.sin(angles)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


def reference(mha, query, key, value, mask):
    """The module from the paper's formula, one pair at a time: (A_p − λ A_{p+H/2}) [V_j, V_{j+Hkv/2}], normalised.

    -> output (B, Lq, E), the H maps (B, H, Lq, Lk), λ. Float64 throughout.
    """
    P = {n: p.astype(np.float64) for n, p in mha.params.items()}
    query, key, value = (a.astype(np.float64) for a in (query, key, value))
    H, Hkv, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    (B, Lq, _), Lk, r = query.shape, key.shape[1], H // Hkv

    def heads(x, W, b, n):
        return (np.einsum("bli,oi->blo", x, P[W]) + P.get(b, 0.0)).reshape(B, -1, n, d).transpose(0, 2, 1, 3)

    Q, K, V = heads(query, "W_q", "b_q", H), heads(key, "W_k", "b_k", Hkv), heads(value, "W_v", "b_v", Hkv)
    if mha.rope_theta is not None:
        Q, K = rope_by_hand(Q, np.arange(Lq), mha.rope_theta), rope_by_hand(K, np.arange(Lk), mha.rope_theta)
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * mha.diff_layer_idx)
    lam = math.exp(P["lambda_q1"] @ P["lambda_k1"]) - math.exp(P["lambda_q2"] @ P["lambda_k2"]) + lam_init
    maps = np.stack([attention(Q[:, [h]], K[:, [h // r]], K[:, [h // r]], mask)[1][:, 0] for h in range(H)], axis=1)
    pairs = []
    for p in range(H // 2):
        j = p // r  # the key/value head of query head p; its partner p + H/2 reads j + Hkv/2
        values = np.concatenate([V[:, j], V[:, j + Hkv // 2]], axis=-1)  # (B, Lk, 2d)
        o = np.einsum("bqk,bkd->bqd", maps[:, p] - lam * maps[:, p + H // 2], values)  # (B, Lq, 2d)
        pairs.append((1 - lam_init) * o / np.sqrt((o * o).mean(-1, keepdims=True) + mha.diff_norm_eps))
    merged = np.concatenate(pairs, axis=-1)  # (B, Lq, H·d): pair p is features 2pd ... 2(p+1)d - 1
    return np.einsum("bli,oi->blo", merged, P["W_o"]) + P.get("b_o", 0.0), maps, lam


def mask_of(kind, B, Lq, Lk):
    """bool (True = may attend): causal, causal + right padding, padding only, one fully masked query."""
    padding = masks.padding_mask([Lk] + [Lk - 2] * (B - 1), Lk)  # (B, 1, 1, Lk)
    causal = masks.causal_mask(Lq, Lk, diagonal=Lk - Lq)
    blocked = np.ones((B, 1, Lq, Lk), bool)
    blocked[-1, 0, 1] = False  # query 1 of the last batch item sees nothing: zero weights, zero pair, b_o alone
    return {"causal": causal, "causal+padding": masks.combine_masks(causal, padding), "padding": padding,
            "fully masked row": masks.combine_masks(padding, blocked)}[kind]  # fmt: skip


CONFIGS = {"gqa 4/2": dict(H=4, Hkv=2), "gqa 8/2": dict(H=8, Hkv=2), "mha 4/4": dict(H=4, Hkv=4),
           "gqa 4/2 + rope": dict(H=4, Hkv=2, rope_theta=30.0),
           "gqa 8/4 + rope": dict(H=8, Hkv=4, rope_theta=50.0)}  # fmt: skip


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", ["causal+padding", "padding", "fully masked row"])
def test_outputs_and_maps_match_the_paper_formula(impl, config, kind):
    rng = np.random.default_rng(7)
    mha = make(impl=impl, **CONFIGS[config])
    B, L, E = 2, 5, mha.embed_dim
    x = 2 * rng.standard_normal((B, L, E))
    out, cache = mha.forward(x, x, x, mask=mask_of(kind, B, L, L))
    ref, maps, lam = reference(mha, x, x, x, mask_of(kind, B, L, L))
    assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()
    assert np.abs(cache.attn_weights - maps).max() <= 1e-14  # the H maps themselves, as DiffLlama returns them
    assert abs(lam - mha.config.diff_lambda_init) > 0.1  # λ's vectors matter in this test
    H = mha.num_heads
    assert cache.context.shape == (B, H // 2, L, 2 * mha.head_dim) and cache.V.shape[-1] == 2 * mha.head_dim


@pytest.mark.parametrize("impl", list(KERNELS))
def test_cross_attention_with_lq_unlike_lk_and_float32(impl):
    """Lq = 3 queries, Lk = 6 keys from another sequence (RoPE at positions 0.. of each), padding; float32 stays
    float32 and is within 1e-5 of the float64 reference, outputs and gradients."""
    rng = np.random.default_rng(3)
    q64, kv64 = rng.standard_normal((2, 3, 16)), rng.standard_normal((2, 6, 16))
    mask = mask_of("padding", 2, 3, 6)
    mha64 = make(impl=impl, rope_theta=20.0)
    out64, cache64 = mha64.forward(q64, kv64, kv64 * 0.5, mask=mask)
    ref = reference(mha64, q64, kv64, kv64 * 0.5, mask)[0]
    assert np.abs(out64 - ref).max() <= 1e-12 * np.abs(ref).max()

    mha32 = make(impl=impl, dtype=np.float32, rope_theta=20.0)
    mha32.params = {n: p.astype(np.float32) for n, p in mha64.params.items()}
    q32, kv32 = q64.astype(np.float32), kv64.astype(np.float32)
    out32, cache32 = mha32.forward(q32, kv32, kv32 * 0.5, mask=mask)
    assert out32.dtype == np.float32 and np.abs(out32 - ref).max() <= 1e-5 * np.abs(ref).max()
    d_out = rng.standard_normal(out64.shape)
    g64, g32 = mha64.backward(d_out, cache64), mha32.backward(d_out.astype(np.float32), cache32)
    for name, g in g64.items():
        assert g32[name].dtype == np.float32, name
        assert np.abs(g32[name] - g).max() <= 1e-5 * np.abs(g).max(), name


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("rope", [None, 10.0])
def test_every_gradient_against_finite_differences(impl, rope):
    """Self-attention with GQA (H = 4, Hkv = 2), causal + padding mask, batch 2: the input and every parameter,
    W_* and b_* and the four λ vectors, element by element against central differences."""
    mha = make(H=4, Hkv=2, d=2, impl=impl, rope_theta=rope)
    x = np.random.default_rng(5).standard_normal((2, 4, 8))
    mask = mask_of("causal+padding", 2, 4, 4)
    report = grad_check_self_attention(mha, x, mask)
    assert all(not report[n].zero_gradient for n in LAMBDAS)  # each λ vector's gradient was really checked


@pytest.mark.parametrize("impl", list(KERNELS))
def test_query_key_and_value_gradients_of_cross_attention(impl):
    mha = make(H=4, Hkv=2, d=2, impl=impl)
    rng = np.random.default_rng(6)
    inputs = dict(query=rng.standard_normal((2, 3, 8)), key=rng.standard_normal((2, 5, 8)),
                  value=rng.standard_normal((2, 5, 8)))  # fmt: skip
    mask = mask_of("padding", 2, 3, 5)

    def forward(query, key, value):
        return mha.forward(query, key, value, mask=mask)

    def backward(d_out, cache):
        grads = mha.backward(d_out, cache)
        return grads["query"], grads["key"], grads["value"]

    grad_check(forward, backward, inputs, ["query", "key", "value"], allow_zero=False)


OTHERS = {"alibi": dict(alibi=True), "rel_bias": dict(rel_pos_max_distance=2), "qk_norm": dict(qk_norm=True),
          "softcap": dict(softcap=1.0), "appended": dict(add_bias_kv=True, add_zero_attn=True),
          "head_dim, scale": dict(head_dim=4, scale=0.4), "sinks": dict(sinks=True)}  # fmt: skip


@pytest.mark.parametrize("impl", ["vectorized", "chunked"])
@pytest.mark.parametrize("other", list(OTHERS))
def test_it_combines_with_the_other_steps(impl, other):
    """With each other optional step (whose models do not ship it with differential attention): every gradient
    against central differences, and decoding equal to the full causal forward where the other step decodes."""
    mha = make(H=4, Hkv=2, d=2, impl=impl, rope_theta=10.0, **OTHERS[other])
    x = np.random.default_rng(9).standard_normal((2, 4, 8))
    mask = mask_of("causal+padding", 2, 4, 4)
    grad_check_self_attention(mha, x, mask)
    if other != "rel_bias":
        full, kv = mha.forward(x, x, x, mask=masks.causal_mask(4))[0], KVCache()
        steps = [mha.forward(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], kv_cache=kv)[0] for t in range(4)]
        assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-12 * np.abs(full).max()


@pytest.mark.parametrize("impl", list(KERNELS))
def test_decoding_token_by_token_equals_the_full_causal_forward(impl):
    mha = make(H=8, Hkv=4, impl=impl, rope_theta=100.0)
    x = np.random.default_rng(8).standard_normal((2, 6, 32))
    full, _ = mha.forward(x, x, x, mask=masks.causal_mask(6))
    kv = KVCache()
    calls = [(0, 2)] + [(t, t + 1) for t in range(2, 6)]  # a prefill of two, then one token a call
    steps = [mha.forward(x[:, a:b], x[:, a:b], x[:, a:b], kv_cache=kv)[0] for a, b in calls]
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-12 * np.abs(full).max()
    assert kv.values.shape == (2, 4, 6, 4)  # the cache keeps d-wide values: the pairing comes after it


def test_refusals_name_both_options():
    with pytest.raises(ValueError, match="diff_attention with recompute=True is not supported: its groups hold"):
        MultiHeadAttention(16, 4, num_kv_heads=2, diff_attention=True, recompute=True)
    with pytest.raises(ValueError, match="diff_attention with dropout=0.1 is not supported"):
        MultiHeadAttention(16, 4, diff_attention=True, dropout=0.1)
    mha = make()
    mha.dropout = 0.2  # changed after construction: the next call's plan refuses it, before any arithmetic
    with pytest.raises(ValueError, match="diff_attention with dropout=0.2"):
        mha.forward(*(np.zeros((1, 2, 16)),) * 3)
    with pytest.raises(ValueError, match="diff_attention needs an even num_kv_heads.*num_kv_heads=1"):
        MultiHeadAttention(16, 4, num_kv_heads=1, diff_attention=True)
    with pytest.raises(ValueError, match="diff_layer_idx must be a non-negative int"):
        MultiHeadAttention(16, 4, diff_attention=True, diff_layer_idx=-1)
    with pytest.raises(ValueError, match="diff_norm_eps"):
        MultiHeadAttention(16, 4, diff_attention=True, diff_norm_eps=0.0)
    plan = [type(s).__name__ for s in make(rope_theta=1.0).steps]
    assert plan == ["Project", "Split", "Rope", "DiffValues", "RepeatKV", "Attend", "DiffCombine", "Merge",
                    "OutProject"]  # fmt: skip
    assert MultiHeadAttention(16, 4, recompute=True, dropout=0.1).steps  # neither refusal without diff_attention


def test_the_pairs_on_their_own(rng):
    v = rng.standard_normal((2, 4, 3, 2))
    out, cache = F.diff_values_forward(v)
    np.testing.assert_array_equal(out[:, 0], np.concatenate([v[:, 0], v[:, 2]], -1))  # heads j, j + Hkv/2
    np.testing.assert_array_equal(out[:, 3], np.concatenate([v[:, 1], v[:, 3]], -1))  # both halves alike
    grad_check(lambda v: F.diff_values_forward(v), F.diff_values_backward, dict(v=v), ["v"], allow_zero=False)
    vectors = {n: rng.normal(0, 0.5, 3) for n in LAMBDAS}
    lam, _ = F.diff_lambda_forward(*vectors.values(), 0.47)
    assert lam == pytest.approx(np.exp(vectors["lambda_q1"] @ vectors["lambda_k1"])
                                - np.exp(vectors["lambda_q2"] @ vectors["lambda_k2"]) + 0.47, rel=1e-15)  # fmt: skip
    grad_check(lambda **kw: F.diff_lambda_forward(*kw.values(), 0.47), F.diff_lambda_backward, vectors, list(LAMBDAS))
    zero = F.diff_lambda_backward(1.0, F.diff_lambda_forward(*np.zeros((4, 3)), 0.47)[1])
    assert all(not g.any() for g in zero)  # a bilinear saddle at 0: why the vectors start from N(0, 0.1²)
    context, lam = rng.standard_normal((2, 4, 3, 4)), np.array(0.6)
    combine = lambda context, lam: F.diff_combine_forward(context, lam, 0.47, 1e-5)  # noqa: E731
    grad_check(combine, F.diff_combine_backward, dict(context=context, lam=lam), ["context", "lam"], allow_zero=False)
    with pytest.raises(ValueError, match="v with shape .*axis 1 must be even"):
        F.diff_values_forward(np.zeros((1, 3, 2, 2)))
    with pytest.raises(ValueError, match="must share one shape"):
        F.diff_lambda_forward(np.zeros(3), np.zeros(3), np.zeros(2), np.zeros(3), 0.2)
    with pytest.raises(ValueError, match="lam has dtype float64, context float32"):
        F.diff_combine_forward(np.zeros((1, 2, 1, 4), np.float32), np.array(0.5), 0.2, 1e-5)
    f32 = F.diff_combine_forward(np.ones((1, 2, 1, 4), np.float32), np.float32(0.5), 0.2, 1e-5)[0]
    assert f32.dtype == np.float32


def test_the_difference_map_cancels_the_noise_two_maps_share():
    """One query, 64 keys; key 0 is the relevant one. Both maps of the pair see the same noise n_j on every key
    (common mode), the first also a signal on key 0: scores s1_j = a n_j + a g [j = 0], s2_j = a n_j. On the
    irrelevant keys A1_j = A2_j Z2/Z1 (Z the maps' normalisers), so the difference map there is
    D_j = A1_j − λ A2_j = A2_j (Z2/Z1 − λ): it vanishes at λ* = Z2/Z1 and stays below a single softmax's A1_j
    for every λ in (0, 2 Z2/Z1). The table printed in docs/derivation.md § 24 is this test's."""
    Lk, a, g, layer = 64, 2.0, 3.0, 2
    noise = np.random.default_rng(0).standard_normal(Lk)
    keys = np.zeros((1, Lk, 4))
    keys[0, :, 0], keys[0, 0, 1] = noise, 1.0  # feature 0: the noise, feature 1: "relevant"
    query = np.zeros((1, 1, 4))
    query[0, 0, 2] = 1.0
    mha = MultiHeadAttention(4, 2, bias=False, diff_attention=True, diff_layer_idx=layer, rng=0)
    P = mha.params
    for p in P.values():
        p[...] = 0.0
    P["W_q"][[0, 1, 2], 2] = np.array([a, a * g, a]) * np.sqrt(2)  # head 0 (first map): [a, a g], head 1: [a, 0]
    P["W_k"][[0, 1, 2, 3], [0, 1, 0, 1]] = 1.0  # both key/value heads read features 0 and 1
    P["W_v"][...], P["W_o"][...] = np.eye(4), np.eye(4)

    s1, s2 = a * noise + a * g * (np.arange(Lk) == 0), a * noise
    A1, A2 = np.exp(s1) / np.exp(s1).sum(), np.exp(s2) / np.exp(s2).sum()
    lam_star = np.exp(s2).sum() / np.exp(s1).sum()
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    rows = []
    for lam in (0.0, 0.2, lam_star, lam_init, 0.8):
        P["lambda_q1"][0], P["lambda_k1"][0] = math.log(1.0 + lam - lam_init), 1.0  # e1 - e2 = lam - λ_init
        maps = mha.forward(query, keys, keys)[1].attn_weights[0, :, 0]  # (2, Lk): the pair's two maps
        D = maps[0] - lam * maps[1]
        assert np.abs(D - (A1 - lam * A2)).max() <= 1e-14  # the module's maps are these softmaxes
        assert np.abs(D[1:] - A2[1:] * (lam_star - lam)).max() <= 1e-14  # the closed form on the noise keys
        rows.append((lam, np.abs(D[1:]).sum() / np.abs(D).sum()))
    single = rows[0][1]  # λ = 0: the difference map is the single softmax A1
    assert single == pytest.approx(1 - A1[0], rel=1e-12) and single > 0.3
    assert rows[2][1] <= 1e-14  # exact cancellation at λ*
    assert rows[1][1] < single and rows[3][1] < single  # λ = 0.2 and λ_init(2) lie within (0, 2 λ*)
    assert rows[4][1] > single  # over-subtraction: λ = 0.8 > 2 λ* leaves negative weights larger than the noise
    doc = (Path(__file__).parents[1] / "docs" / "derivation.md").read_text()
    for lam, share in rows:
        assert f"| {lam:.3f} | {share:.1%} |" in doc, (lam, share)  # the docs show what this test measures


# --------------------------------------------------------------------------- transformers DiffLlamaAttention


@pytest.fixture
def transformers():
    torch = require_torch()
    torch.set_num_threads(1)
    return pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -r requirements-dev.txt"
    )


HF = {"4/2 bias": dict(num_heads=4, num_kv_heads=2, bias=True), "8/2": dict(num_heads=8, num_kv_heads=2),
      "4/4 bias": dict(num_heads=4, num_kv_heads=4, bias=True)}  # fmt: skip


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("config", list(HF))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_against_hf_diffllama_attention(transformers, impl, config, dtype):
    """Batch 2, right padding in the second sequence, causal, RoPE, GQA: outputs, HF's returned maps and every
    gradient (λ vectors included) within 1e-10 (float64, HF's float32 steps in float64) or 1e-5 (float32)."""
    from mha_numpy.interop import diffllama

    kw = HF[config]
    E = 4 * kw["num_heads"]
    module = diffllama.hf_diffllama_attention(E, rope_theta=300.0, dtype=dtype, seed=len(config), **kw)
    x = np.random.default_rng(11).standard_normal((2, 6, E))
    attention_mask = np.array([[1] * 6, [1] * 4 + [0] * 2])
    kernel = kernels.get_kernel(impl, **KERNELS[impl])
    report = diffllama.crosscheck_hf_diffllama_attention(module, x, attention_mask=attention_mask, kernel=kernel)
    assert report.passed, str(report)
    assert report.rtol == (1e-10 if dtype == np.float64 else 1e-5)
    names = [r.name for r in report.rows]
    assert {"output", "attention weights", *(f"dL/d{n}" for n in LAMBDAS)} <= set(names)
    assert len([n for n in names if n.startswith("dL/d")]) == 1 + (8 if kw.get("bias") else 4) + 4


def test_hf_as_shipped_rounds_through_float32_and_the_context_manager_restores_it(transformers):
    """Without ``float64_throughout`` HF's float64 module is far from float64 (its softmax and λ in float32), so the
    check could not pass at 1e-10 without it; the block leaves modeling_diffllama as it found it."""
    import torch
    from transformers.models.diffllama import modeling_diffllama

    from mha_numpy.interop import diffllama

    module = diffllama.hf_diffllama_attention(16, 4, 2, rope_theta=300.0)
    x = np.random.default_rng(12).standard_normal((2, 5, 16))
    report = diffllama.crosscheck_hf_diffllama_attention(module, x)
    shipped = float(report.notes[-1].split("by ")[-1].split(" (output)")[0])
    assert shipped > 1e-9 and report.passed, str(report)  # the as-shipped gap is real, and bridged
    assert modeling_diffllama.torch is torch
    with diffllama.float64_throughout():
        assert modeling_diffllama.torch.float32 is torch.float64 and modeling_diffllama.torch.exp is torch.exp
    assert modeling_diffllama.torch is torch


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kv_cache_against_hf_dynamic_cache(transformers, impl, dtype):
    from mha_numpy.interop import diffllama

    module = diffllama.hf_diffllama_attention(32, 8, 4, rope_theta=100.0, bias=True, dtype=dtype)
    x = np.random.default_rng(13).standard_normal((2, 7, 32))
    kernel = kernels.get_kernel(impl, **KERNELS[impl])
    report = diffllama.crosscheck_hf_diffllama_kv_cache(module, x, prefill=3, kernel=kernel)
    assert report.passed, str(report)


def test_the_importer_maps_every_tensor_and_refuses_what_it_does_not_model(transformers):
    from mha_numpy.interop import diffllama

    module = diffllama.hf_diffllama_attention(24, 6, 2, rope_theta=50.0, layer_idx=4, head_dim=6)
    mha = interop.from_hf_diffllama_attention(module)
    assert (mha.num_heads, mha.num_kv_heads, mha.head_dim, mha.diff_layer_idx, mha.bias) == (6, 2, 6, 4, False)
    assert mha.config.diff_lambda_init == pytest.approx(module.lambda_init, rel=1e-15)
    assert mha.diff_norm_eps == module.groupnorm.eps and mha.params["W_o"].shape == (24, 36)
    for name in LAMBDAS:
        np.testing.assert_array_equal(mha.params[name], getattr(module, name).detach().numpy())
    with pytest.raises(ValueError, match="DiffLlamaAttention"):
        interop.from_hf_diffllama_attention(object())
    with pytest.raises(ValueError, match="has no diff_attention=True"):
        interop.to_torch_mha(make(Hkv=4))
    with pytest.raises(ValueError, match="leaves a query without any key"):
        diffllama.crosscheck_hf_diffllama_attention(module, np.zeros((1, 3, 24)), attention_mask=[[0, 1, 1]])
