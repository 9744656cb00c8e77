"""The merge pair ``functional.merge_attention_forward`` / ``_backward``: S partial attentions over disjoint key sets
(each a context and its rows' lse) merged into the attention over their union, and its backward.

Gradient-checked (float64 central differences, random upstream gradients of the context and of the lse), S = 1 ... 5;
the conformance cases: rows every partial is empty for (zero context, lse -inf, zero gradients, never NaN), partials
empty for a row (weight 0), a NaN that stays NaN, float32 with logits of 1e4; and the point of it all: every kernel
run on S key shards and merged equals the same kernel on all keys, forward and (kernel backward after merge
backward) every gradient, to 1e-12 in float64, with masks of every kind, a bias and a sink.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_mask
from helpers import RTOL_TARGET, rel_err

from mha_numpy import functional as F
from mha_numpy import kernels
from mha_numpy.gradcheck import check_function, check_functional

B, H, LQ, D = 2, 2, 4, 3
KERNEL_CASES = [("vectorized", {}), ("naive", {}), ("chunked", dict(block_size=2, num_threads=1)), ("auto", {})]
IDS = [name for name, _ in KERNEL_CASES]


def partials(rng, S, dtype=np.float64, empty=True):
    """S random partials (contexts (B, H, Lq, D + 1), lses (B, H, Lq)); with ``empty``, partial S-1 has no key for
    row (0, 0, 0) (lse -inf, context 0), as a kernel gives it."""
    contexts = rng.standard_normal((S, B, H, LQ, D + 1)).astype(dtype)
    lses = 3 * rng.standard_normal((S, B, H, LQ))
    if empty and S > 1:
        contexts[-1, 0, 0, 0], lses[-1, 0, 0, 0] = 0.0, -np.inf
    return contexts, lses


def joined(contexts, lses, order="flat"):
    """The merge's two outputs as one vector, what a loss of both sees."""
    (context, lse), _ = F.merge_attention_forward(contexts, lses, order)
    return np.concatenate([context.ravel(), lse.ravel()])


@pytest.mark.parametrize("S", [1, 2, 3, 5])
def test_the_backward_is_the_gradient_of_the_context_and_the_lse(S, rng):
    """Central differences of Σ C ∘ dC + Σ lse ∘ d_lse, random dC and d_lse; a partial empty for a row included."""
    contexts, lses = partials(rng, S)
    (context, lse), cache = F.merge_attention_forward(list(contexts), list(lses))
    d_context, d_lse = rng.standard_normal(context.shape), rng.standard_normal(lse.shape)
    d_contexts, d_lses = F.merge_attention_backward(d_context, cache, d_lse=d_lse)
    assert len(d_contexts) == len(d_lses) == S and d_lses[0].dtype == np.float64
    d_out = np.concatenate([d_context.ravel(), d_lse.ravel()])
    report = check_function(joined, dict(contexts=np.stack(d_contexts), lses=np.stack(d_lses)),
                            dict(contexts=contexts, lses=lses), d_out)  # fmt: skip
    assert report.passed and all(r.max_rel_err <= RTOL_TARGET for r in report.rows), str(report)
    assert not any(r.zero_gradient for r in report.rows)
    if S > 1:  # the empty partial's row: weight 0, so no gradient reaches its context or its lse
        assert d_contexts[-1][0, 0, 0].tolist() == [0.0] * (D + 1) and d_lses[-1][0, 0, 0] == 0.0


def test_without_d_lse_the_lse_gradient_is_that_of_the_context_alone(rng):
    contexts, lses = partials(rng, 3)
    (context, _), cache = F.merge_attention_forward(contexts, lses)
    d_context = rng.standard_normal(context.shape)
    none = F.merge_attention_backward(d_context, cache)
    zero = F.merge_attention_backward(d_context, cache, d_lse=np.zeros(context.shape[:3]))
    assert all(np.array_equal(a, b) for a, b in zip(none[0] + none[1], zero[0] + zero[1]))


