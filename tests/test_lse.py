"""The exposed log-sum-exp: every kernel's cache has ``lse`` (B, H, Lq), each row's log Σ_j exp(masked score_ij) in
float64, and every kernel's backward takes its gradient (``backward(d_context, cache, d_lse=...)``).

Checked on every kernel: against a 50-digit decimal reference, on every mask kind (fully masked rows: -inf), with
large logits (float32 at 1e4, where a float32 lse would be off by its own ulp of 1e-3), gradient-checked (central
differences of a loss that uses the context and the lse, random upstream gradients) with masks, a bias, a score
mod and dropout, saturated rows against exact arithmetic (the chunked kernel's pivot rows: a row's dS then sums to
d_lse, not 0), through the module and recompute, and the merge the convention exists for.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conftest import MASK_KINDS, make_mask
from helpers import SATURATION_GAP, SATURATION_MASKS, error_against_exact, rel_err, saturated_case
from reference import exact_attention_backward, exact_lse

from mha_numpy import MultiHeadAttention, kernels, masks
from mha_numpy import functional as F
from mha_numpy.gradcheck import check_function

KERNEL_CASES = [("vectorized", {}), ("naive", {}), ("chunked", dict(block_size=3, num_threads=1))]
KERNEL_CASES += [("chunked", dict(block_size=2, num_threads=2)), ("chunked", dict(block_size=64, num_threads=1))]
KERNEL_CASES += [("auto", dict(min_chunked_scores=48))]
IDS = [n + "".join(f"-{k[0]}{v}" for k, v in o.items()) for n, o in KERNEL_CASES]
B, H, LQ, LK, D = 2, 2, 5, 4, 3


def qkv(rng, dtype=np.float64, B=B, H=H, Lq=LQ, Lk=LK):
    return (
        rng.standard_normal((B, H, Lq, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D + 1)).astype(dtype),  # dv != d
    )


def with_lse(kernel, **kw):
    """q, k, v, ... -> [context, lse] flattened into one vector, the output a loss of both sees."""

    def forward(q, k, v, **more):
        ctx, cache = kernel.forward(q, k, v, **kw, **more)
        return np.concatenate([ctx.ravel(), cache.lse.ravel()])

    return forward


def test_every_kernel_is_in_this_file():
    assert {n for n, _ in KERNEL_CASES} >= {"vectorized", "naive", "chunked", "auto"}


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_lse_is_the_exact_log_of_the_softmax_denominator(impl, options, kind, rng):
    """Against 50-digit arithmetic on every mask kind; fully masked rows give -inf, the weights are exp(s - lse)."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    mask = make_mask(kind, rng, B, H, LQ, LK)
    _, cache = kernel.forward(q, k, v, mask)
    lse, exact = cache.lse, exact_lse(q, k, mask, scale=1 / np.sqrt(D))
    assert lse.shape == (B, H, LQ) and lse.dtype == np.float64
    assert np.array_equal(np.isneginf(lse), np.isneginf(exact))
    finite = np.isfinite(exact)
    assert np.abs(lse[finite] - exact[finite]).max() <= 4 * np.finfo(np.float64).eps * np.abs(exact[finite]).max()
    if kind == "fully masked rows":
        assert np.isneginf(lse[1]).all() and np.isneginf(lse[0, :, [1, LQ - 1]]).all()
    if kind != "finite min":  # there exp(s - lse) of s ≈ finfo.min cannot show the weights: they are 1 / Lk, s ≈ lse
        with np.errstate(invalid="ignore"):  # exp(-inf - -inf) is NaN on a fully masked row:
            weights = np.exp(cache.masked_scores - lse[..., None])  # (B, H, Lq, Lk)
        weights[np.isneginf(lse)] = 0.0  # such a row has no weights
        assert rel_err(weights, cache.attn_weights) <= 1e-14


@pytest.mark.parametrize("dtype, magnitude", [(np.float32, 1e4), (np.float64, 1e6)])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_large_logits_keep_log_ell_beside_a_large_max(impl, options, dtype, magnitude, rng):
    """Scores magnitude · k_j (exact integers times the magnitude): m is huge, log ℓ of order 1. The lse is float64,
    m + log ℓ formed at the end, so it keeps log ℓ to within the working dtype's rounding of ℓ: 1e-6 absolute in
    float32, where a float32 lse (an ulp of 1e-3 at 1e4) would lose it."""
    kernel = kernels.get_kernel(impl, **options)
    q = np.zeros((1, 1, 4, 2), dtype)
    q[..., 0] = magnitude
    k = rng.integers(-3, 4, (1, 1, 6, 2)).astype(dtype)
    v = rng.standard_normal((1, 1, 6, 3)).astype(dtype)
    _, cache = kernel.forward(q, k, v, scale=1.0)
    exact = exact_lse(q, k)
    assert np.abs(cache.lse - exact).max() <= 8 * np.finfo(dtype).eps  # absolute, against a max of magnitude · 3
    assert np.abs(cache.lse - exact).max() < np.spacing(np.float32(3 * magnitude)) / 100 or dtype == np.float64


