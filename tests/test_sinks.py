"""Attention sinks: gpt-oss's learned logit per head in every softmax denominator (``sinks=True``, every kernel's
``sinks=``), and StreamingLLM's sink tokens kept before a sliding window (``StreamingKVCache``).

- every kernel against an independent reference (gpt-oss's way: the logit appended as a column after the mask,
  the column dropped), 50-digit arithmetic for the lse, central differences of a loss of the context and the lse
  for q, k, v, a bias and the sinks; fully masked rows, a sink of -inf, float32; saturated rows with sinks against
  exact arithmetic (the chunked kernel's pivot entry must count the sink's);
- the module: GQA, RoPE, head_dim != E / H, padding, batch > 1, sliding windows, recompute, decoding token by token
  equal to the full forward with the layer's mask;
- transformers' GptOssAttention (sliding and full layers, its own masks, its DynamicCache) on every kernel;
- StreamingKVCache: decoding without end in bounded memory, equal to the full forward with the sink-and-window
  mask without RoPE, and with RoPE (positions in the cache) equal to a fresh forward over the tokens it holds.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conftest import MASK_KINDS, make_mask
from helpers import (
    SATURATION_GAP,
    SATURATION_MASKS,
    error_against_exact,
    grad_check,
    grad_check_self_attention,
    rel_err,
    saturated_case,
)
from reference import attention, exact_attention_backward, exact_lse

from mha_numpy import KVCache, MultiHeadAttention, StreamingKVCache, kernels, masks
from mha_numpy import functional as F
from mha_numpy.gradcheck import check_function

KERNEL_CASES = [("vectorized", {}), ("naive", {}), ("chunked", dict(block_size=3, num_threads=1))]
KERNEL_CASES += [("chunked", dict(block_size=2, num_threads=2)), ("chunked", dict(block_size=64, num_threads=1))]
KERNEL_CASES += [("auto", dict(min_chunked_scores=48))]
IDS = [n + "".join(f"-{k[0]}{v}" for k, v in o.items()) for n, o in KERNEL_CASES]
B, H, LQ, LK, D = 2, 3, 5, 4, 3


def qkv(rng, dtype=np.float64, Lq=LQ, Lk=LK):
    return (
        rng.standard_normal((B, H, Lq, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D + 1)).astype(dtype),  # dv != d
    )


def sinks_of(rng, dtype=np.float64):
    return np.array([-1.0, 0.5, 2.0], dtype) + 0.1 * rng.standard_normal(H).astype(dtype)  # one sink takes much


def context_and_lse(kernel, **kw):
    """q, k, v, sinks, ... -> [context, lse] as one vector (-inf, a fully masked row without a sink, as 0)."""

    def forward(**inputs):
        ctx, cache = kernel.forward(**inputs, **kw)
        return np.concatenate([ctx.ravel(), np.where(np.isneginf(cache.lse), 0.0, cache.lse).ravel()])

    return forward


def test_every_kernel_is_in_this_file():
    assert {n for n, _ in KERNEL_CASES} >= set(kernels.KERNELS) - {"toy"}  # toy: test_kernels' own


# --------------------------------------------------------------------------- the kernels


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_every_kernel_matches_gpt_oss_way_and_gradchecks(impl, options, kind, rng):
    """Context and weights against the appended-column reference, the lse (sinks counted) against 50 digits, and
    every gradient (q, k, v, sinks) against central differences of a loss of the context and the lse."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    sinks = sinks_of(rng)
    mask = make_mask(kind, rng, B, H, LQ, LK)
    ctx, cache = kernel.forward(q, k, v, mask, sinks=sinks)
    ref_ctx, ref_w = attention(q, k, v, mask, sinks=sinks)
    assert rel_err(ctx, ref_ctx) <= 1e-12 and rel_err(cache.attn_weights, ref_w) <= 1e-12
    assert np.all(cache.attn_weights.sum(-1) < 1.0)  # the sinks take their share: the keys' weights sum below 1
    exact = exact_lse(q, k, mask, scale=1 / np.sqrt(D), sinks=sinks)
    assert np.isfinite(cache.lse).all() and np.abs(cache.lse - exact).max() <= 4e-16 * np.abs(exact).max()
    d_context, d_lse = rng.standard_normal(ctx.shape), rng.standard_normal((B, H, LQ))
    grads = kernel.backward(d_context, cache, d_lse=d_lse)
    assert grads[3] is None and grads[4].shape == (H,)
    inputs = dict(q=q, k=k, v=v, sinks=sinks)
    analytic = dict(q=grads[0], k=grads[1], v=grads[2], sinks=grads[4])
    d_out = np.concatenate([d_context.ravel(), d_lse.ravel()])
    report = check_function(context_and_lse(kernel, mask=mask), analytic, inputs, d_out)
    assert report.passed and max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)
    plain = kernels.VectorizedKernel()
    ref = plain.backward(d_context, plain.forward(q, k, v, mask, sinks=sinks)[1], d_lse=d_lse)
    largest = max(np.abs(ref[i]).max() for i in (0, 1, 2, 4))
    assert all(np.abs(grads[i] - ref[i]).max() <= 1e-12 * largest for i in (0, 1, 2, 4))


