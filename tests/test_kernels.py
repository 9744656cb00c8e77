"""The conformance suite: every kernel in ``mha_numpy.kernels.KERNELS`` must pass all of it.

A new kernel is picked up by registering it; ``ToyKernel`` below (the vectorized kernel wrapped) is
registered here to prove that registering is all it takes. Kernel-specific tests (tile skipping,
memory, threads) live in test_chunked.py.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conftest import MASK_KINDS, make_mask
from helpers import SATURATION_GAP, SATURATION_MASKS, error_against_exact, rel_err, saturated_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import attention, einsum_mha, exact_attention_backward, per_head_loop

from mha_numpy import MultiHeadAttention, kernels
from mha_numpy import functional as F
from mha_numpy.gradcheck import check_function, check_mha


class ToyKernel(kernels.Kernel):
    """A kernel defined in a test: the vectorized one, wrapped. Registering it is all it takes."""

    name = "toy"

    def __init__(self):
        self.inner = kernels.VectorizedKernel()

    def run(self, q, k, v, args):
        context, cache = self.inner.run(q, k, v, args)
        cache.kernel = self
        return context, cache

    def backward(self, d_context, cache):
        return self.inner.backward(d_context, cache)


kernels.register("toy", ToyKernel)

# (registered name, options): every registered kernel, the chunked one with tiles smaller than L, and with
# tiles larger than a head's scores (then several heads share a work item: one batched product over heads)
KERNEL_CASES = [(name, {}) for name in kernels.KERNELS if name not in ("chunked", "auto")]
KERNEL_CASES += [("chunked", dict(block_size=3, num_threads=1)), ("chunked", dict(block_size=2, num_threads=2))]
KERNEL_CASES += [("chunked", dict(block_size=64, num_threads=1))]
KERNEL_CASES += [("auto", dict(min_chunked_scores=48))]  # tiny threshold (B·H·Lq·Lk): the suite reaches both kernels
IDS = [n + "".join(f"-{k[0]}{v}" for k, v in o.items()) for n, o in KERNEL_CASES]


def test_auto_picks_vectorized_for_small_scores_and_chunked_for_large():
    auto = kernels.get_kernel("auto")
    assert auto.choose((1, 4, 64, 64)) is auto.vectorized
    assert auto.choose((8, 12, 128, 128)) is auto.chunked  # a batch of short sequences: heads grouped, 2 threads
    assert auto.choose((1, 4, 2048, 2048)) is auto.chunked
    q = np.zeros((1, 1, 600, 2))
    assert (
        auto.forward(q, q, q)[1].kernel is auto.chunked and auto.forward(q[:, :, :4], q, q)[1].kernel is auto.vectorized
    )


B, H, LQ, LK, D = 2, 2, 5, 4, 3


def test_heads_are_grouped_when_a_head_fits_in_one_tile():
    """The case block_size=64 above must really run grouped heads; a per-head mask keeps them apart."""
    from mha_numpy.kernels.base import check_args

    kernel = kernels.ChunkedKernel(block_size=64, num_threads=1)
    args = check_args((B, H, LQ, LK), D)
    assert [hs for _, hs in kernel.groups(args, np.float64)] == [slice(0, H)] * B
    per_head = check_args((B, H, LQ, LK), D, mask=np.ones((H, LQ, LK), bool))
    assert all(hs.stop - hs.start == 1 for _, hs in kernel.groups(per_head, np.float64))
    long = check_args((1, 4, 4096, 4096), 64)  # block × block tiles: one head per item
    assert all(hs.stop - hs.start == 1 for _, hs in kernels.ChunkedKernel(block_size=512).groups(long, np.float32))


def test_every_registered_kernel_is_in_the_suite():
    assert {n for n, _ in KERNEL_CASES} == set(kernels.KERNELS) >= {"vectorized", "naive", "chunked", "toy"}


def qkv(rng, dtype=np.float64, B=B, Lq=LQ, Lk=LK):
    return (
        rng.standard_normal((B, H, Lq, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D + 1)).astype(dtype),  # dv != d
    )


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_forward_weights_and_gradients_match_the_reference(impl, options, kind, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    mask = make_mask(kind, rng, B, H, LQ, LK)
    ctx, cache = kernel.forward(q, k, v, mask)
    ref_ctx, ref_w = attention(q, k, v, mask)
    assert rel_err(ctx, ref_ctx) <= 1e-12 and rel_err(cache.attn_weights, ref_w) <= 1e-12
    d_context = rng.standard_normal(ctx.shape)  # random upstream gradient
    grads = kernel.backward(d_context, cache)
    assert grads[3] is None  # no bias, no bias gradient
    if kind != "finite min":  # a row blocked by finfo.min: the computed scores are absorbed (uniform weights),
        # so finite differences see a flat function; autograd (torch) and every kernel give the gradient of
        # the same operations instead, compared with the vectorized kernel below and with torch in test_torch_compat
        report = check_function(lambda q, k, v: kernel.forward(q, k, v, mask)[0], dict(zip("qkv", grads)),
                                dict(q=q, k=k, v=v), d_context)  # fmt: skip
        assert report.passed and max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)
    ref_grads = kernels.VectorizedKernel().backward(d_context, kernels.VectorizedKernel().forward(q, k, v, mask)[1])
    for name, a, b in zip("qkv", grads, ref_grads):
        assert np.abs(a - b).max() <= 1e-12 * max(np.abs(g).max() for g in ref_grads[:3]), name


@pytest.mark.parametrize("bias_shape", [(1, H, LQ, LK), (H, 1, 1), (B, 1, LQ, 1), (LK,)])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_score_bias_and_its_gradient(impl, options, bias_shape, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    bias = rng.normal(0, 1, bias_shape)
    mask = make_mask("padding", rng, B, H, LQ, LK)
    ctx, cache = kernel.forward(q, k, v, mask, bias=bias)
    assert rel_err(ctx, attention(q, k, v, mask, bias=bias)[0]) <= 1e-12
    d_context = rng.standard_normal(ctx.shape)
    dq, dk, dv, d_bias, _ = kernel.backward(d_context, cache)
    assert d_bias.shape == bias_shape
    report = check_function(lambda q, bias: kernel.forward(q, k, v, mask, bias=bias)[0], dict(q=dq, bias=d_bias),
                            dict(q=q, bias=bias), d_context)  # fmt: skip
    assert report.passed and max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_dropout_with_a_fixed_mask(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    keep = rng.random((B, H, LQ, LK)) >= 0.3
    ctx, cache = kernel.forward(q, k, v, dropout_p=0.3, dropout_mask=keep)
    assert rel_err(ctx, attention(q, k, v, keep=keep, p=0.3)[0]) <= 1e-12
    assert np.array_equal(cache.dropout_mask, keep)
    d_context = rng.standard_normal(ctx.shape)
    grads = kernel.backward(d_context, cache)
    report = check_function(lambda q, k, v: kernel.forward(q, k, v, dropout_p=0.3, dropout_mask=keep)[0],
                            dict(zip("qkv", grads)), dict(q=q, k=k, v=v), d_context)  # fmt: skip
    assert report.passed, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_sampled_dropout_is_reproduced_by_its_own_mask(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    ctx, cache = kernel.forward(q, k, v, dropout_p=0.5, rng=np.random.default_rng(7))
    keep = cache.dropout_mask
    assert keep.shape == (B, H, LQ, LK) and 0 < keep.mean() < 1
    assert rel_err(ctx, attention(q, k, v, keep=keep, p=0.5)[0]) <= 1e-12


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_one_head_with_a_causal_mask_bias_and_dropout(impl, options, sampled, rng):
    """B = 1, H = 1 and several key blocks: the chunked kernel then splits the head's key blocks across threads."""
    kernel = kernels.get_kernel(impl, **options)
    Lq, Lk = 9, 11
    q, k, v = (rng.standard_normal((1, 1, n, D + (i == 2))) for i, n in enumerate((Lq, Lk, Lk)))
    mask = make_mask("causal", rng, 1, 1, Lq, Lk)
    bias = rng.normal(0, 1, (1, 1, Lq, Lk))
    given = None if sampled else rng.random((1, 1, Lq, Lk)) >= 0.3
    drop = dict(dropout_p=0.3, dropout_mask=given, rng=np.random.default_rng(4) if sampled else None)
    ctx, cache = kernel.forward(q, k, v, mask, bias=bias, **drop)
    keep = cache.dropout_mask
    assert keep.shape == (1, 1, Lq, Lk) and (sampled or np.array_equal(keep, given))
    assert rel_err(ctx, attention(q, k, v, mask, bias=bias, keep=keep, p=0.3)[0]) <= 1e-12
    d_context = rng.standard_normal(ctx.shape)
    grads = kernel.backward(d_context, cache)
    fixed = dict(dropout_p=0.3, dropout_mask=keep)
    names = ("q", "k", "v", "bias")
    report = check_function(lambda q, k, v, bias: kernel.forward(q, k, v, mask, bias=bias, **fixed)[0],
                            dict(zip(names, grads)), dict(q=q, k=k, v=v, bias=bias), d_context)  # fmt: skip
    assert report.passed and max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_fully_masked_rows_are_zero_and_gradients_finite(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    mask = make_mask("fully masked rows", rng, B, H, LQ, LK)
    ctx, cache = kernel.forward(q, k, v, mask)
    grads = kernel.backward(rng.standard_normal(ctx.shape), cache)
    assert np.all(ctx[1] == 0) and np.all(ctx[0, :, [1, LQ - 1]] == 0)
    assert np.all(cache.attn_weights[1] == 0) and np.all(cache.attn_weights[0, :, [1, LQ - 1]] == 0)
    assert all(np.isfinite(g).all() for g in grads[:3]) and np.all(grads[0][1] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_dtype_is_kept_and_float32_agrees_with_float64(impl, options, dtype, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    ctx, cache = kernel.forward(*(x.astype(dtype) for x in (q, k, v)), make_mask("causal", rng, B, H, LQ, LK))
    grads = kernel.backward(rng.standard_normal(ctx.shape).astype(dtype), cache)
    assert ctx.dtype == dtype and cache.attn_weights.dtype == dtype and all(g.dtype == dtype for g in grads[:3])
    assert rel_err(ctx, attention(q, k, v, make_mask("causal", rng, B, H, LQ, LK))[0]) <= (
        1e-5 if dtype == np.float32 else 1e-12
    )


@pytest.mark.parametrize("dtype, magnitude", [(np.float32, 1e4), (np.float64, 1e6)])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_large_logits_are_as_exact_as_the_plain_softmax(impl, options, dtype, magnitude, rng):
    """Exactly representable scores around ±magnitude: the weights agree with float64 math to rounding."""
    kernel = kernels.get_kernel(impl, **options)
    q = np.zeros((1, 1, 4, 2), dtype)
    q[..., 0] = magnitude
    k = rng.integers(-3, 4, (1, 1, 6, 2)).astype(dtype)  # scores = magnitude · k[:, 0]: integers · magnitude
    v = rng.standard_normal((1, 1, 6, 3)).astype(dtype)
    _, cache = kernel.forward(q, k, v, scale=1.0)
    _, ref_w = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale=1.0)
    assert np.abs(cache.attn_weights - ref_w).max() <= 4 * np.finfo(dtype).eps
    np.testing.assert_allclose(cache.attn_weights.sum(-1), 1.0, rtol=8 * np.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_one_hot_softmax_has_exactly_zero_score_gradients(impl, options, dtype):
    """Every row attends to key 3 alone (the other weights are exactly 0), so dS, dq and dk are exactly 0, as the
    plain path gives. FlashAttention's D = rowsum(dO ∘ O) left its rounding difference from Σ_j P_ij dP_ij in dS,
    times |q| = 1e6 in dk: 0.089 in float32, 2.8e-10 in float64 (the reliability issue's reproduction). Both heads,
    and the first alone (B = H = 1: the chunked kernel then splits its 5 keys across threads)."""
    kernel = kernels.get_kernel(impl, **options)
    q = np.zeros((1, 2, 3, 4), dtype)
    q[..., 0], q[..., 1] = -1e6, [-1, 2, 0]
    k = np.zeros((1, 2, 5, 4), dtype)
    k[..., 0], k[..., 1] = [1, 1, 1, -1, 1], [0, 1, 3, 0, -2]
    v = np.random.default_rng(1).standard_normal((1, 2, 5, 3)).astype(dtype)
    d = np.random.default_rng(2).standard_normal((1, 2, 3, 3)).astype(dtype)
    for heads in (slice(None), slice(0, 1)):
        args = [a[:, heads] for a in (q, k, v)]
        dq, dk, dv, *_ = kernel.backward(d[:, heads], kernel.forward(*args, scale=1.0)[1])
        assert np.all(dq == 0) and np.all(dk == 0), (np.abs(dq).max(), np.abs(dk).max())
        exact_dv = exact_attention_backward(*(a.astype(np.float64) for a in (*args, d[:, heads])))[2]
        assert rel_err(dv, exact_dv) <= 2 * np.finfo(dtype).eps


@pytest.mark.parametrize("mask_kind", SATURATION_MASKS)
@pytest.mark.parametrize("rows", list(SATURATION_GAP))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_saturated_rows_are_as_exact_as_the_plain_path(impl, options, dtype, rows, mask_kind):
    """Rows whose weight sits on one key (one-hot, with tiny other weights, or near it) among ordinary rows, with
    masks, one head (the chunked kernel's keys then split across its threads): every kernel's error against exact
    arithmetic is at most twice the plain path's (the vectorized kernel in the same dtype) plus 4 ulps, judged
    against the largest gradient, and the plain path's is at most 64 ulps (up to 31 here: near saturation its
    rounded Σ_j P_ij dP_ij enters the top entry of dS whole). With FlashAttention's D alone the chunked cases
    failed 31 of these (one-hot rows by up to 8.4e3 ulps where the plain path is within 1; docs/derivation.md
    § 13)."""
    q, k, v, d, mask = saturated_case(rows, mask_kind, dtype)
    exact = exact_attention_backward(*(a.astype(np.float64) for a in (q, k, v, d)), mask=mask)[:3]
    plain = kernels.VectorizedKernel()
    plain_error = error_against_exact(plain.backward(d, plain.forward(q, k, v, mask, scale=1.0)[1])[:3], exact)
    kernel = kernels.get_kernel(impl, **options)
    error = error_against_exact(kernel.backward(d, kernel.forward(q, k, v, mask, scale=1.0)[1])[:3], exact)
    eps = np.finfo(dtype).eps
    assert plain_error <= 64 * eps, f"the plain path: {plain_error / eps:.3g} ulps"  # its rounded Σ_j P_ij dP_ij
    assert error <= 2 * plain_error + 4 * eps, f"{error / eps:.3g} ulps, the plain path {plain_error / eps:.3g}"


@pytest.mark.parametrize("mask_kind", SATURATION_MASKS)
@pytest.mark.parametrize("rows", list(SATURATION_GAP))
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_saturated_rows_under_a_score_mod_match_the_plain_path(impl, options, rows, mask_kind):
    """The same rows with a soft-cap of the scores (a ScoreMod): the chunked kernel's pivot entries are found at the
    softmax's input and then taken through the mod's derivative at j*, so every kernel agrees with the plain path
    (a pivot without that derivative is off by 1 - tanh²(s / cap) of its entry: 4% for a score of 10 and a cap
    of 50, far beyond this tolerance)."""
    q, k, v, d, mask = saturated_case(rows, mask_kind, np.float64)
    cap = (kernels.ScoreMod.elementwise("soft_cap", partial(F.soft_cap_forward, cap=50.0), F.soft_cap_backward),)
    plain = kernels.VectorizedKernel()
    ref = plain.backward(d, plain.forward(q, k, v, mask, scale=1.0, score_mods=cap)[1])[:3]
    kernel = kernels.get_kernel(impl, **options)
    grads = kernel.backward(d, kernel.forward(q, k, v, mask, scale=1.0, score_mods=cap)[1])[:3]
    assert error_against_exact(grads, ref) <= 64 * np.finfo(np.float64).eps


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_nan_and_inf_give_nan_rows_and_empty_inputs_are_defined(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    q[0, 0, 1, 0] = np.nan  # a NaN query: its row is NaN, every other row unaffected
    q[1, 1, 2] = np.inf  # +inf scores: NaN, as torch gives
    with np.errstate(invalid="ignore"):  # inf · 0 and inf - inf are NaN on purpose here
        ctx, cache = kernel.forward(q, k, v)
        weights = cache.attn_weights
    assert np.isnan(weights[0, 0, 1]).all() and np.isnan(ctx[0, 0, 1]).all()
    assert np.isnan(ctx[1, 1, 2]).all()
    ok = np.ones(ctx.shape[:3], bool)
    ok[0, 0, 1] = ok[1, 1, 2] = False
    assert np.isfinite(ctx[ok]).all()
    q, k, v = qkv(rng, Lk=0)  # no key at all (an empty memory): zero weights, zero context
    ctx, cache = kernel.forward(q, k, v)
    assert ctx.shape == (B, H, LQ, D + 1) and np.all(ctx == 0) and cache.attn_weights.shape == (B, H, LQ, 0)
    dq, dk, dv, *_ = kernel.backward(rng.standard_normal(ctx.shape), cache)
    assert np.all(dq == 0) and dk.shape == (B, H, 0, D) and dv.shape == (B, H, 0, D + 1)
    q, k, v = qkv(rng, B=0)  # an empty batch: empty results
    ctx, cache = kernel.forward(q, k, v)
    assert ctx.shape == (0, H, LQ, D + 1) and all(g.shape[0] == 0 for g in kernel.backward(ctx, cache)[:3])


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_the_cache_keeps_the_contract_of_kernels_base(impl, options, rng):
    """Every cache exposes CACHE_ATTRIBUTES (kernels/base.py) with the documented shapes and values; reading them
    (a kernel may compute them only then) changes nothing its backward returns."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    mask, bias = make_mask("additive+padding", rng, B, H, LQ, LK), rng.normal(0, 1, (1, H, LQ, LK))
    keep = rng.random((B, H, LQ, LK)) >= 0.3
    args = dict(mask=mask, bias=bias, dropout_p=0.3, dropout_mask=keep)
    d_context = rng.standard_normal((B, H, LQ, D + 1))
    _, untouched = kernel.forward(q, k, v, **args)
    before = kernel.backward(d_context, untouched)
    _, cache = kernel.forward(q, k, v, **args)
    ref = kernels.VectorizedKernel().forward(q, k, v, **args)[1]
    assert set(kernels.base.CACHE_ATTRIBUTES) == {"kernel", "scores", "masked_scores", "attn_weights", "dropout_mask",
                                                  "lse"}  # fmt: skip
    assert cache.kernel.backward.__self__ is cache.kernel and isinstance(cache.kernel, kernels.Kernel)
    for name in ("scores", "masked_scores", "attn_weights"):
        got = getattr(cache, name)
        assert got.shape == (B, H, LQ, LK) and got.dtype == q.dtype, name
        finite = np.isfinite(getattr(ref, name))
        assert np.array_equal(np.isfinite(got), finite) and rel_err(got[finite], getattr(ref, name)[finite]) <= 1e-12
    assert np.array_equal(cache.dropout_mask, keep) and kernel.forward(q, k, v)[1].dropout_mask is None
    assert cache.lse.shape == (B, H, LQ) and cache.lse.dtype == np.float64  # float64 whatever the working dtype
    finite = np.isfinite(ref.lse)
    assert np.array_equal(np.isfinite(cache.lse), finite) and rel_err(cache.lse[finite], ref.lse[finite]) <= 1e-12
    after = kernel.backward(d_context, cache)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_backward_refuses_a_wrong_d_context(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    ctx, cache = kernel.forward(*qkv(rng))
    with pytest.raises(ValueError, match="d_context"):
        kernel.backward(np.ones((1, *ctx.shape[1:])), cache)  # would broadcast silently
    with pytest.raises(ValueError, match="d_context"):
        kernel.backward(np.ones(ctx.shape, np.float32), cache)  # a float64 cache, a float32 gradient


# --------------------------------------------------------------------------- through the module


def module_case(rng, impl, options, self_attention, bias, dtype=np.float64, **kw):
    E = 6
    kdim, vdim = (None, None) if self_attention else (4, 3)
    mha = MultiHeadAttention(
        E, H, bias=bias, kdim=kdim, vdim=vdim, dtype=dtype, rng=3, impl=kernels.get_kernel(impl, **options), **kw
    )
    for name, p in mha.params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.5, p.shape)  # nonzero biases, so bias bugs show
    if self_attention:  # query is key is value: the fused QKV projection
        x = rng.standard_normal((B, LQ, E)).astype(dtype)
        return mha, (x, x, x)
    return mha, tuple(rng.standard_normal((B, n, f)).astype(dtype) for n, f in ((LQ, E), (LK, 4), (LK, 3)))


@pytest.mark.parametrize("self_attention, bias, kind", [(True, True, "causal"), (True, False, "padding"),
                         (False, True, "additive+padding"), (False, False, "fully masked rows"),
                         (False, True, "additive")])  # fmt: skip
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_module_matches_the_einsum_reference_and_gradchecks(impl, options, self_attention, bias, kind, rng):
    mha, (query, key, value) = module_case(rng, impl, options, self_attention, bias)
    mask = make_mask(kind, rng, B, H, LQ, key.shape[1])
    out, cache = mha.forward(query, key, value, mask)
    ref_out, ref_w = einsum_mha(mha.params, query, key, value, mask, H)
    assert rel_err(out, ref_out) <= 1e-12 and rel_err(cache.attn_weights, ref_w) <= 1e-12
    report = check_mha(mha, query, key, value, mask=mask)
    assert report.passed and max(r.max_rel_err for r in report.rows if not r.zero_gradient) <= 1e-7, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_step_that_changes_the_scores_works_with_every_kernel(impl, options, rng):
    """The relative-position bias (a pair in functional, one line each way in the module) on every kernel."""
    mha, (query, key, value) = module_case(rng, impl, options, False, True, rel_pos_max_distance=2)
    ref = MultiHeadAttention(6, H, kdim=4, vdim=3, rel_pos_max_distance=2, rng=0)
    ref.params = mha.params
    out, cache = mha.forward(query, key, value)
    ref_out, _ = ref.forward(query, key, value)
    assert rel_err(out, ref_out) <= 1e-12
    report = check_mha(mha, query, key, value, mask=make_mask("causal", rng, B, H, LQ, LK))
    assert report.passed and report["rel_bias"].max_rel_err <= 1e-7, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_module_dropout_is_gradient_checked_with_its_mask_held(impl, options, rng):
    mha, (x, _, _) = module_case(rng, impl, options, True, True, dropout=0.3)
    out, cache = mha.forward(x, x, x, training=True)
    keep = cache.dropout_mask
    ref = MultiHeadAttention(6, H, dropout=0.3, rng=0)
    ref.params = mha.params
    assert rel_err(out, ref.forward(x, x, x, training=True, dropout_mask=keep)[0]) <= 1e-12
    report = check_mha(mha, x, x, x, training=True)  # holds cache.dropout_mask fixed
    assert report.passed, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_module_refuses_foreign_caches_and_wrong_d_output(impl, options, rng):
    mha, (x, _, _) = module_case(rng, impl, options, True, True)
    other, _ = module_case(rng, impl, options, True, True)
    out, cache = mha.forward(x, x, x)
    with pytest.raises(ValueError, match="another MultiHeadAttention"):
        other.backward(np.ones_like(out), cache)
    with pytest.raises(ValueError, match="d_output"):
        mha.backward(np.ones(out.shape, np.float32), cache)
    with pytest.raises(ValueError, match="d_output"):
        mha.backward(np.ones((1, *out.shape[1:])), cache)


@st.composite
def configs(draw):
    H, d = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    B, Lq, Lk = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    kdim, vdim, bias = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.booleans())
    mask_shape = draw(st.sampled_from([None, (Lq, Lk), (B, 1, 1, Lk), (B, H, Lq, Lk), (1, H, 1, Lk)]))
    impl = draw(st.sampled_from(range(len(KERNEL_CASES))))
    return H, d, B, Lq, Lk, kdim, vdim, bias, mask_shape, impl, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_shapes_and_masks_on_every_kernel(cfg):
    H, d, B, Lq, Lk, kdim, vdim, bias, mask_shape, impl, seed = cfg
    name, options = KERNEL_CASES[impl]
    rng = np.random.default_rng(seed)
    mha = MultiHeadAttention(
        H * d, H, bias=bias, kdim=kdim, vdim=vdim, rng=rng, impl=kernels.get_kernel(name, **options)
    )
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
    np.testing.assert_allclose(w.sum(-1)[keep.any(-1)], 1.0, rtol=1e-12)
    assert np.all(w.sum(-1)[~keep.any(-1)] == 0.0)  # fully masked rows: all zero, no NaN
    ref_out, ref_w = per_head_loop(mha.params, query, key, value, keep, H)
    np.testing.assert_allclose(w, ref_w, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    grads = mha.backward(rng.standard_normal(out.shape), cache)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
