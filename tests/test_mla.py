"""Multi-head latent attention (DeepSeek-V2/V3, ``MultiHeadLatentAttention``): a second module on the data-path
machinery, checked on every kernel.

- against an independent einsum reference (RoFormer's interleaved rotation written out, the K/V expansion by
  head), with padding masks, batch > 1, Lq != Lk (a separate ``key``), with and without q_lora_rank, both RoPE
  layouts, with and without biases, a fully masked row, dropout with a given keep-mask, float32;
- every gradient by central differences against a random upstream gradient (float64);
- against transformers' DeepseekV3Attention and torch autograd: 1e-10 in float64 (HF's float32 steps switched
  off, ``interop.deepseek_v3.float64_throughout``), 1e-5 in float32 as shipped;
- recompute=True (one head a group) against the default path;
- decoding with the ``LatentCache`` token by token against the full causal forward and HF's DynamicCache;
- the refusals and bad arguments; the cache's bytes per token against MHA, GQA and MQA at DeepSeek-V3's width
  (the table of docs/derivation.md § 25, computed here).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import grad_check, rel_err, require_torch

from mha_numpy import KVCache, LatentCache, MultiHeadAttention, MultiHeadLatentAttention, kernels, masks
from mha_numpy import functional as F

KERNELS = {"vectorized": {}, "naive": {}, "chunked": dict(block_size=2, num_threads=2), "auto": {}}
# E, H, r, dr, dn, dv: tiny, and dqk = dn + dr != dv
SIZES = dict(embed_dim=8, num_heads=2, kv_lora_rank=4, qk_rope_head_dim=4, qk_nope_head_dim=3, v_head_dim=2)
VARIANTS = {
    "q_lora, bias, interleaved": dict(q_lora_rank=3, bias=True, rope_interleave=True),
    "no q_lora, halves": dict(q_lora_rank=None, bias=False, rope_interleave=False),
    "q_lora, halves, scale": dict(q_lora_rank=5, bias=True, rope_interleave=False, scale=0.3, rope_theta=50.0),
}
B, L = 2, 5


def kernel(impl):
    return kernels.get_kernel(impl, **KERNELS[impl])


def make(variant="q_lora, bias, interleaved", impl="vectorized", dtype=np.float64, **kw):
    mla = MultiHeadLatentAttention(**SIZES, **VARIANTS[variant], impl=kernel(impl), dtype=dtype, rng=0, **kw)
    rng = np.random.default_rng(1)
    for name, p in mla.params.items():  # nonzero biases, norm weights away from 1, larger weights: peaked softmax
        if name.endswith("_norm"):
            p[...] = rng.normal(1.0, 0.3, p.shape)
        elif name.startswith("b_"):
            p[...] = rng.normal(0.0, 0.5, p.shape)
        else:
            p *= 2.0
    return mla


def padded_causal(Lq, Lk, lengths=(5, 3)):
    """(B, 1, Lq, Lk): causal (bottom-right) and the keys past each sequence's length blocked; no row empty."""
    return masks.causal_mask(Lq, Lk, diagonal=Lk - Lq) & masks.padding_mask(np.array(lengths), Lk)


# --------------------------------------------------------------------------- the reference