@pytest.mark.parametrize("extra", ["bias", "soft-cap", "dropout mask"])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_sinks_with_a_bias_a_score_mod_and_dropout(impl, options, extra, rng):
    """The sink joins after the bias, the score mods and the mask, and dropout acts on the keys' weights only."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    kw = dict(mask=make_mask("causal", rng, B, H, LQ, LK))
    inputs = dict(q=q, k=k, v=v, sinks=sinks_of(rng))
    ref_kw = {}
    if extra == "bias":
        inputs["bias"] = ref_kw["bias"] = rng.normal(0, 1, (1, H, LQ, LK))
    if extra == "soft-cap":
        cap = partial(F.soft_cap_forward, cap=1.5), F.soft_cap_backward
        kw["score_mods"] = (kernels.ScoreMod.elementwise("soft_cap", *cap),)
    if extra == "dropout mask":
        keep = rng.random((B, H, LQ, LK)) >= 0.3
        kw.update(dropout_p=0.3, dropout_mask=keep)
        ref_kw.update(keep=keep, p=0.3)
    ctx, cache = kernel.forward(**inputs, **kw)
    if extra != "soft-cap":
        assert rel_err(ctx, attention(q, k, v, kw["mask"], sinks=inputs["sinks"], **ref_kw)[0]) <= 1e-12
    d_context, d_lse = rng.standard_normal(ctx.shape), rng.standard_normal((B, H, LQ))
    dq, dk, dv, d_bias, d_sinks = kernel.backward(d_context, cache, d_lse=d_lse)
    analytic = dict(q=dq, k=dk, v=dv, sinks=d_sinks, **({} if d_bias is None else dict(bias=d_bias)))
    d_out = np.concatenate([d_context.ravel(), d_lse.ravel()])
    report = check_function(context_and_lse(kernel, **kw), analytic, inputs, d_out)
    assert report.passed and max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_fully_masked_row_gives_its_sink_everything(impl, options, rng):
    """Zero weights and a zero context (as gpt-oss gives, without the NaN a plain softmax would need a rule for),
    lse = the sink, zero dq; its sink's gradient from such a row is its d_lse (∂ lse / ∂ sink = 1 there)."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    sinks = sinks_of(rng)
    mask = make_mask("fully masked rows", rng, B, H, LQ, LK)  # batch item 1 sees nothing
    ctx, cache = kernel.forward(q, k, v, mask, sinks=sinks)
    assert np.all(ctx[1] == 0) and np.all(cache.attn_weights[1] == 0)
    assert np.array_equal(cache.lse[1], np.broadcast_to(sinks[:, None], (H, LQ)))
    d_lse = np.zeros((B, H, LQ))
    d_lse[1] = rng.standard_normal((H, LQ))  # a gradient on the blocked item's lse only
    dq, dk, dv, _, d_sinks = kernel.backward(rng.standard_normal(ctx.shape), cache, d_lse=d_lse)
    assert np.all(dq[1] == 0) and all(np.isfinite(g).all() for g in (dq, dk, dv, d_sinks))
    only_blocked = kernel.backward(np.zeros_like(ctx), cache, d_lse=d_lse)[4]
    assert np.abs(only_blocked - d_lse[1].sum(-1)).max() <= 1e-14


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_sink_of_minus_infinity_is_no_sink(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    mask = make_mask("fully masked rows", rng, B, H, LQ, LK)
    sinks = np.array([-np.inf, 0.5, -np.inf])
    ctx, cache = kernel.forward(q, k, v, mask, sinks=sinks)
    plain_ctx, plain = kernel.forward(q, k, v, mask)
    d = rng.standard_normal(ctx.shape)
    grads, plain_grads = kernel.backward(d, cache), kernel.backward(d, plain)
    for h in (0, 2):
        assert rel_err(ctx[:, h], plain_ctx[:, h]) <= 1e-14 and np.array_equal(cache.lse[:, h], plain.lse[:, h])
        assert all(rel_err(g[:, h], p[:, h]) <= 1e-13 for g, p in zip(grads[:3], plain_grads[:3]))
    assert grads[4][0] == 0 and grads[4][2] == 0 and grads[4][1] != 0


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_float32_stays_float32_and_agrees_with_float64(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    sinks, mask = sinks_of(rng), make_mask("padding", rng, B, H, LQ, LK)
    d = rng.standard_normal((B, H, LQ, D + 1))
    ctx, cache = kernel.forward(q, k, v, mask, sinks=sinks)
    grads = kernel.backward(d, cache)
    args32 = [a.astype(np.float32) for a in (q, k, v)]
    ctx32, c32 = kernel.forward(*args32, mask, sinks=sinks.astype(np.float32))
    grads32 = kernel.backward(d.astype(np.float32), c32)
    assert ctx32.dtype == np.float32 and c32.attn_weights.dtype == np.float32 and grads32[4].dtype == np.float32
    assert rel_err(ctx32, ctx) <= 1e-5 and all(rel_err(grads32[i], grads[i]) <= 1e-5 for i in (0, 1, 2, 4))
    with pytest.raises(ValueError, match="sinks"):
        kernel.forward(*args32, mask, sinks=sinks)  # float64 sinks for a float32 call: its gradient's dtype


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_bad_sinks_are_refused_naming_them(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    for bad in (np.zeros(H + 1), np.zeros((1, H)), np.zeros(H, np.int64), np.zeros(H, bool)):
        with pytest.raises(ValueError, match="sinks"):
            kernel.forward(q, k, v, sinks=bad)


# The sink's logit in the saturated cases (float32, float64): "saturating" takes the ordinary rows' whole weight
# (their scores are O(1)), ties with the saturated rows of "tiny weights"; "small" leaves every row to its keys.
SINK_LOGIT = {
    "saturating": (20.0, 40.0),
    "near-saturating": (10.0, 30.0),
    "moderate": (1.0, 1.0),
    "small": (-3.0, -3.0),
}


@pytest.mark.parametrize("mask_kind", SATURATION_MASKS)
@pytest.mark.parametrize("sink", list(SINK_LOGIT))
@pytest.mark.parametrize("rows", list(SATURATION_GAP))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_saturated_rows_with_sinks_are_as_exact_as_the_plain_path(impl, options, dtype, rows, sink, mask_kind):
    """Saturated rows (a key's weight near 1) and rows the sink saturates, with a gradient on the lse too, against
    exact arithmetic: every kernel within twice the plain path's error plus 4 ulps, or 16 ulps (test_chunked's own
    bound), judged against the largest gradient, d_sinks included; the plain path within 64 ulps. The chunked
    kernel's pivot entry is d_lse - Σ others - dS_sink: leaving the sink's entry out errs by dS_sink itself."""
    q, k, v, d, mask = saturated_case(rows, mask_kind, dtype)
    sinks = np.array([SINK_LOGIT[sink][int(np.dtype(dtype) == np.float64)]], dtype)
    d_lse = np.random.default_rng(5).standard_normal((1, 1, 7)).astype(dtype)
    to64 = [a.astype(np.float64) for a in (q, k, v, d)]
    ex = exact_attention_backward(*to64, mask=mask, sinks=sinks.astype(np.float64), d_lse=d_lse.astype(np.float64))
    exact = [*ex[:3], ex[4]]
    plain = kernels.VectorizedKernel()
    g = plain.backward(d, plain.forward(q, k, v, mask, scale=1.0, sinks=sinks)[1], d_lse)
    plain_error = error_against_exact([*g[:3], g[4]], exact)
    kernel = kernels.get_kernel(impl, **options)
    g = kernel.backward(d, kernel.forward(q, k, v, mask, scale=1.0, sinks=sinks)[1], d_lse)
    error = error_against_exact([*g[:3], g[4]], exact)
    eps = np.finfo(dtype).eps
    assert plain_error <= 64 * eps, f"the plain path: {plain_error / eps:.3g} ulps"
    assert error <= max(2 * plain_error + 4 * eps, 16 * eps), f"{error / eps:.3g} ulps, plain {plain_error / eps:.3g}"


def test_the_sink_softmax_pair_on_its_own(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    x[0, 1, 2] = -np.inf  # a fully masked row
    sink = rng.standard_normal((3, 1))
    p, cache = F.sink_softmax_forward(x, sink)
    with_column = np.concatenate([x, np.broadcast_to(sink, (2, 3, 4))[..., None]], axis=-1)  # gpt-oss's way
    assert rel_err(p, F.softmax_forward(with_column)[0][..., :-1]) <= 1e-15 and np.all(p[0, 1, 2] == 0)
    assert rel_err(F.log_sum_exp(x, sink), F.log_sum_exp(with_column)) <= 1e-15
    assert np.array_equal(F.sink_softmax_forward(x, np.full((3, 1), -np.inf))[0], F.softmax_forward(x)[0])

    def backward(d, c):
        return F.sink_softmax_backward(d, c)

    grad_check(lambda x, sink: F.sink_softmax_forward(x, sink), backward, dict(x=x.copy(), sink=sink), ["x", "sink"])
    with pytest.raises(ValueError, match="sink"):
        F.sink_softmax_forward(x, np.zeros((4, 1)))


# --------------------------------------------------------------------------- the module

MODULE_KERNELS = {"vectorized": {}, "naive": {}, "chunked": dict(block_size=2, num_threads=2), "auto": {}}
E, NH, HKV, HD, L = 8, 4, 2, 3, 7  # head_dim 3 with E = 8: the heads do not tile E (W_q (12, 8))


def gpt_oss_like(impl, **kw):
    mha = MultiHeadAttention(E, NH, num_kv_heads=HKV, head_dim=4, rope_theta=20.0, sinks=True, rng=0,
                             impl=kernels.get_kernel(impl, **MODULE_KERNELS[impl]), **kw)  # fmt: skip
    r = np.random.default_rng(1)
    for name, p in mha.params.items():  # nonzero biases, sinks that matter
        p[...] = r.normal(0.0, 1.0 if name == "sinks" else 0.5, p.shape) if p.ndim == 1 else p
    return mha


def reference_module(mha, x, mask):
    """The module written out with einsum: GQA, RoPE, the sink as gpt-oss's appended column."""
    P, Hkv, d = mha.params, mha.num_kv_heads, mha.head_dim
    q, k, v = (x @ P[f"W_{n}"].T + P[f"b_{n}"] for n in "qkv")
    Q = q.reshape(*x.shape[:2], NH, d).transpose(0, 2, 1, 3)  # (B, H, L, d)
    K, V = (a.reshape(*x.shape[:2], Hkv, d).transpose(0, 2, 1, 3) for a in (k, v))  # (B, Hkv, L, d)
    Q, K = F.rope_forward(Q, None, 20.0)[0], F.rope_forward(K, None, 20.0)[0]
    K, V = np.repeat(K, NH // Hkv, axis=1), np.repeat(V, NH // Hkv, axis=1)  # (B, H, L, d)
    ctx, w = attention(Q, K, V, mask, sinks=P["sinks"])
    return ctx.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1) @ P["W_o"].T + P["b_o"], w


def window_and_padding(Lq=L, Lk=L, window=3):
    """gpt-oss's sliding layer (window 3 here) on a padded batch: item 1 has two pad tokens in front."""
    return masks.combine_masks(masks.sliding_window_mask(Lq, Lk, window), masks.padding_mask([Lk, Lk - 2], Lk))


@pytest.mark.parametrize("impl", list(MODULE_KERNELS))
def test_the_module_with_sinks_matches_the_reference_and_every_gradient_checks(impl, rng):
    mha = gpt_oss_like(impl)
    x = rng.standard_normal((2, L, E))
    mask = window_and_padding()
    out, cache = mha.forward(x, x, x, mask=mask)
    ref_out, ref_w = reference_module(mha, x, mask)
    assert rel_err(out, ref_out) <= 1e-12 and np.abs(cache.attn_weights - ref_w).max() <= 1e-13
    grad_check_self_attention(mha, x, mask)


@pytest.mark.parametrize("impl", list(MODULE_KERNELS))
def test_recompute_and_decoding_with_sinks_and_a_sliding_window(impl, rng):
    """recompute=True slices the sinks by head group (layout "q"); decoding token by token with a KVCache and the
    window mask of each call equals the full forward with the sliding-window mask (gpt-oss's sliding layers)."""
    default, lean = gpt_oss_like(impl), gpt_oss_like(impl, recompute=True)
    x = rng.standard_normal((2, L, E))
    mask = window_and_padding()
    out, cache = default.forward(x, x, x, mask=mask)
    out_r, cache_r = lean.forward(x, x, x, mask=mask)
    d_out = rng.standard_normal(out.shape)
    grads, grads_r = default.backward(d_out, cache), lean.backward(d_out, cache_r)
    largest = max(np.abs(g).max() for g in grads.values())
    assert rel_err(out_r, out) <= 1e-13 and all(np.abs(grads[n] - grads_r[n]).max() <= 1e-13 * largest for n in grads)
    assert rel_err(cache_r.lse, cache.lse) <= 1e-14
    window = masks.sliding_window_mask(L, L, 3)
    full, _ = default.forward(x, x, x, mask=window)
    kv, steps = KVCache(), []
    for t in range(L):
        xt = x[:, t : t + 1]
        steps.append(default.forward(xt, xt, xt, mask=masks.sliding_window_mask(1, t + 1, 3, offset=t), kv_cache=kv)[0])
    assert rel_err(np.concatenate(steps, axis=1), full) <= 1e-12


def test_the_option_is_checked_and_torch_mha_refuses_it():
    with pytest.raises(ValueError, match="sinks must be True or False"):
        MultiHeadAttention(8, 2, sinks="yes")
    mha = MultiHeadAttention(8, 2, sinks=True, rng=0)
    assert mha.params["sinks"].shape == (2,) and "Sinks" in mha.describe()
    mha.params["sinks"] = np.zeros(3)
    with pytest.raises(ValueError, match=r"params\['sinks'\]"):
        mha.forward(np.zeros((1, 2, 8)), np.zeros((1, 2, 8)), np.zeros((1, 2, 8)))
    pytest.importorskip("torch")
    from mha_numpy.interop import to_torch_mha

    with pytest.raises(ValueError, match="sinks"):
        to_torch_mha(MultiHeadAttention(8, 2, sinks=True, rng=0))


# --------------------------------------------------------------------------- against transformers' GptOssAttention


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("window", [3, None], ids=["sliding", "full"])
@pytest.mark.parametrize("impl", list(MODULE_KERNELS))
def test_against_gpt_oss_attention_on_every_kernel(impl, window, dtype):
    """GptOssAttention (GQA 4 / 2, head_dim 6 with hidden 16, sinks, its own masks on a left- and right-padded batch
    of 2) on every kernel: outputs, the keys' weights, Q, K and every gradient, the sinks' included, to 1e-10 in
    float64 and 1e-5 in float32."""
    pytest.importorskip("transformers")
    from mha_numpy.interop.gpt_oss import crosscheck_hf_gpt_oss_attention, hf_gpt_oss_attention

    module = hf_gpt_oss_attention(16, 4, 2, head_dim=6, sliding_window=window, rope_theta=100.0, dtype=dtype)
    x = np.random.default_rng(2).standard_normal((2, L, 16))
    keep = np.array([[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]])
    kernel = kernels.get_kernel(impl, **MODULE_KERNELS[impl])
    report = crosscheck_hf_gpt_oss_attention(module, x, attention_mask=keep, impl=kernel)
    assert report.passed and report.rtol == (1e-10 if dtype == np.float64 else 1e-5), str(report)
    assert {"dL/dsinks", "attn weights (keys')", "mask (1 = may attend)"} <= {r.name for r in report.rows}


@pytest.mark.parametrize("window", [3, None], ids=["sliding", "full"])
@pytest.mark.parametrize("impl", list(MODULE_KERNELS))
def test_decoding_against_gpt_oss_dynamic_cache(impl, window):
    """Prefill then token by token: ours (KVCache + the layer's mask) against GptOssAttention with its DynamicCache
    (a sliding layer keeps window - 1 keys), and against our own full forward."""
    pytest.importorskip("transformers")
    from mha_numpy.interop.gpt_oss import crosscheck_hf_gpt_oss_kv_cache, hf_gpt_oss_attention

    module = hf_gpt_oss_attention(16, 4, 1, sliding_window=window, rope_theta=100.0)  # multi-query
    x = np.random.default_rng(3).standard_normal((2, 8, 16))
    report = crosscheck_hf_gpt_oss_kv_cache(module, x, prefill=3, impl=kernels.get_kernel(impl, **MODULE_KERNELS[impl]))
    assert report.passed, str(report)


def test_the_importer_refuses_what_it_does_not_model_and_takes_yarn():
    pytest.importorskip("transformers")
    import torch
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    from mha_numpy.interop.gpt_oss import from_hf_gpt_oss_attention

    cfg = GptOssConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4, num_hidden_layers=2,
                       vocab_size=16, intermediate_size=8, num_local_experts=2, num_experts_per_tok=1)  # fmt: skip
    yarn = GptOssAttention(cfg, 0)  # gpt-oss's default rope_type is "yarn": imported (tests/test_rope_scaling.py)
    assert from_hf_gpt_oss_attention(yarn).config.rope_scaling.rope_type == "yarn"
    with pytest.raises(ValueError, match="GptOssAttention"):
        from_hf_gpt_oss_attention(torch.nn.Linear(2, 2))


# --------------------------------------------------------------------------- StreamingLLM's sink tokens


def streaming_mask(L: int, n: int, window: int) -> np.ndarray:
    """(L, L) what StreamingLLM lets query i see: the first n tokens and the last ``window`` up to i."""
    s, t = np.arange(L)[None, :], np.arange(L)[:, None]
    return (s <= t) & ((s < n) | (s > t - window))


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("impl", list(MODULE_KERNELS))
def test_streaming_decoding_equals_the_sink_and_window_mask_in_bounded_memory(impl, chunk, rng):
    """Without RoPE positions do not enter: decoding 40 tokens (1 or 3 a call) with StreamingKVCache(2, 5) equals
    the full forward with the sink-and-window mask, while the cache never holds more than 2 + 5 - 1 positions
    between calls nor shows a call more than 2 + 5 - 1 + chunk."""
    mha = MultiHeadAttention(E, NH, num_kv_heads=HKV, sinks=True, rng=0,
                             impl=kernels.get_kernel(impl, **MODULE_KERNELS[impl]))  # fmt: skip
    n, window, T = 2, 5, 40
    x = rng.standard_normal((2, T, E))
    full, _ = mha.forward(x, x, x, mask=streaming_mask(T, n, window))
    kv, outs = StreamingKVCache(sink_tokens=n, window=window), []
    for a in range(0, T, chunk):
        xa = x[:, a : a + chunk]
        out, cache = mha.forward(xa, xa, xa, kv_cache=kv)
        outs.append(out)
        assert len(kv) <= n + window - 1 and cache.K.shape[2] <= n + window - 1 + chunk
        assert kv.nbytes <= (n + window - 1) * kv.bytes_per_token * 2
    assert rel_err(np.concatenate(outs, axis=1), full) <= 1e-12
    assert kv.seen == T and len(kv) == n + window - 1


@pytest.mark.parametrize("impl", list(MODULE_KERNELS))
def test_streaming_with_rope_turns_the_keys_at_their_places_in_the_cache(impl, rng):
    """StreamingLLM's positions: each step equals a fresh causal forward over the tokens the cache holds (the sink
    tokens and the window, numbered 0, 1, ... as a sequence), gpt-oss's sinks, GQA and RoPE included; before the
    first eviction that is the plain causal forward, and after it the text's positions give other numbers."""
    mha = gpt_oss_like(impl)
    n, window, T = 2, 4, 12
    x = rng.standard_normal((2, T, E))
    kv, causal = StreamingKVCache(sink_tokens=n, window=window), mha.forward(x, x, x, mask=masks.causal_mask(T))[0]
    for t in range(T):
        out, _ = mha.forward(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], kv_cache=kv)
        held = [j for j in range(t + 1) if j < n or j > t - window]  # the tokens the call attends to
        seq = x[:, held]
        fresh, _ = mha.forward(seq, seq, seq, mask=masks.causal_mask(len(held)))
        assert rel_err(out[:, 0], fresh[:, -1]) <= 1e-12, t
        if t < n + window:
            assert rel_err(out[:, 0], causal[:, t]) <= 1e-12, t
    text, _ = mha.forward(x, x, x, mask=streaming_mask(T, n, window))  # the same keys at their places in the text
    assert rel_err(out[:, 0], text[:, -1]) > 1e-3


STREAMING_OPTIONS = {
    "appended keys": dict(add_bias_kv=True, add_zero_attn=True),
    "qk_norm, softcap": dict(qk_norm=True, softcap=2.0),
    "gqa, sinks": dict(num_kv_heads=2, sinks=True),
    "alibi": dict(alibi=True),
}


@pytest.mark.parametrize("option", list(STREAMING_OPTIONS))
def test_streaming_with_the_other_steps(option, rng):
    """The steps that do not depend on positions decode with StreamingKVCache as the full forward with the
    sink-and-window mask does (torch's appended keys after the cache's, every query may attend to them); ALiBi's
    distances are places in the cache too (its offset is Lk - Lq), equal to the full forward until the first
    eviction, then to a fresh forward over the held tokens."""
    mha = MultiHeadAttention(E, NH, rng=0, **STREAMING_OPTIONS[option])
    n, window, T = 1, 3, 9
    x = rng.standard_normal((2, T, E))
    full, _ = mha.forward(x, x, x, mask=streaming_mask(T, n, window))
    kv = StreamingKVCache(sink_tokens=n, window=window)
    for t in range(T):
        out, _ = mha.forward(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], kv_cache=kv)
        if option == "alibi":
            held = [j for j in range(t + 1) if j < n or j > t - window]
            seq = x[:, held]
            expected = mha.forward(seq, seq, seq, mask=masks.causal_mask(len(held)))[0][:, -1]
        else:
            expected = full[:, t]
        assert rel_err(out[:, 0], expected) <= 1e-12, t
    assert len(kv) == n + window - 1


def test_streaming_cache_keeps_earlier_calls_and_refuses_what_it_cannot_do(rng):
    mha = MultiHeadAttention(E, NH, rope_theta=20.0, rng=0)
    kv = StreamingKVCache(sink_tokens=1, window=2)
    x = rng.standard_normal((1, 6, E))
    first = mha.forward(x[:, :3], x[:, :3], x[:, :3], kv_cache=kv)[1]
    K_before = first.K.copy()
    for t in range(3, 6):
        mha.forward(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], kv_cache=kv)
    assert np.array_equal(first.K, K_before) and "StreamingKVCache(sink_tokens=1, window=2" in repr(kv)
    assert [type(s).__name__ for s in mha._plan("keys before RoPE")[0]][2:4] == ["AppendToCache", "Rope"]
    with pytest.raises(ValueError, match="positions= with a StreamingKVCache"):
        mha.forward(x[:, :1], x[:, :1], x[:, :1], positions=np.array([9]), kv_cache=StreamingKVCache(1, 2))
    for bad in (dict(sink_tokens=-1), dict(window=0), dict(window=2.0)):
        with pytest.raises(ValueError, match="sink_tokens|window"):
            StreamingKVCache(**bad)
    with pytest.raises(ValueError, match="recompute"):
        MultiHeadAttention(E, NH, recompute=True, rng=0).forward(x, x, x, kv_cache=StreamingKVCache(1, 2))


def test_streaming_cache_says_which_stream_positions_it_keeps(rng):
    """``kept``: the sink tokens and the last window - 1 tokens' places in the stream, after each call (a copy)."""
    mha = MultiHeadAttention(4, 2, rng=0)
    cache = StreamingKVCache(sink_tokens=2, window=3)
    for t in range(7):
        x = rng.standard_normal((1, 1, 4))
        mha.forward(x, x, x, kv_cache=cache)
        expected = [s for s in range(t + 1) if s < 2 or s > t - 2]  # the sinks, the last window - 1 = 2
        assert cache.kept.tolist() == expected and len(cache) == len(expected)
    cache.kept[0] = 99
    assert cache.kept[0] == 0