def test_the_registry_checks_the_pair():
    """pairs.py lists it: ``check_functional`` compares both gradients with central differences."""
    report = check_functional()
    rows = [r for r in report.rows if r.name.startswith("merge_attention:")]
    assert [r.name for r in rows] == ["merge_attention:contexts", "merge_attention:lses"]
    assert all(r.passed and r.max_rel_err <= RTOL_TARGET for r in rows), str(report)


def test_a_row_every_partial_is_empty_for_gets_zero_context_lse_minus_inf_and_zero_gradients(rng):
    contexts, lses = partials(rng, 3, empty=False)
    lses[:, 1, 0, 2] = -np.inf  # no partial has a key for this row
    contexts[:, 1, 0, 2] = 0.0
    for order in F.MERGE_ORDERS:
        (context, lse), cache = F.merge_attention_forward(contexts, lses, order)
        assert np.isneginf(lse[1, 0, 2]) and np.isfinite(lse).sum() == lse.size - 1
        assert np.all(context[1, 0, 2] == 0.0) and np.isfinite(context).all()
        d_contexts, d_lses = F.merge_attention_backward(np.ones_like(context), cache, d_lse=np.ones(lse.shape))
        assert all(np.isfinite(g).all() for g in d_contexts + d_lses)
        assert all(np.all(g[1, 0, 2] == 0.0) for g in d_contexts + d_lses)


def test_one_partial_is_itself_and_an_empty_row_of_it_is_zeroed(rng):
    contexts, lses = partials(rng, 1)
    lses[0, 0, 1, 3] = -np.inf
    (context, lse), _ = F.merge_attention_forward(contexts, lses)
    expected = contexts[0].copy()
    expected[0, 1, 3] = 0.0
    assert np.array_equal(context, expected) and np.array_equal(lse, lses[0])
    assert context is not contexts[0]


def test_a_nan_stays_nan(rng):
    contexts, lses = partials(rng, 3)
    contexts[1, 0, 1, 2, 0] = np.nan
    lses[2, 1, 1, 3] = np.nan
    for order in F.MERGE_ORDERS:
        (context, lse), _ = F.merge_attention_forward(contexts, lses, order)
        assert np.isnan(context[0, 1, 2, 0]) and np.isnan(context[1, 1, 3]).all() and np.isnan(lse[1, 1, 3])
        assert np.isnan(context).sum() == 1 + (D + 1) and np.isnan(lse).sum() == 1


@pytest.mark.parametrize("S", [2, 3, 4, 5])
def test_the_three_orders_agree_in_float64(S, rng):
    contexts, lses = partials(rng, S)
    (flat, flat_lse), _ = F.merge_attention_forward(contexts, lses)
    for order in ("sequential", "tree"):
        (context, lse), _ = F.merge_attention_forward(contexts, lses, order)
        assert rel_err(context, flat) <= 1e-15 and np.abs(lse - flat_lse)[np.isfinite(flat_lse)].max() <= 1e-14


def test_inputs_are_not_mutated_and_float32_stays_float32(rng):
    contexts, lses = partials(rng, 3, np.float32)
    before = contexts.copy(), lses.copy()
    (context, lse), cache = F.merge_attention_forward(contexts, lses, "tree")
    d_contexts, d_lses = F.merge_attention_backward(np.ones_like(context), cache)
    assert context.dtype == np.float32 and d_contexts[0].dtype == np.float32
    assert lse.dtype == np.float64 and d_lses[0].dtype == np.float64
    assert np.array_equal(contexts, before[0]) and np.array_equal(lses, before[1])