def turn(x, pos, theta, interleaved):
    """RoPE written out (B, h, L, d): pairs (2i, 2i + 1) (RoFormer's) or (i, i + d/2), angle pos · θ^(-2i/d)."""
    d = x.shape[-1]
    angle = np.asarray(pos, np.float64)[..., None] * theta ** (-np.arange(0, d, 2) / d)  # (L, d/2) or (B, L, d/2)
    if angle.ndim == 3:
        angle = angle[:, None]  # (B, 1, L, d/2)
    cos, sin = np.cos(angle), np.sin(angle)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin  # the pairs stay in place
        return out
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def reference(mla, query, key=None, mask=None, pos_q=None, pos_k=None, keep=None):
    """The module in one einsum per formula, per head, sharing no code with the package -> (output, weights)."""
    c, P = mla.config, mla.params
    key = query if key is None else key
    H, r, dr, dn, dv = c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim
    bias = (lambda n: P[n]) if c.bias else (lambda n: 0.0)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.norm_eps) * w

    if c.q_lora_rank is None:
        q = np.einsum("ble,oe->blo", query, P["W_q"])
    else:
        q = np.einsum("ble,re->blr", query, P["W_qa"]) + bias("b_qa")
        q = np.einsum("blr,or->blo", rms(q, P["q_a_norm"]), P["W_qb"])
    Q = q.reshape(*q.shape[:2], H, dn + dr).transpose(0, 2, 1, 3)  # (B, H, Lq, dqk)
    a = np.einsum("ble,oe->blo", key, P["W_kva"]) + bias("b_kva")  # (B, Lk, r + dr)
    c_kv, k_pe = rms(a[..., :r], P["kv_a_norm"]), a[..., r:]
    kv = np.einsum("blr,or->blo", c_kv, P["W_kvb"]).reshape(*c_kv.shape[:2], H, dn + dv)  # (B, Lk, H, dn + dv)
    K_nope, V = kv[..., :dn].transpose(0, 2, 1, 3), kv[..., dn:].transpose(0, 2, 1, 3)  # (B, H, Lk, ·)
    Lq, Lk = query.shape[1], key.shape[1]
    pos_q = np.arange(Lq) if pos_q is None else pos_q
    pos_k = np.arange(Lk) if pos_k is None else pos_k
    Q_rope = turn(Q[..., dn:], pos_q, c.rope_theta, c.rope_interleave)  # (B, H, Lq, dr)
    k_rope = turn(k_pe[:, None], pos_k, c.rope_theta, c.rope_interleave)  # (B, 1, Lk, dr): one head for all
    scale = c.scale if c.scale is not None else (dn + dr) ** -0.5
    s = (np.einsum("bhid,bhjd->bhij", Q[..., :dn], K_nope) + np.einsum("bhid,bxjd->bhij", Q_rope, k_rope)) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    w = np.divide(w, w.sum(-1, keepdims=True), out=np.zeros_like(w), where=w.sum(-1, keepdims=True) > 0)
    dropped = w if keep is None else w * keep / (1 - c.dropout)
    ctx = np.einsum("bhij,bhjd->bihd", dropped, V).reshape(*query.shape[:2], H * dv)  # (B, Lq, H·dv)
    return ctx @ P["W_o"].T + bias("b_o"), w


# --------------------------------------------------------------------------- outputs and gradients


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_matches_the_reference_self_and_cross_attention(variant, impl, rng):
    mla = make(variant, impl)
    x = rng.standard_normal((B, L, 8))
    out, cache = mla.forward(x, mask=padded_causal(L, L))
    ref, ref_w = reference(mla, x, mask=padded_causal(L, L))
    assert rel_err(out, ref) <= 1e-13 and np.abs(cache.attn_weights - ref_w).max() <= 1e-14
    assert cache.Q.shape == (B, 2, L, 7) and cache.K.shape == (B, 2, L, 7) and cache.V.shape == (B, 2, L, 2)
    key = rng.standard_normal((B, 7, 8))  # Lq = 5 != Lk = 7: a separate key, the latent made from it
    mask = padded_causal(L, 7, lengths=(7, 4))
    out, cache = mla.forward(x, key, mask=mask)
    ref, ref_w = reference(mla, x, key, mask=mask, pos_k=np.arange(7))
    assert rel_err(out, ref) <= 1e-13 and np.abs(cache.attn_weights - ref_w).max() <= 1e-14


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_gradient_checks_against_central_differences(variant, impl, rng):
    mla = make(variant, impl)
    x, key = rng.standard_normal((B, L, 8)), rng.standard_normal((B, 6, 8))
    mask, positions = padded_causal(L, 6, lengths=(6, 4)), None

    def forward(query, key, **params):
        mla.params.update(params)
        return mla.forward(query, key, mask=mask, positions=positions)

    def backward(d_out, cache):
        grads = mla.backward(d_out, cache)
        return tuple(grads[n] for n in ["query", "key", *mla.params])

    names = ["query", "key", *mla.params]
    grad_check(forward, backward, dict(query=x, key=key, **{n: p.copy() for n, p in mla.params.items()}), names)

    def self_forward(query, **params):  # self-attention, positions given per batch item
        mla.params.update(params)
        return mla.forward(query, mask=padded_causal(L, L), positions=positions)

    def self_backward(d_out, cache):
        grads = mla.backward(d_out, cache)
        return (grads["query"] + grads["key"], *(grads[n] for n in mla.params))

    positions = np.array([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]])
    inputs = dict(query=x, **{n: p.copy() for n, p in mla.params.items()})
    grad_check(self_forward, self_backward, inputs, ["query", *mla.params], allow_zero=False)