@pytest.mark.parametrize("extra", ["mask", "bias", "soft-cap", "dropout mask"])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_loss_of_the_context_and_the_lse_is_gradient_checked(impl, options, extra, rng):
    """Central differences of Σ (dO ∘ O) + Σ (d_lse ∘ lse), random dO and d_lse, against backward(..., d_lse=)."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    kw = dict(mask=make_mask("causal" if extra == "mask" else "padding", rng, B, H, LQ, LK))
    inputs = dict(q=q, k=k, v=v)
    if extra == "bias":
        inputs["bias"] = rng.normal(0, 1, (1, H, LQ, LK))
    if extra == "soft-cap":
        cap = partial(F.soft_cap_forward, cap=1.5), F.soft_cap_backward
        kw["score_mods"] = (kernels.ScoreMod.elementwise("soft_cap", *cap),)
    if extra == "dropout mask":
        kw.update(dropout_p=0.3, dropout_mask=rng.random((B, H, LQ, LK)) >= 0.3)
    ctx, cache = kernel.forward(**inputs, **kw)
    d_context, d_lse = rng.standard_normal(ctx.shape), rng.standard_normal((B, H, LQ))
    grads = kernel.backward(d_context, cache, d_lse=d_lse)
    d_out = np.concatenate([d_context.ravel(), d_lse.ravel()])
    names = ("q", "k", "v", "bias")[: len(inputs)]
    report = check_function(with_lse(kernel, **kw), dict(zip(names, grads)), inputs, d_out)
    assert report.passed and max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)
    plain = kernels.VectorizedKernel()
    ref = plain.backward(d_context, plain.forward(**inputs, **kw)[1], d_lse=d_lse)
    largest = max(np.abs(g).max() for g in ref[: len(inputs)])
    assert all(np.abs(a - b).max() <= 1e-12 * largest for a, b in zip(grads[: len(inputs)], ref))


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_loss_of_the_lse_alone(impl, options, rng):
    """d_context = 0: the gradient is the lse's alone, dS = P ∘ d_lse; for dv it is exactly 0."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    mask = make_mask("fully masked rows", rng, B, H, LQ, LK)
    ctx, cache = kernel.forward(q, k, v, mask)
    d_lse = rng.standard_normal((B, H, LQ))
    d_lse[np.isneginf(cache.lse)] = 0.0  # a row whose lse is -inf: no finite difference to compare with
    dq, dk, dv, *_ = kernel.backward(np.zeros_like(ctx), cache, d_lse=d_lse)

    def lse(q, k):  # -inf on the fully masked rows (whose d_lse is 0): 0 there, so that -inf · 0 is not NaN
        out = kernel.forward(q, k, v, mask)[1].lse
        return np.where(np.isneginf(out), 0.0, out)

    report = check_function(lse, dict(q=dq, k=dk), dict(q=q, k=k), d_lse)
    assert report.passed and max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)
    assert np.all(dv == 0)
    d_lse_all = rng.standard_normal((B, H, LQ))  # a gradient on a fully masked row's lse changes nothing
    grads = kernel.backward(np.zeros_like(ctx), cache, d_lse=d_lse_all)
    assert all(np.isfinite(g).all() for g in grads[:3]) and np.all(grads[0][1] == 0)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_finite_minus_infinity_masks_and_float32(impl, options, rng):
    """A row blocked by finfo.min has lse = finfo.min + log Lk = finfo.min in float64, as the vectorized kernel's;
    float32 within 1e-5 of float64 (both lse float64), and its d_lse gradients float32."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng)
    mask = make_mask("finite min", rng, B, H, LQ, LK)
    _, cache = kernel.forward(q, k, v, mask)
    ref = kernels.VectorizedKernel().forward(q, k, v, mask)[1]
    assert np.array_equal(cache.lse, ref.lse) or rel_err(cache.lse, ref.lse) <= 1e-15
    assert cache.lse[1].max() == np.finfo(np.float64).min
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    causal = masks.causal_mask(LQ, LK)
    ctx32, c32 = kernel.forward(q32, k32, v32, causal)
    assert c32.lse.dtype == np.float64 and rel_err(c32.lse, kernel.forward(q, k, v, causal)[1].lse) <= 1e-5
    grads = kernel.backward(np.ones_like(ctx32), c32, d_lse=np.ones((B, H, LQ)))  # float64 d_lse, float32 call
    assert all(g.dtype == np.float32 for g in grads[:3])


@pytest.mark.parametrize("mask_kind", SATURATION_MASKS)
@pytest.mark.parametrize("rows", list(SATURATION_GAP))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_saturated_rows_with_d_lse_are_as_exact_as_the_plain_path(impl, options, dtype, rows, mask_kind):
    """The saturated rows of test_kernels with a gradient on the lse too: a row's dS sums to d_lse, so the chunked
    kernel's pivot entry is d_lse_i - Σ_{j≠j*} dS_ij; with the old rule (-Σ_{j≠j*} dS_ij) its error is d_lse_i, of
    the order of the largest gradient. Judged as test_kernels judges: against exact arithmetic, at most twice the
    plain path's error plus 4 ulps, the plain path within 64 ulps."""
    q, k, v, d, mask = saturated_case(rows, mask_kind, dtype)
    d_lse = np.random.default_rng(5).standard_normal((1, 1, 7)).astype(dtype)
    exact = exact_attention_backward(*(a.astype(np.float64) for a in (q, k, v, d)), mask=mask,
                                     d_lse=d_lse.astype(np.float64))[:3]  # fmt: skip
    plain = kernels.VectorizedKernel()
    plain_error = error_against_exact(plain.backward(d, plain.forward(q, k, v, mask, scale=1.0)[1], d_lse)[:3], exact)
    kernel = kernels.get_kernel(impl, **options)
    error = error_against_exact(kernel.backward(d, kernel.forward(q, k, v, mask, scale=1.0)[1], d_lse)[:3], exact)
    eps = np.finfo(dtype).eps
    assert plain_error <= 64 * eps, f"the plain path: {plain_error / eps:.3g} ulps"
    assert error <= 2 * plain_error + 4 * eps, f"{error / eps:.3g} ulps, the plain path {plain_error / eps:.3g}"


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_two_halves_of_the_keys_merge_into_the_whole(impl, options, rng):
    """What the convention is for: attention over disjoint key sets, merged by their lse, is attention over all keys
    (o = Σ_parts exp(lse_part - lse) o_part, lse = log Σ_parts exp(lse_part)); a part whose rows see nothing
    (lse = -inf) merges with weight 0."""
    kernel = kernels.get_kernel(impl, **options)
    q, k, v = qkv(rng, Lk=6)
    mask = masks.combine_masks(masks.causal_mask(LQ, 6), masks.padding_mask([6, 4], 6))  # (B, 1, Lq, 6)
    whole, cache = kernel.forward(q, k, v, mask)
    parts = [kernel.forward(q, k[:, :, c], v[:, :, c], np.broadcast_to(mask, (B, H, LQ, 6))[..., c])
             for c in (slice(0, 3), slice(3, 6))]  # fmt: skip
    lse = np.logaddexp(*(c.lse for _, c in parts))  # (B, H, Lq)
    with np.errstate(invalid="ignore"):  # -inf - -inf on a row no part sees: its weight is 0 below
        scales = [np.nan_to_num(np.exp(c.lse - lse), nan=0.0)[..., None] for _, c in parts]
    merged = sum(s * o for s, (o, _) in zip(scales, parts))
    assert rel_err(merged, whole) <= 1e-14 and rel_err(lse[np.isfinite(lse)], cache.lse[np.isfinite(lse)]) <= 1e-15
    assert np.isneginf(parts[1][1].lse[:, :, :3]).all()  # the causal rows 0-2 see nothing of keys 3-5