@pytest.mark.parametrize(
    "contexts, lses, match",
    [
        ([], [], "contexts must be a non-empty sequence"),
        (np.zeros((2, 1, 1, 2, 3)), np.zeros((3, 1, 1, 2)), "contexts has 2 partials but lses has 3"),
        ([np.zeros((1, 1, 2, 3)), np.zeros((1, 1, 2, 4))], np.zeros((2, 1, 1, 2)), r"contexts\[1\] is float64"),
        ([np.zeros((1, 1, 2, 3), np.float32), np.zeros((1, 1, 2, 3))], np.zeros((2, 1, 1, 2)), r"contexts\[1\]"),
        (np.zeros((2, 1, 1, 2, 3)), np.zeros((2, 1, 2, 1)), r"lses\[0\] has shape \(1, 2, 1\)"),
        ([np.zeros((1, 2, 3))], [np.zeros((1, 2))], r"contexts\[0\] must have 4 dimensions"),
        (np.zeros((1, 1, 1, 2, 3), int), np.zeros((1, 1, 1, 2)), r"contexts\[0\] must be a floating"),
    ],
)
def test_bad_partials_are_value_errors_naming_the_argument(contexts, lses, match):
    with pytest.raises(ValueError, match=match):
        F.merge_attention_forward(contexts, lses)


def test_bad_order_and_bad_upstream_gradients_are_value_errors(rng):
    contexts, lses = partials(rng, 2)
    with pytest.raises(ValueError, match="order must be one of"):
        F.merge_attention_forward(contexts, lses, order="ring")
    (context, _), cache = F.merge_attention_forward(contexts, lses)
    with pytest.raises(ValueError, match="d_context has shape"):
        F.merge_attention_backward(context[:, :1], cache)
    with pytest.raises(ValueError, match="d_lse has shape"):
        F.merge_attention_backward(context, cache, d_lse=np.zeros((B, H)))


# --------------------------------------------------------------------------- against the unsplit kernels


def shards(Lk: int, S: int, rng) -> list[np.ndarray]:
    """S disjoint key sets covering 0 ... Lk - 1, unequal and not contiguous (any partition merges exactly)."""
    cuts = np.sort(rng.choice(np.arange(1, Lk), S - 1, replace=False))
    return np.split(rng.permutation(Lk), cuts)


def split_attention(kernel, q, k, v, keys, mask=None, bias=None, sinks=None):
    """The kernel on each key set of ``keys`` (the sink given to the first), merged -> (context, lse), a backward
    (d_context, d_lse) -> (dq, dk, dv, d_bias or None, d_sinks or None) through the merge and each part."""
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    cut = [None if a is None else np.broadcast_to(a, shape) for a in (mask, bias)]  # (B, H, Lq, Lk) views
    parts = [kernel.forward(q, k[:, :, j], v[:, :, j], None if cut[0] is None else cut[0][..., j],
                            bias=None if cut[1] is None else cut[1][..., j].copy(), sinks=sinks if s == 0 else None)
             for s, j in enumerate(keys)]  # fmt: skip
    (context, lse), merge_cache = F.merge_attention_forward([c for c, _ in parts], [c.lse for _, c in parts])

    def backward(d_context, d_lse):
        d_contexts, d_lses = F.merge_attention_backward(d_context, merge_cache, d_lse)
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        d_bias = None if bias is None else np.zeros(shape)
        d_sinks = None
        for (_, cache), j, dc, dl in zip(parts, keys, d_contexts, d_lses):
            dq_s, dk_s, dv_s, db_s, ds_s = kernel.backward(dc, cache, d_lse=dl)
            dq += dq_s  # every part's keys reach every query
            dk[:, :, j], dv[:, :, j] = dk_s, dv_s  # a key belongs to one part
            if d_bias is not None:
                d_bias[..., j] = db_s
            d_sinks = ds_s if ds_s is not None else d_sinks
        return dq, dk, dv, None if bias is None else F.sum_to_shape(d_bias, np.shape(bias)), d_sinks

    return context, lse, backward