def test_a_fully_masked_row_dropout_float32_and_no_mutation(rng):
    mla = make()
    x = rng.standard_normal((B, L, 8))
    mask = padded_causal(L, L)
    mask = np.broadcast_to(mask, (B, 1, L, L)).copy()
    mask[1, :, 2] = False  # query 2 of the second sequence sees nothing
    before = {n: p.copy() for n, p in mla.params.items()}, x.copy()
    out, cache = mla.forward(x, mask=mask)
    assert np.all(cache.attn_weights[1, :, 2] == 0) and np.abs(out[1, 2] - mla.params["b_o"]).max() <= 1e-15
    assert all(np.array_equal(before[0][n], mla.params[n]) for n in before[0]) and np.array_equal(before[1], x)
    mla.dropout = 0.4
    keep = rng.random((B, 2, L, L)) > 0.4
    out, _ = mla.forward(x, mask=mask, training=True, dropout_mask=keep)
    assert rel_err(out, reference(mla, x, mask=mask, keep=keep)[0]) <= 1e-13
    small = make(dtype=np.float32)
    out32, cache32 = small.forward(x.astype(np.float32), mask=mask)
    grads = small.backward(np.ones_like(out32), cache32)
    assert out32.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
    assert rel_err(out32, make().forward(x, mask=mask)[0]) <= 1e-5


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_recompute_one_head_at_a_time_equals_the_default_path(variant, impl, rng):
    default, lean = make(variant, impl), make(variant, impl, recompute=True)
    x, key = rng.standard_normal((B, L, 8)), rng.standard_normal((B, 6, 8))
    mask = padded_causal(L, 6, lengths=(6, 4))
    out, cache = default.forward(x, key, mask=mask)
    out_r, cache_r = lean.forward(x, key, mask=mask)
    d_out = rng.standard_normal(out.shape)
    grads, grads_r = default.backward(d_out, cache), lean.backward(d_out, cache_r)
    largest = max(np.abs(g).max() for g in grads.values())
    assert rel_err(out_r, out) <= 1e-13 and set(grads) == set(grads_r)
    assert all(np.abs(grads[n] - grads_r[n]).max() <= 1e-13 * largest for n in grads)
    assert np.abs(cache_r.attn_weights - cache.attn_weights).max() <= 1e-14
    assert cache_r.K.shape == cache.K.shape and np.abs(cache_r.V - cache.V).max() <= 1e-13


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoding_with_the_latent_cache_equals_the_full_causal_forward(variant, impl, rng):
    mla = make(variant, impl)
    x = rng.standard_normal((B, 7, 8))
    full, cache_full = mla.forward(x, mask=masks.causal_mask(7))
    kv = LatentCache()
    calls = [(0, 3), (3, 4), (4, 5), (5, 7)]  # a prefill, single tokens, and two at once
    out = np.concatenate([mla.forward(x[:, a:b], kv_cache=kv)[0] for a, b in calls], axis=1)
    assert rel_err(out, full) <= 1e-13 and len(kv) == 7
    assert kv.latent.shape == (B, 1, 7, 4) and kv.k_rope.shape == (B, 1, 7, 4)
    assert np.abs(kv.k_rope[:, 0] - cache_full.K[:, 0, :, 3:]).max() <= 1e-14  # the rope key, after RoPE
    assert kv.bytes_per_token == (4 + 4) * 8 and kv.nbytes == B * 7 * 8 * 8