def test_the_module_and_recompute_expose_the_kernels_lse(rng):
    x = rng.standard_normal((2, 5, 8))
    mask = masks.causal_mask(5)
    default = MultiHeadAttention(8, 4, num_kv_heads=2, rope_theta=10.0, rng=0, impl="chunked", block_size=2)
    lean = MultiHeadAttention(8, 4, num_kv_heads=2, rope_theta=10.0, rng=0, recompute=True)
    cache, lean_cache = default.forward(x, x, x, mask)[1], lean.forward(x, x, x, mask)[1]
    assert cache.lse.shape == (2, 4, 5) and rel_err(lean_cache.lse, cache.lse) <= 1e-14
    assert rel_err(cache.lse, F.log_sum_exp(cache.attention.masked_scores)) <= 1e-14


def test_the_functional_pieces_on_their_own(rng):
    """log_sum_exp: -inf for an empty or fully blocked row, NaN for a NaN; softmax_backward's d_lse is its gradient."""
    x = rng.standard_normal((2, 3, 4))
    x[0, 1] = -np.inf
    lse = F.log_sum_exp(x)
    assert np.isneginf(lse[0, 1]) and rel_err(lse[1], np.log(np.exp(x[1]).sum(-1))) <= 1e-15
    assert np.isneginf(F.log_sum_exp(np.zeros((2, 0)))).all() and np.isnan(F.log_sum_exp(np.array([1.0, np.nan])))
    y = rng.standard_normal((3, 5))
    p, c = F.softmax_forward(y)
    d_p, d_lse = rng.standard_normal((3, 5)), rng.standard_normal(3)
    both = np.concatenate([d_p.ravel(), d_lse])
    report = check_function(lambda y: np.concatenate([F.softmax_forward(y)[0].ravel(), F.log_sum_exp(y)]),
                            dict(y=F.softmax_backward(d_p, c, d_lse)), dict(y=y), both)  # fmt: skip
    assert report.passed and report.rows[0].max_rel_err <= 1e-7, str(report)


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_wrong_d_lse_is_refused_naming_it(impl, options, rng):
    kernel = kernels.get_kernel(impl, **options)
    ctx, cache = kernel.forward(*qkv(rng))
    for bad in (np.ones((1, H, LQ)), np.ones((B, H, LQ, 1)), np.ones((B, H, LQ), np.int64)):
        with pytest.raises(ValueError, match="d_lse"):
            kernel.backward(np.ones_like(ctx), cache, d_lse=bad)