def close(a, b, tol=1e-12) -> bool:
    """|a - b| against the largest entry of b (a quantity 0 in theory is judged against the largest one); the -inf
    entries (an lse of a row with no key) must be the same."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    finite = np.isfinite(b)
    if not np.array_equal(np.isneginf(a), np.isneginf(b)) or not finite.any():
        return np.array_equal(np.isneginf(a), np.isneginf(b))
    return np.abs(a[finite] - b[finite]).max() <= tol * max(1.0, np.abs(b[finite]).max())


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "additive+padding", "fully masked rows"])
@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_every_kernel_on_key_shards_merged_is_the_kernel_on_all_keys(impl, options, kind, rng):
    """Forward (context and lse) and every gradient (dq, dk, dv through merge backward and each part's backward, with
    a d_lse), S = 1 ... 5, to 1e-12 in float64. Causal and fully masked rows leave parts empty for some rows."""
    kernel = kernels.get_kernel(impl, **options)
    Lk = 7
    q, k, v = (rng.standard_normal((B, H, n, D + e)) for n, e in ((LQ, 0), (Lk, 0), (Lk, 1)))
    mask = make_mask(kind, rng, B, H, LQ, Lk)
    whole, cache = kernel.forward(q, k, v, mask)
    d_context, d_lse = rng.standard_normal(whole.shape), rng.standard_normal(whole.shape[:3])
    expected = kernel.backward(d_context, cache, d_lse=d_lse)[:3]
    for S in range(1, 6):
        context, lse, backward = split_attention(kernel, q, k, v, shards(Lk, S, rng), mask)
        assert close(context, whole) and close(lse, cache.lse), (S, rel_err(context, whole))
        grads = backward(d_context, d_lse)[:3]
        assert all(close(g, e) for g, e in zip(grads, expected)), (S, [rel_err(g, e) for g, e in zip(grads, expected)])


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_a_bias_and_a_sink_merge_too(impl, options, rng):
    """A bias is cut with the keys (its gradient too); the sink is one more key of value 0: it joins one part."""
    kernel = kernels.get_kernel(impl, **options)
    Lk = 6
    q, k, v = (rng.standard_normal((B, H, n, D)) for n in (LQ, Lk, Lk))
    bias, sinks = rng.standard_normal((1, H, LQ, Lk)), rng.standard_normal(H)
    mask = make_mask("fully masked rows", rng, B, H, LQ, Lk)
    whole, cache = kernel.forward(q, k, v, mask, bias=bias, sinks=sinks)
    d_context, d_lse = rng.standard_normal(whole.shape), rng.standard_normal(whole.shape[:3])
    expected = kernel.backward(d_context, cache, d_lse=d_lse)
    context, lse, backward = split_attention(kernel, q, k, v, shards(Lk, 3, rng), mask, bias, sinks)
    assert close(context, whole) and close(lse, cache.lse)
    assert all(close(g, e) for g, e in zip(backward(d_context, d_lse), expected))


@pytest.mark.parametrize("impl, options", KERNEL_CASES, ids=IDS)
def test_float32_with_logits_of_1e4_merges_as_exactly_as_the_unsplit_kernel(impl, options, rng):
    """Scores of 1e4 (nearly one-hot rows, lses far from 0): the float64 lses carry log ℓ, the weights are formed in
    float64, so the merged float32 context errs against float64 no more than the kernel on all keys does."""
    kernel = kernels.get_kernel(impl, **options)
    Lk = 8
    q = 100 * rng.standard_normal((B, H, LQ, D))
    k = 100 * rng.standard_normal((B, H, Lk, D))
    v = rng.standard_normal((B, H, Lk, D))
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    reference, ref_cache = kernel.forward(*(a.astype(np.float64) for a in (q32, k32, v32)), scale=1.0)
    whole, _ = kernel.forward(q32, k32, v32, scale=1.0)
    eps = np.finfo(np.float32).eps
    for order in F.MERGE_ORDERS:
        parts = [kernel.forward(q32, k32[:, :, j], v32[:, :, j], scale=1.0) for j in shards(Lk, 4, rng)]
        (context, lse), _ = F.merge_attention_forward([c for c, _ in parts], [c.lse for _, c in parts], order)
        assert context.dtype == np.float32 and np.isfinite(context).all() and np.isfinite(lse).all()
        assert np.abs(context - reference).max() <= max(8 * eps, 2 * np.abs(whole - reference).max())
        assert np.abs(lse - ref_cache.lse).max() <= 8 * eps * np.abs(ref_cache.lse).max()  # ~1e4: the scores' own
