"""What only the chunked kernel has: tiles skipped under a causal mask, dropout regenerated tile by
tile, its arguments, memory that grows like L·block, the BLAS limit under concurrent callers, and
agreement with torch. Everything every kernel must do is in test_kernels.py."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest
from conftest import make_mask
from helpers import SATURATION_GAP, SATURATION_MASKS, error_against_exact, rel_err, require_torch, saturated_case
from reference import exact_attention_backward

from mha_numpy import MultiHeadAttention, kernels, masks
from mha_numpy.kernels import ChunkedKernel

B, H, LQ, LK, D = 2, 2, 7, 5, 3


def qkv(rng, dtype=np.float64):
    return tuple(rng.standard_normal((B, H, n, f)).astype(dtype) for n, f in ((LQ, D), (LK, D), (LK, D + 1)))


def test_causal_mask_skips_the_tiles_above_the_diagonal():
    # A tile that is computed multiplies its (all-zero) weights by V: NaN in V would leak in as 0·NaN.
    # With block 4, queries 0-3 must never touch keys 4-7, so NaN there leaves those rows finite.
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 1, 8, 3)) for _ in range(3))
    v[0, 0, 4:] = np.nan
    ctx, cache = ChunkedKernel(block_size=4, num_threads=1).forward(q, k, v, masks.causal_mask(8))
    assert np.isfinite(ctx[0, 0, :4]).all()
    assert np.isnan(ctx[0, 0, 4:]).all()  # the test would be vacuous if NaN never propagated
    ref, _ = kernels.VectorizedKernel().forward(q[..., :4, :], k[..., :4, :], v[..., :4, :], masks.causal_mask(4))
    assert rel_err(ctx[0, 0, :4], ref[0, 0]) <= 1e-12


@pytest.mark.parametrize("kind", ["causal", "window", "float causal", "padding", "per head", "dropout mask"])
def test_tiles_with_blocked_and_allowed_positions_are_cut_and_stay_exact(monkeypatch, kind):
    """Parts of mixed tiles (down to 2 × 2 here) give the vectorized kernel's outputs and gradients, bias included."""
    from mha_numpy.kernels import chunked

    monkeypatch.setattr(chunked, "MIN_PART", 2)
    sizes = []
    parts = chunked._Tiles.parts

    def recording(self, *tile):
        for part in parts(self, *tile):
            sizes.append((part[1] - part[0], part[3] - part[2]))
            yield part

    monkeypatch.setattr(chunked._Tiles, "parts", recording)
    rng = np.random.default_rng(17)
    B_, H_, L, d = 2, 3, 19, 4
    q, k, v = (rng.standard_normal((B_, H_, L, d)) for _ in range(3))
    bias = rng.standard_normal((1, H_, L, L))
    mask = {
        "causal": masks.causal_mask(L),
        "window": masks.sliding_window_mask(L, L, 5),
        "float causal": np.where(masks.causal_mask(L), 0.0, -np.inf),
        "padding": np.arange(L) < np.array([7, 0])[:, None, None, None],  # (B, 1, 1, L): batch item 1 fully masked
        "per head": rng.random((1, H_, L, L)) < 0.5,
        "dropout mask": masks.causal_mask(L),
    }[kind]
    extra = dict(dropout_p=0.25, dropout_mask=rng.random((B_, H_, L, L)) >= 0.25) if kind == "dropout mask" else {}
    kernel = ChunkedKernel(block_size=8, num_threads=2)
    ctx, cache = kernel.forward(q, k, v, mask, bias=bias, **extra)
    ref, ref_cache = kernels.VectorizedKernel().forward(q, k, v, mask, bias=bias, **extra)
    assert any(r in (2, 4) for r, _ in sizes), sizes  # tiles are 8 or 3 wide (L = 19): a 4 or a 2 is a cut part
    d_ctx = rng.standard_normal(ctx.shape)
    grads, ref_grads = kernel.backward(d_ctx, cache), kernels.VectorizedKernel().backward(d_ctx, ref_cache)
    scale = max(np.abs(g).max() for g in ref_grads[:4])
    assert np.abs(ctx - ref).max() <= 1e-13 * np.abs(ref).max()
    assert all(np.abs(a - b).max() <= 1e-13 * scale for a, b in zip(grads[:4], ref_grads[:4]))