# --------------------------------------------------------------------------- against transformers


def hf_module(q_lora_rank, interleave, dtype, bias=True):
    require_torch()
    from mha_numpy.interop.deepseek_v3 import hf_deepseek_v3_attention

    return hf_deepseek_v3_attention(hidden_size=16, num_heads=4, kv_lora_rank=8, qk_rope_head_dim=4,
                                    qk_nope_head_dim=6, v_head_dim=5, q_lora_rank=q_lora_rank, rope_theta=100.0,
                                    rope_interleave=interleave, bias=bias, dtype=dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("q_lora_rank, interleave, bias", [(6, True, True), (None, False, False), (None, True, True)])
@pytest.mark.parametrize("impl", list(KERNELS))
def test_against_hf_deepseek_v3_attention_and_autograd(impl, q_lora_rank, interleave, bias, dtype):
    from mha_numpy.interop.deepseek_v3 import crosscheck_hf_deepseek_v3_attention

    module = hf_module(q_lora_rank, interleave, dtype, bias)
    x = 2 * np.random.default_rng(3).standard_normal((2, 6, 16))
    mask = padded_causal(6, 6, lengths=(6, 4))  # causal and a padded second sequence
    positions = np.array([[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7]])
    report = crosscheck_hf_deepseek_v3_attention(module, x, mask=mask, positions=positions, kernel=kernel(impl))
    assert report.passed, str(report)
    assert report.rtol == (1e-10 if dtype == np.float64 else 1e-5)
    rows = {r.name for r in report.rows}
    params = ["W_qa", "W_qb", "q_a_norm"] if q_lora_rank else ["W_q"]
    params += ["W_kva", "kv_a_norm", "W_kvb", "W_o"] + (["b_kva", "b_o"] + (["b_qa"] if q_lora_rank else [])) * bias
    assert {"output", "attention weights"} <= rows and {f"dL/d{n}" for n in params} <= rows
    if dtype == np.float64:  # the as-shipped gap is reported, and it is what float64_throughout removes
        gap = float(re.search(r"differs from ours by ([0-9.e+-]+) \(output\)", str(report)).group(1))
        assert 1e-12 < gap < 1e-5


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("impl", list(KERNELS))
def test_decoding_against_hf_dynamic_cache(impl, dtype):
    from mha_numpy.interop.deepseek_v3 import crosscheck_hf_deepseek_v3_cache

    module = hf_module(6, True, dtype)
    x = np.random.default_rng(4).standard_normal((2, 6, 16))
    report = crosscheck_hf_deepseek_v3_cache(module, x, prefill=2, kernel=kernel(impl))
    assert report.passed, str(report)
    assert {"cached latents c_kv", "cached rope keys", "outputs, every call"} <= {r.name for r in report.rows}


def test_float64_throughout_restores_the_module():
    require_torch()
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from mha_numpy.interop.deepseek_v3 import float64_throughout

    module = hf_module(6, True, np.float64)
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((1, 3, 16)))
    cos_sin = (torch.ones(1, 3, 4, dtype=torch.float64), torch.zeros(1, 3, 4, dtype=torch.float64))
    before = module(x, cos_sin, None)[0]
    with float64_throughout(module):
        inside = module(x, cos_sin, None)[0]
    after = module(x, cos_sin, None)[0]
    assert torch.equal(before, after) and not torch.equal(before, inside)  # float32 round trips, then none
    assert module.config._attn_implementation == "eager" and "mha_numpy_eager_same_dtype" not in ALL_ATTENTION_FUNCTIONS
    assert all("forward" not in vars(m) for m in module.modules())


