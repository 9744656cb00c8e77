"""``MultiHeadAttention(recompute=True)``: the same outputs and gradients as the default path, less memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from conftest import make_mask
from helpers import grad_check

from mha_numpy import KVCache, MultiHeadAttention, kernels

B, LQ, LK, E, H = 2, 5, 7, 8, 4
KERNELS = [("vectorized", {}), ("naive", {}), ("chunked", dict(block_size=2, num_threads=2)), ("auto", {})]
KERNELS += [("chunked", dict(block_size=3, num_threads=1))]
KIDS = [n + "".join(f"-{k[0]}{v}" for k, v in o.items()) for n, o in KERNELS]
VARIANTS = {
    "plain": {},
    "no bias": dict(bias=False),
    "kdim vdim": dict(kdim=5, vdim=3),
    "gqa": dict(num_kv_heads=2),
    "mqa": dict(num_kv_heads=1),
    "rope": dict(rope_theta=100.0),
    "alibi": dict(alibi=True),
    "rel bias": dict(rel_pos_max_distance=2),
    "rel bias + alibi + gqa": dict(rel_pos_max_distance=3, alibi=True, num_kv_heads=2),
}


def pair(impl, options, dtype=np.float64, **kw):
    """(default module, recompute module) with the same random parameters (nonzero biases)."""
    mods = [
        MultiHeadAttention(E, H, dtype=dtype, rng=3, impl=kernels.get_kernel(impl, **options), recompute=r, **kw)
        for r in (False, True)
    ]
    rng = np.random.default_rng(5)
    for name, p in mods[0].params.items():
        p[...] = rng.normal(0, 0.5, p.shape) if name.startswith("b_") else p
        mods[1].params[name] = p.copy()
    return mods


def inputs(rng, mha, self_attention, dtype=np.float64):
    if self_attention:
        x = rng.standard_normal((B, LQ, E)).astype(dtype)
        return x, x, x
    return tuple(rng.standard_normal((B, n, f)).astype(dtype) for n, f in ((LQ, E), (LK, mha.kdim), (LK, mha.vdim)))


def max_err(a: dict, b: dict) -> float:
    """max |a - b| over every gradient, relative to the largest gradient entry of a (zero-in-theory ones included)."""
    largest = max(np.abs(g).max() for g in a.values())
    return max(float(np.abs(a[n] - b[n]).max()) for n in a) / largest


def compare(default, lean, query, key, value, **call):
    out, cache = default.forward(query, key, value, **call)
    out_r, cache_r = lean.forward(query, key, value, **call)
    d_out = np.random.default_rng(9).standard_normal(out.shape).astype(out.dtype)
    grads, grads_r = default.backward(d_out, cache), lean.backward(d_out, cache_r)
    assert out_r.dtype == out.dtype and all(grads_r[n].dtype == out.dtype for n in grads)
    assert list(grads_r) == list(grads) and all(grads_r[n].shape == grads[n].shape for n in grads)
    return np.abs(out_r - out).max() / np.abs(out).max(), max_err(grads, grads_r), cache, cache_r


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("impl, options", KERNELS, ids=KIDS)
def test_recompute_matches_the_default_path(impl, options, variant, rng):
    default, lean = pair(impl, options, **VARIANTS[variant])
    self_attention = "kdim" not in variant and variant != "rope"  # RoPE with Lq != Lk: a cross-attention case too
    query, key, value = inputs(rng, default, self_attention)
    for kind in ("none", "causal", "additive+padding", "fully masked rows"):
        mask = make_mask(kind, rng, B, H, LQ, key.shape[1])
        out_err, grad_err, cache, cache_r = compare(default, lean, query, key, value, mask=mask)
        assert out_err <= 1e-13 and grad_err <= 1e-13, (kind, out_err, grad_err)
        assert np.abs(cache_r.attn_weights - cache.attn_weights).max() <= 1e-14


@pytest.mark.parametrize("impl, options", KERNELS, ids=KIDS)
def test_a_given_dropout_mask_is_used_head_by_head(impl, options, rng):
    default, lean = pair(impl, options, dropout=0.4, num_kv_heads=2)
    query, key, value = inputs(rng, default, False)
    keep = rng.random((B, H, LQ, LK)) >= 0.4
    out_err, grad_err, _, cache_r = compare(default, lean, query, key, value, training=True, dropout_mask=keep)
    assert out_err <= 1e-13 and grad_err <= 1e-13
    assert np.array_equal(cache_r.dropout_mask, keep)


@pytest.mark.parametrize("impl, options", KERNELS, ids=KIDS)
def test_sampled_dropout_is_replayed_exactly_by_the_backward(impl, options, rng):
    """The backward recomputes each group with the forward's keep-mask: the default path given that mask agrees."""
    default, lean = pair(impl, options, dropout=0.5, rel_pos_max_distance=2)
    x, _, _ = inputs(rng, default, True)
    mask = make_mask("causal", rng, B, H, LQ, LQ)
    out_r, cache_r = lean.forward(x, x, x, mask=mask, training=True)
    keep = cache_r.dropout_mask
    assert keep.shape == (B, H, LQ, LQ) and 0.2 < keep.mean() < 0.8
    assert not np.array_equal(keep[:, 0], keep[:, 1])  # each group draws its own
    out, cache = default.forward(x, x, x, mask=mask, training=True, dropout_mask=keep)
    d_out = rng.standard_normal(out.shape)
    assert np.abs(out_r - out).max() <= 1e-13 * np.abs(out).max()
    assert max_err(default.backward(d_out, cache), lean.backward(d_out, cache_r)) <= 1e-13
    out_again, cache_again = lean.forward(x, x, x, mask=mask, training=True)  # the next call: new draws
    assert not np.array_equal(cache_again.dropout_mask, keep)