def test_one_head_is_split_into_key_ranges_of_equal_work_and_the_result_does_not_depend_on_threads():
    """B = 1, H = 1 on 3 threads: the key blocks are cut into 3 ranges with about as many non-empty tiles each
    (under a causal mask the early key blocks have more), and every thread count gives the same gradients."""
    from mha_numpy.kernels.chunked import _key_ranges

    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 1, 24, 3)) for _ in range(3))
    mask = masks.causal_mask(24)
    kernel = ChunkedKernel(block_size=2, num_threads=3)
    _, cache = kernel.forward(q, k, v, mask)
    ranges = _key_ranges(cache._tiles(0, slice(0, 1)), 24, 24, 2, 2, 3)
    assert ranges[0][0] == 0 and ranges[-1][1] == 24 and len(ranges) == 3
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous
    tiles = [sum(12 - j // 2 for j in range(*r, 2)) for r in ranges]  # key block j//2 has 12 - j//2 tiles
    assert max(tiles) - min(tiles) <= 12 and ranges[0][1] < 8  # equal work, not equal length (that is 8 each)
    d_context = rng.standard_normal((1, 1, 24, 3))
    grads = kernel.backward(d_context, cache)
    again = kernel.backward(d_context, cache)
    assert all(np.array_equal(a, b) for a, b in zip(grads[:3], again[:3]))  # a fixed order of summation
    one = ChunkedKernel(block_size=2, num_threads=1)
    ref = one.backward(d_context, one.forward(q, k, v, mask)[1])
    assert all(rel_err(a, b) <= 1e-13 for a, b in zip(grads[:3], ref[:3]))


@pytest.mark.parametrize("block_size", [1, 3, 64])
def test_dropout_regenerates_the_same_tiles_in_the_backward(block_size):
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng)
    kernel = ChunkedKernel(block_size=block_size, num_threads=2)
    ctx, cache = kernel.forward(q, k, v, dropout_p=0.3, rng=np.random.default_rng(1))
    keep = cache.dropout_mask  # assembled from the per-tile generators, on request
    ref_ctx, ref_cache = kernels.VectorizedKernel().forward(q, k, v, dropout_p=0.3, dropout_mask=keep)
    assert rel_err(ctx, ref_ctx) <= 1e-12
    d = rng.standard_normal(ctx.shape)
    for a, b in zip(kernel.backward(d, cache)[:3], kernels.VectorizedKernel().backward(d, ref_cache)[:3]):
        assert rel_err(a, b) <= 1e-12


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(impl="fast"), "impl"),
        (dict(impl="chunked", block_size=0), "block_size"),
        (dict(impl="chunked", block_size=2.5), "block_size"),
        (dict(impl="chunked", num_threads=0), "num_threads"),
        (dict(impl="chunked", num_threads="2"), "num_threads"),
        (dict(impl="vectorized", block_size=16), "block_size"),
        (dict(impl="naive", num_threads=2), "num_threads"),
        (dict(impl=ChunkedKernel(), block_size=16), "block_size"),
        (dict(impl=42), "impl"),
    ],
)
def test_bad_impl_arguments_raise_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(6, 2, **kwargs)