def test_the_importer_refuses_what_it_does_not_model():
    require_torch()
    from mha_numpy.interop.deepseek_v3 import from_hf_deepseek_v3_attention

    module = hf_module(6, True, np.float64)
    module.config.num_key_value_heads = 2
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        from_hf_deepseek_v3_attention(module)
    module.config.num_key_value_heads = 4
    module.scaling *= 1.3  # what YaRN's mscale does
    with pytest.raises(ValueError, match="scaling"):
        from_hf_deepseek_v3_attention(module)
    module.scaling /= 1.3
    module.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        from_hf_deepseek_v3_attention(module)
    with pytest.raises(ValueError, match="DeepseekV3Attention"):
        from_hf_deepseek_v3_attention(MultiHeadAttention(8, 2))


# --------------------------------------------------------------------------- refusals and bad input


def test_refusals_name_both_options_before_any_arithmetic(rng):
    with pytest.raises(ValueError, match="kv_cache with recompute=True is not supported"):
        make(recompute=True).forward(rng.standard_normal((1, 2, 8)), kv_cache=LatentCache())
    mla = make()
    x = rng.standard_normal((1, 2, 8))
    out, cache = mla.forward(x, kv_cache=LatentCache())
    with pytest.raises(ValueError, match="backward through a call with kv_cache"):
        mla.backward(out, cache)
    with pytest.raises(ValueError, match="kv_cache must be a LatentCache"):
        mla.forward(x, kv_cache=KVCache())
    with pytest.raises(ValueError, match="kv_cache must be a KVCache"):
        MultiHeadAttention(8, 2).forward(x, x, x, kv_cache=LatentCache())
    kv = LatentCache()
    mla.forward(x, kv_cache=kv)
    with pytest.raises(ValueError, match="another module"):
        make().forward(x, kv_cache=kv)
    with pytest.raises(ValueError, match="is for self-attention"):
        mla.forward(x, rng.standard_normal((1, 3, 8)), kv_cache=LatentCache())
    with pytest.raises(ValueError, match="cache must be the cache returned by this module"):
        make().backward(out, mla.forward(x)[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(qk_rope_head_dim=3), "qk_rope_head_dim must be even"),
        (dict(kv_lora_rank=0), "kv_lora_rank must be a positive int"),
        (dict(v_head_dim=2.0), "v_head_dim must be a positive int"),
        (dict(q_lora_rank=0), "q_lora_rank must be a positive int"),
        (dict(norm_eps=-1.0), "norm_eps must be a finite number > 0"),
        (dict(rope_interleave=1), "rope_interleave must be True or False"),
        (dict(dtype=np.int32), "dtype must be np.float32 or np.float64"),
        (dict(num_kv_heads=1), "num_kv_heads=1 with kv_lora_rank"),
        (dict(qk_norm=True), "qk_norm with kv_lora_rank"),
    ],
)
def test_bad_options_are_refused_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadLatentAttention(**{**SIZES, **kwargs})


def test_bad_call_arguments_are_refused_naming_them(rng):
    mla = make()
    x = rng.standard_normal((1, 3, 8))
    with pytest.raises(ValueError, match=r"query with shape \(1, 3, 7\)"):
        mla.forward(x[..., :7])
    with pytest.raises(ValueError, match="key has dtype float32"):
        mla.forward(x, x.astype(np.float32))
    with pytest.raises(ValueError, match="mask"):
        mla.forward(x, mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="positions"):
        mla.forward(x, positions=np.arange(4))
    with pytest.raises(ValueError, match="params"):
        mla.params = {**mla.params, "W_q": np.zeros((14, 8))}
        mla.forward(x)