@pytest.mark.parametrize("impl, options", KERNELS, ids=KIDS)
def test_float32_stays_float32_and_agrees(impl, options, rng):
    default, lean = pair(impl, options, dtype=np.float32, num_kv_heads=2, rope_theta=50.0)
    x, _, _ = inputs(rng, default, True, np.float32)
    out_err, grad_err, _, _ = compare(default, lean, x, x, x, mask=make_mask("causal", rng, B, H, LQ, LQ))
    assert out_err <= 1e-5 and grad_err <= 1e-5


@pytest.mark.parametrize("variant", ["plain", "rel bias + alibi + gqa"])
def test_finite_differences_with_a_random_upstream_gradient(variant, rng):
    _, lean = pair("chunked", dict(block_size=2, num_threads=2), **VARIANTS[variant])
    query, key, value = inputs(rng, lean, False)
    mask = make_mask("causal", rng, B, H, LQ, LK)
    names = ["query", "key", "value", *lean.params]

    def forward(query, key, value, **params):
        lean.params.update(params)
        return lean.forward(query, key, value, mask=mask)

    def backward(d_out, cache):
        grads = lean.backward(d_out, cache)
        return tuple(grads[n] for n in names)

    arrays = dict(query=query, key=key, value=value, **{n: p.copy() for n, p in lean.params.items()})
    grad_check(forward, backward, arrays, names)


def test_recompute_is_checked_and_refuses_a_kv_cache(rng):
    with pytest.raises(ValueError, match="recompute"):
        MultiHeadAttention(E, H, recompute="yes")
    lean = MultiHeadAttention(E, H, recompute=True)
    assert "recompute=True" in repr(lean)
    x = rng.standard_normal((1, 3, E))
    with pytest.raises(ValueError, match="kv_cache"):
        lean.forward(x, x, x, kv_cache=KVCache())
    out, cache = lean.forward(x, x, x)
    with pytest.raises(ValueError, match="another MultiHeadAttention"):
        MultiHeadAttention(E, H, recompute=True).backward(out, cache)
    with pytest.raises(ValueError, match="d_output"):
        lean.backward(out[:, :2], cache)


def peak_beyond(mha, x, d_out) -> float:
    """tracemalloc peak of forward + backward minus the output and the gradients (bytes)."""
    tracemalloc.start()
    try:
        out, cache = mha.forward(x, x, x)
        grads = mha.backward(d_out, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - out.nbytes - sum(g.nbytes for g in grads.values())


def test_memory_is_a_few_head_sized_arrays():
    """L = 4096, E = 256, H = 4, float32, chunked on 2 threads, self-attention. Beyond the output and the gradients,
    recompute holds one head's arrays of (L, d): q, k, v, context, d_context (5), the kernel's dq, dk, dv (3), its
    scaled q and [dO, -D] (2) and one dQ partial of the key split (1), so 11, plus two tiles per thread; the
    default path keeps q, k, v and the context of every head, then their gradients (about 33 (L, d) arrays)."""
    L, threads, block = 4096, 2, 256
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, L, 256)).astype(np.float32)
    d_out = rng.standard_normal((1, L, 256)).astype(np.float32)
    kw = dict(dtype=np.float32, rng=0, impl="chunked", num_threads=threads, block_size=block)
    head = L * (256 // 4) * 4  # one (L, d) float32 array: 1 MiB
    tile = block * block * 4  # 256 KiB
    lean = peak_beyond(MultiHeadAttention(256, 4, recompute=True, **kw), x, d_out)
    full = peak_beyond(MultiHeadAttention(256, 4, **kw), x, d_out)
    assert lean <= 12 * head + 4 * threads * tile, (lean / head, full / head)  # 11 arrays + 1 of slack, tiles
    assert lean <= 0.45 * full, (lean / head, full / head)


def test_rope_positions_and_empty_inputs(rng):
    default, lean = pair("chunked", dict(block_size=2, num_threads=2), rope_theta=30.0, num_kv_heads=2)
    x, _, _ = inputs(rng, default, True)
    positions = rng.integers(0, 50, (B, LQ))
    out_err, grad_err, _, _ = compare(default, lean, x, x, x, positions=positions)
    assert out_err <= 1e-13 and grad_err <= 1e-13
    empty = np.zeros((B, 0, E))
    out, cache = lean.forward(empty, empty, empty)
    grads = lean.backward(out, cache)
    assert out.shape == (B, 0, E) and grads["query"].shape == (B, 0, E) and not grads["W_q"].any()