def test_kernel_options_are_checked_when_assigned_after_construction_too():
    """Reliability 9: ``kernel.block_size = 0`` after construction silently meant the default; AutoKernel("abc")
    and AutoKernel(None) crashed in int() while 2.7 became 2 and -5 was taken."""
    kernel = ChunkedKernel(block_size=4, num_threads=2)
    for name in ("block_size", "num_threads"):
        for bad in (0, -1, 2.5, "2", True):
            with pytest.raises(ValueError, match=rf"^{name} must be a positive int"):
                setattr(kernel, name, bad)
        assert getattr(kernel, name) in (2, 4)  # a refused value leaves the old one
    kernel.block_size, kernel.num_threads = np.int64(3), None
    assert kernel.block_size == 3 and type(kernel.block_size) is int and kernel.threads() >= 1
    for bad in ("abc", None, 2.7, -5, True, float("inf")):
        with pytest.raises(ValueError, match="^min_chunked_scores must be a non-negative int"):
            kernels.AutoKernel(bad)
        with pytest.raises(ValueError, match="^min_chunked_scores must be"):
            kernels.get_kernel("auto", min_chunked_scores=bad) if bad is not None else kernels.AutoKernel(bad)
    auto = kernels.AutoKernel(np.int32(0))
    assert auto.choose((1, 1, 1, 1)) is auto.chunked  # 0: every call on the chunked kernel
    with pytest.raises(ValueError, match="^min_chunked_scores"):
        auto.min_chunked_scores = -1
    assert auto.min_chunked_scores == 0


def test_a_kernel_object_with_its_own_options_is_accepted():
    kernel = ChunkedKernel(block_size=2, num_threads=1)
    mha = MultiHeadAttention(6, 2, impl=kernel, rng=0)
    x = np.random.default_rng(0).standard_normal((1, 5, 6))
    out, cache = mha.forward(x, x, x)
    assert cache.attention.kernel is kernel and mha.impl == "chunked"
    ref = MultiHeadAttention(6, 2, rng=0)
    assert rel_err(out, ref.forward(x, x, x)[0]) <= 1e-12


def test_bad_shapes_raise_before_any_work():
    q = np.zeros((1, 2, 3, 4))
    kernel = ChunkedKernel()
    with pytest.raises(ValueError, match="head dim"):
        kernel.forward(q, np.zeros((1, 2, 3, 5)), q)
    with pytest.raises(ValueError, match="mask"):
        kernel.forward(q, q, q, mask=np.ones((2, 2), bool))
    _, cache = kernel.forward(q, q, q)
    with pytest.raises(ValueError, match="d_context"):
        kernel.backward(np.zeros((1, 2, 3, 3)), cache)


def test_finite_minus_infinity_masks_give_the_vectorized_weights_and_gradients():
    """The defect of FlashAttention's lse = m + log ℓ: with m = finfo.min, log ℓ is absorbed and a fully
    blocked row's recomputed weights summed to Lk. m and ℓ are kept apart, so they match exactly."""
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng)
    for value in (np.finfo(np.float64).min, -1e9, -1e4):
        mask = np.where(make_mask("fully masked rows", rng, B, H, LQ, LK), 0.0, value)
        d = rng.standard_normal((B, H, LQ, D + 1))
        ctx, cache = ChunkedKernel(block_size=2, num_threads=2).forward(q, k, v, mask)
        ref_ctx, ref_cache = kernels.VectorizedKernel().forward(q, k, v, mask)
        np.testing.assert_allclose(cache.attn_weights.sum(-1), 1.0, rtol=1e-12)
        assert rel_err(cache.attn_weights, ref_cache.attn_weights) <= 1e-12, value
        assert rel_err(ctx, ref_ctx) <= 1e-12, value
        grads = ChunkedKernel(block_size=2).backward(d, cache)
        ref = kernels.VectorizedKernel().backward(d, ref_cache)
        scale = max(np.abs(g).max() for g in ref[:3])  # zero-in-theory entries judged against the largest
        for name, a, b in zip("qkv", grads, ref):
            assert np.abs(a - b).max() <= 1e-12 * scale, (value, name)