# --------------------------------------------------------------------------- the pairs


def test_the_new_pairs_on_their_own(rng):
    x = rng.standard_normal((2, 3, 4, 6))
    pos = np.array([[0, 1, 2, 5], [3, 4, 5, 6]])
    out, _ = F.rope_interleaved_forward(x, pos, 30.0)
    ref = turn(x, pos, 30.0, interleaved=True)  # in place
    assert np.abs(out - np.concatenate([ref[..., 0::2], ref[..., 1::2]], axis=-1)).max() <= 1e-15  # in halves
    grad_check(lambda x: F.rope_interleaved_forward(x, pos, 30.0), lambda d, c: (F.rope_interleaved_backward(d, c),),
               dict(x=x), ["x"], allow_zero=False)  # fmt: skip
    a, b = rng.standard_normal((2, 3, 4, 2)), rng.standard_normal((2, 1, 4, 3))
    grad_check(F.concat_features_forward, F.concat_features_backward, dict(a=a, b=b), ["a", "b"], allow_zero=False)
    parts, cache = F.split_features_forward(x, (2, 4))
    assert [p.shape for p in parts] == [(2, 3, 4, 2), (2, 3, 4, 4)] and np.array_equal(np.concatenate(parts, -1), x)
    assert np.array_equal(F.split_features_backward(parts, cache), x)
    with pytest.raises(ValueError, match="sizes"):
        F.split_features_forward(x, (2, 3))


# --------------------------------------------------------------------------- the cache's size

V3 = dict(hidden=7168, heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)


def cache_rows():
    """Bytes per token and layer of each cache at DeepSeek-V3's width (float32, our caches), filled with one token."""
    H, d, dv, r, dr = V3["heads"], V3["qk_nope_head_dim"], V3["v_head_dim"], V3["kv_lora_rank"], V3["qk_rope_head_dim"]

    def kv(heads, dk, dv):
        cache = KVCache()
        cache.append(np.zeros((1, heads, 1, dk), np.float32), np.zeros((1, heads, 1, dv), np.float32))
        return cache.bytes_per_token

    latent = LatentCache()
    latent.append(np.zeros((1, 1, 1, r), np.float32), np.zeros((1, 1, 1, dr), np.float32))
    rows = [
        ("MHA", f"K, V of {H} heads, d = {d}", kv(H, d, dv)),
        ("MLA's K, V expanded", f"K ({H} × {d + dr}), V ({H} × {dv})", kv(H, d + dr, dv)),
        ("GQA, 8 groups", f"K, V of 8 heads, d = {d}", kv(8, d, dv)),
        ("MQA", f"K, V of 1 head, d = {d}", kv(1, d, dv)),
        ("MLA (LatentCache)", f"c_kv ({r}) and k_rope ({dr})", latent.bytes_per_token),
    ]
    mha = rows[0][2]
    return [f"| {kind} | {what} | {n // 4} | {n} | {n / mha:.4g} |" for kind, what, n in rows]


def test_the_cache_size_table_in_the_docs_is_what_the_caches_hold():
    rows = cache_rows()
    assert rows[-1] == "| MLA (LatentCache) | c_kv (512) and k_rope (64) | 576 | 2304 | 0.01758 |"
    doc = (Path(__file__).resolve().parents[1] / "docs" / "derivation.md").read_text().splitlines()
    missing = [row for row in rows if row not in doc]
    assert not missing, f"docs/derivation.md § 25's table is out of date; first stale row:\n{missing[0]}"