@pytest.mark.parametrize("extra", ["none", "bias", "dropout mask"])
@pytest.mark.parametrize("rows", list(SATURATION_GAP))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_saturated_rows_are_within_a_few_ulps_of_exact_arithmetic(dtype, rows, extra):
    """A row whose top weight P_ij* = 1/ℓ is at least 1/2 gets its pivot entry as dS_ij* = -Σ_{j≠j*} dS_ij, whose
    error vanishes with 1 - P_ij*: every gradient (d_bias included) within 16 ulps of exact arithmetic, judged against
    the largest, on each mask of the saturated cases, on one thread, two threads (the keys split) and one tile.
    With FlashAttention's D alone 16 of these 18 cases failed, by up to 8.6e3 ulps. Stricter than the conformance
    test's 'as exact as the plain path': near saturation the plain path's own rounded Σ_j P_ij dP_ij is off by tens
    of ulps of the largest gradient (docs/derivation.md § 13)."""
    rng = np.random.default_rng(3)
    for mask_kind in SATURATION_MASKS:
        q, k, v, d, mask = saturated_case(rows, mask_kind, dtype)
        kw, ref_kw = {}, {}
        if extra == "bias":
            kw["bias"] = ref_kw["bias"] = rng.standard_normal((1, 1, 7, 9)).astype(dtype)
        if extra == "dropout mask":
            keep = rng.random((1, 1, 7, 9)) >= 0.2
            kw, ref_kw = dict(dropout_p=0.2, dropout_mask=keep), dict(keep=keep, p=0.2)
        exact = exact_attention_backward(*(a.astype(np.float64) for a in (q, k, v, d)), mask=mask, **ref_kw)
        n = 4 if extra == "bias" else 3  # d_bias is dS itself: the bias has the scores' shape
        for kernel in (ChunkedKernel(block_size=2, num_threads=2), ChunkedKernel(block_size=3, num_threads=1),
                       ChunkedKernel()):  # fmt: skip
            grads = kernel.backward(d, kernel.forward(q, k, v, mask, scale=1.0, **kw)[1])
            error = error_against_exact(grads[:n], exact[:n]) / np.finfo(dtype).eps
            assert error <= 16, f"{mask_kind}, {kernel}: {error:.3g} ulps"


def peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_memory_grows_with_L_times_block_not_L_squared():
    # One head, E = 8, float32. At L = 4096 one vectorized score tensor alone is 64 MiB; the chunked
    # path keeps a few (128 × 128) tiles and O(L·E) activations: well under 8 MiB.
    rng = np.random.default_rng(9)

    def run(impl, L, **kw):
        mha = MultiHeadAttention(8, 1, dtype=np.float32, rng=0, impl=impl, **kw)
        x = rng.standard_normal((1, L, 8)).astype(np.float32)
        d_output = rng.standard_normal((1, L, 8)).astype(np.float32)

        def fwd_bwd():
            out, cache = mha.forward(x, x, x)
            mha.backward(d_output, cache)

        return peak_mib(fwd_bwd)

    chunked_4096 = run("chunked", 4096, block_size=128, num_threads=1)
    chunked_1024 = run("chunked", 1024, block_size=128, num_threads=1)
    vectorized_4096 = run("vectorized", 4096)
    assert chunked_4096 < 8.0 < 64.0 < vectorized_4096, (chunked_4096, vectorized_4096)
    assert chunked_4096 < 6 * chunked_1024  # ~linear in L (4×), where L² would give 16×


def test_concurrent_callers_leave_blas_threads_as_they_found_them():
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="threadpoolctl is in requirements.txt")
    before = [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((2, 2, 256, 8)) for _ in range(3))
    ref, _ = kernels.VectorizedKernel().forward(q, k, v)
    errors = []

    def call():
        for _ in range(5):
            ctx, cache = ChunkedKernel(block_size=32, num_threads=2).forward(q, k, v)
            ChunkedKernel(block_size=32, num_threads=2).backward(ctx, cache)
            if rel_err(ctx, ref) > 1e-12:
                errors.append(rel_err(ctx, ref))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]
    assert not errors and after == before


def test_a_pool_item_that_calls_the_pool_again_runs_inline_instead_of_deadlocking():
    """A chunked kernel (or a pooled product) inside a pool item, e.g. a BERT band: waiting for the pool from
    one of its own threads would wait forever. Run in a thread with a timeout, so a regression fails, not hangs."""
    from mha_numpy.threads import pooled_matmul, run_items

    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 64, 4)) for _ in range(3))
    ref, _ = kernels.VectorizedKernel().forward(q, k, v)
    a = rng.standard_normal((10, 3))
    results = {}

    def item(i):
        results[i] = (ChunkedKernel(block_size=16, num_threads=2).forward(q, k, v)[0], pooled_matmul(a, a.T, 2))

    t = threading.Thread(target=lambda: run_items(item, [0, 1, 2], 2), daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "nested use of the pool deadlocked"
    assert sorted(results) == [0, 1, 2]
    assert all(rel_err(ctx, ref) < 1e-13 and rel_err(prod, a @ a.T) < 1e-13 for ctx, prod in results.values())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, threads", [(1, 2), (2, 2), (7, 2), (64, 3), (5, 1)])
def test_pooled_matmul_is_the_product_on_bands_of_rows(n, threads, dtype):
    from mha_numpy.threads import pooled_matmul

    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, 9)).astype(dtype), rng.standard_normal((6, 9)).astype(dtype).T
    a_before = a.copy()
    out = pooled_matmul(a, b, threads)
    assert out.dtype == dtype and out.shape == (n, 6) and np.array_equal(a, a_before)
    np.testing.assert_allclose(
        out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5 if dtype == np.float32 else 1e-13
    )
    np.testing.assert_allclose(pooled_matmul(b.T, a.T, threads), (a @ b).T, rtol=1e-5, atol=1e-6)  # a transposed view


def test_the_module_runs_every_product_of_a_call_on_its_kernels_matmul():
    """Projections included: with the chunked kernel's pool, no product leaves BLAS's threads spinning."""
    calls = []

    class Counting(ChunkedKernel):
        def matmul(self, a, b):
            calls.append((a.shape, b.shape))
            return super().matmul(a, b)

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 8))
    for impl, kv in ((Counting(block_size=4, num_threads=2), x), (Counting(block_size=4, num_threads=2), x[:, :5])):
        calls.clear()
        mha = MultiHeadAttention(8, 2, rng=0, impl=impl)
        ref = MultiHeadAttention(8, 2, rng=0)
        out, cache = mha.forward(x, kv, kv)
        n_forward = len(calls)
        grads = mha.backward(out, cache)
        ref_out, ref_cache = ref.forward(x, kv, kv)
        ref_grads = ref.backward(out, ref_cache)
        assert (n_forward, len(calls)) == ((2, 2 + 2 + 3 * 2) if kv is x else (4, 4 + 2 + 3 * 2))
        scale = max(np.abs(g).max() for g in ref_grads.values())  # db_k is 0 in theory: judged against the largest
        assert rel_err(out, ref_out) < 1e-13
        assert all(np.abs(grads[n] - ref_grads[n]).max() < 1e-12 * scale for n in ref_grads)