def test_the_absorbed_matrix_identity_of_the_docs(rng):
    """docs/derivation.md § 25.6 (not built as a path): decoding can attend over the cached latents directly, W_kvb's
    key part absorbed into the query and its value part applied after the weighted sum; the same output."""
    mla = make()
    x = rng.standard_normal((B, 6, 8))
    kv = LatentCache()
    mla.forward(x[:, :5], kv_cache=kv)
    out, cache = mla.forward(x[:, 5:], kv_cache=kv)  # one token attends to 6 positions
    c, P = mla.config, mla.params
    H, r, dn, dv = c.num_heads, c.kv_lora_rank, c.qk_nope_head_dim, c.v_head_dim
    W = P["W_kvb"].reshape(H, dn + dv, r)
    W_uk, W_uv = W[:, :dn], W[:, dn:]  # (H, dn, r), (H, dv, r)
    Q = cache.Q  # (B, H, 1, dqk) after RoPE
    q_latent = np.einsum("bhld,hdr->bhlr", Q[..., :dn], W_uk)  # (B, H, 1, r): the query in the latent space
    scores = np.einsum("bhlr,bjr->bhlj", q_latent, kv.latent[:, 0])
    scores = (scores + np.einsum("bhld,bjd->bhlj", Q[..., dn:], kv.k_rope[:, 0])) * (dn + c.qk_rope_head_dim) ** -0.5
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = np.einsum("bhlr,hvr->blhv", np.einsum("bhlj,bjr->bhlr", p, kv.latent[:, 0]), W_uv)  # (B, 1, H, dv)
    absorbed = context.reshape(B, 1, H * dv) @ P["W_o"].T + P["b_o"]
    assert rel_err(absorbed, out) <= 1e-13 and np.abs(p - cache.attn_weights).max() <= 1e-14


def test_a_fresh_module_is_initialised_as_torch_would_and_says_what_it_is():
    mla = MultiHeadLatentAttention(**SIZES, q_lora_rank=3, bias=True, rng=0)
    for name, p in mla.params.items():
        if name.endswith("_norm"):
            assert np.array_equal(p, np.ones_like(p)), name
        elif name.startswith("b_"):
            assert np.array_equal(p, np.zeros_like(p)), name
        else:  # nn.Linear: U(±1/√fan_in)
            assert 0.5 / np.sqrt(p.shape[1]) < np.abs(p).max() <= 1 / np.sqrt(p.shape[1]), name
    assert [type(s).__name__ for s in mla.steps] == ["QueryProject", "LatentProject", "SplitQuery", "DecoupledRope",
                                                     "Expand", "Attend", "Merge", "OutProject"]  # fmt: skip
    assert "AppendLatent" in mla.describe(kv_cache=True) and "W_kvb (10, 4)" in mla.describe()
    assert repr(mla).startswith("MultiHeadLatentAttention(embed_dim=8, num_heads=2, ") and "kv_lora_rank=4" in repr(mla)
    mla.rope_interleave = False  # an option, checked again; the next call's steps follow it
    assert not mla.steps[3].c.rope_interleave and mla.qk_head_dim == 7 and mla.merged_dim == 4


def test_gradcheck_check_mha_takes_mla_with_query_and_key_only():
    """``gradcheck.check_mha`` checks MLA too (query and key: its values come from the latent); a value given to it,
    or none to MultiHeadAttention, is a ValueError naming value, before any arithmetic."""
    from mha_numpy.gradcheck import check_mha

    mla, rng = make(), np.random.default_rng(3)
    x, y = rng.standard_normal((2, 4, SIZES["embed_dim"])), rng.standard_normal((2, 5, SIZES["embed_dim"]))
    report = check_mha(mla, x, y, mask=padded_causal(4, 5))
    assert report.passed, report
    assert {row.name for row in report.rows} == {"query", "key", *mla.params}
    with pytest.raises(ValueError, match=r"value is an array of shape \(2, 5, .*query and key only"):
        check_mha(mla, x, y, y)
    with pytest.raises(ValueError, match="value is None: MultiHeadAttention takes query, key and value"):
        check_mha(MultiHeadAttention(4, 2), x[..., :4], x[..., :4])