def test_matches_torch_sdpa_and_mha_in_float64():
    torch = require_torch()
    rng = np.random.default_rng(7)
    q, k, v = qkv(rng)
    mask = make_mask("additive+padding", rng, B, H, LQ, LK)
    d_context = rng.standard_normal((B, H, LQ, D + 1))
    kernel = ChunkedKernel(block_size=3, num_threads=2)
    ctx, cache = kernel.forward(q, k, v, mask)
    grads = kernel.backward(d_context, cache)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    t_ctx = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(mask))
    t_ctx.backward(torch.tensor(d_context))
    assert rel_err(ctx, t_ctx.detach().numpy()) <= 1e-10
    for g, t in zip(grads, (tq, tk, tv)):
        assert rel_err(g, t.grad.numpy()) <= 1e-10

    mha = MultiHeadAttention(6, 2, rng=3, impl="chunked", block_size=2)
    for name in ("b_q", "b_k", "b_v", "b_o"):
        mha.params[name][...] = rng.normal(0, 0.5, 6)
    P, x = mha.params, rng.standard_normal((B, 5, 6))
    out, cache = mha.forward(x, x, x, masks.causal_mask(5))
    d_output = rng.standard_normal(out.shape)
    g = mha.backward(d_output, cache)
    t = {n: torch.tensor(p, requires_grad=True) for n, p in P.items()}
    tx = torch.tensor(x.transpose(1, 0, 2).copy(), requires_grad=True)  # (L, B, E), torch's default layout
    t_out, _ = torch.nn.functional.multi_head_attention_forward(
        tx, tx, tx, 6, 2, torch.cat([t["W_q"], t["W_k"], t["W_v"]]), torch.cat([t["b_q"], t["b_k"], t["b_v"]]),
        None, None, False, 0.0, t["W_o"], t["b_o"],
        attn_mask=torch.tensor(masks.to_torch_attn_mask(masks.causal_mask(5))), need_weights=False,
    )  # fmt: skip
    t_out.backward(torch.tensor(d_output.transpose(1, 0, 2).copy()))
    assert rel_err(out, t_out.detach().numpy().transpose(1, 0, 2)) <= 1e-10
    assert rel_err(g["query"] + g["key"] + g["value"], tx.grad.numpy().transpose(1, 0, 2)) <= 1e-10
    for name in P:
        assert np.abs(g[name] - t[name].grad.numpy()).max() <= 1e-10 * max(1.0, np.abs(g[name]).max()), name


@pytest.mark.parametrize("Lq", [1, 3])
def test_a_bias_broadcast_over_every_axis_takes_the_pivot_rows_of_every_row(Lq):
    """Regression (found by test_combinations' random search): no keys but torch's bias_kv one and a relative-position
    bias, so the bias is (1, 1, Lq, 1); at Lq = 1 it broadcasts over every axis and each row's pivot entry (its
    only key, P = 1) must add into the one bias entry, not fail. Every gradient as the vectorized kernel's."""
    rng = np.random.default_rng(0)
    q, kv, d_out = rng.standard_normal((2, Lq, 4)), np.zeros((2, 0, 4)), rng.standard_normal((2, Lq, 4))
    grads, rel_bias = [], rng.standard_normal((1, 5))  # (H, 2R + 1): a bias that is not 0
    for impl in ("vectorized", ChunkedKernel(block_size=2, num_threads=2)):
        mha = MultiHeadAttention(4, 1, rng=0, impl=impl, add_bias_kv=True, rel_pos_max_distance=2)
        mha.params["rel_bias"] = rel_bias.copy()
        out, cache = mha(q, kv, kv)
        grads.append(mha.backward(d_out, cache))
    largest = max(np.abs(g).max() for g in grads[0].values() if g.size)
    for name, g in grads[0].items():
        assert np.abs(grads[1][name] - g).max(initial=0) <= 1e-13 * largest, name


def test_the_profiling_script_runs_and_its_shares_add_up(capsys):
    """benchmarks/profile_chunked.py (issue 27, item 4) still runs against the kernel's API, and its tile profile
    splits a tile into products, exps and other passes that add up to the whole (no timing is checked)."""
    import importlib.util
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "profile_chunked.py"
    spec = importlib.util.spec_from_file_location("profile_chunked", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--no-torch", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    shares = re.search(r"products (\d+)%, the 2 exps (\d+)%, the other passes (\d+)%", out)
    assert shares is not None, out
    assert 98 <= sum(int(x) for x in shares.groups()) <= 102  # each share rounded to a percent
    assert "the bare calls" in out
