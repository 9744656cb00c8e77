"""MultiHeadAttention with today's variants: grouped-query heads (num_kv_heads), rotary positions (rope_theta,
positions=), ALiBi (alibi=True), sliding windows (a mask) and the KV cache (kv_cache=), on every kernel.

Forward against the independent per-head reference in ``variants_reference``; every gradient against central
differences with a random upstream gradient; cached decoding against the full causal forward.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from variants_reference import reference_mha

from mha_numpy import KVCache, MultiHeadAttention, masks
from mha_numpy.gradcheck import check_function, numerical_gradient
from mha_numpy.kernels import KERNELS as REGISTRY

KERNELS = list(REGISTRY)  # every registered kernel, unchanged
RTOL_TARGET = 1e-7


def make(H=4, Hkv=2, d=4, theta=None, alibi=False, impl="vectorized", bias=True, dtype=np.float64, seed=0, **kw):
    rng = np.random.default_rng(seed)
    mha = MultiHeadAttention(
        H * d, H, num_kv_heads=Hkv, rope_theta=theta, alibi=alibi, impl=impl, bias=bias, dtype=dtype, rng=seed, **kw
    )
    for name, p in mha.params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.5, p.shape)  # nonzero biases, so bias bugs show
    return mha, rng


def mask_of(kind, B, Lq, Lk):
    return {
        "none": None,
        "causal": masks.causal_mask(Lq, Lk),
        "padding": masks.padding_mask(np.array([Lk] + [max(1, Lk - 2)] * (B - 1)), Lk),
        "sliding": masks.sliding_window_mask(Lq, Lk, 2),
        "sliding-symmetric": masks.sliding_window_mask(Lq, Lk, 2, causal=False),
    }[kind]


def keep_of(mask, B, H, Lq, Lk):
    return None if mask is None else np.broadcast_to(mask, (B, H, Lq, Lk))


# --------------------------------------------------------------------------- construction


def test_grouped_projections_have_num_kv_heads_rows():
    mha, _ = make(H=6, Hkv=2, d=4, kdim=5, vdim=7)
    P = mha.params
    assert P["W_q"].shape == (24, 24) and P["W_o"].shape == (24, 24)
    assert P["W_k"].shape == (8, 5) and P["W_v"].shape == (8, 7)
    assert P["b_k"].shape == (8,) and P["b_v"].shape == (8,)
    assert mha.num_kv_heads == 2
    assert MultiHeadAttention(8, 2).num_kv_heads == 2  # None means num_heads


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(embed_dim=12, num_heads=4, num_kv_heads=3), "num_heads=4 is not a multiple of num_kv_heads=3"),
        (dict(embed_dim=12, num_heads=4, num_kv_heads=0), "num_kv_heads"),
        (dict(embed_dim=12, num_heads=4, num_kv_heads=8), "num_kv_heads"),
        (dict(embed_dim=12, num_heads=4, rope_theta=1e4), "head dim"),
        (dict(embed_dim=8, num_heads=2, rope_theta=-1.0), "rope_theta"),
        (dict(embed_dim=8, num_heads=2, rope_theta="big"), "rope_theta"),
    ],
)
def test_bad_construction_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_bad_positions_name_the_argument():
    mha, rng = make(theta=100.0)
    x = rng.standard_normal((2, 3, 16))
    for bad in (np.arange(4), np.zeros((3, 3)), np.zeros((2, 3, 1)), np.array([0.0, np.nan, 1.0]), np.array(["a"] * 3)):
        with pytest.raises(ValueError, match="positions"):
            mha.forward(x, x, x, positions=bad)
    with pytest.raises(ValueError, match="positions"):
        mha.forward(x, x[:, :2], x[:, :2], positions=np.arange(3))  # Lq != Lk: positions of which?


# --------------------------------------------------------------------------- every combination vs the reference

COMBOS = list(
    itertools.product(
        [(4, 4), (4, 2), (4, 1)],  # (H, Hkv): MHA, GQA, MQA
        [None, 50.0],  # RoPE off / on
        [False, True],  # ALiBi off / on
        ["none", "causal", "padding", "sliding", "sliding-symmetric"],
        KERNELS,
    )
)


@pytest.mark.parametrize("heads, theta, alibi, mask_kind, impl", COMBOS)
def test_forward_matches_the_reference(heads, theta, alibi, mask_kind, impl):
    H, Hkv = heads
    B, L = 2, 5
    mha, rng = make(H, Hkv, theta=theta, alibi=alibi, impl=impl, block_size=2 if impl == "chunked" else None)
    x = rng.standard_normal((B, L, mha.embed_dim))
    mask = mask_of(mask_kind, B, L, L)
    out, cache = mha.forward(x, x, x, mask=mask)
    ref, w = reference_mha(mha.params, x, x, x, H, Hkv, theta, keep=keep_of(mask, B, H, L, L), alibi=alibi)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_allclose(cache.attn_weights, w, rtol=0, atol=1e-12)


def test_cross_attention_with_gqa_and_rope_matches_the_reference():
    mha, rng = make(6, 3, theta=10.0, kdim=5, vdim=3)
    q, k, v = rng.standard_normal((2, 3, 24)), rng.standard_normal((2, 6, 5)), rng.standard_normal((2, 6, 3))
    out, _ = mha.forward(q, k, v)
    ref, _ = reference_mha(mha.params, q, k, v, 6, 3, 10.0)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("shape", ["1d", "2d"])
def test_explicit_positions_match_the_reference(shape):
    mha, rng = make(4, 2, theta=30.0)
    x = rng.standard_normal((2, 4, 16))
    pos = rng.integers(0, 100, size=(2, 4)) if shape == "2d" else np.array([5, 9, 10, 40])
    out, _ = mha.forward(x, x, x, mask=masks.causal_mask(4), positions=pos)
    p2 = np.broadcast_to(pos, (2, 4))
    ref, _ = reference_mha(
        mha.params, x, x, x, 4, 2, 30.0, q_pos=p2, k_pos=p2, keep=keep_of(masks.causal_mask(4), 2, 4, 4, 4)
    )
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    "heads, theta, alibi, impl",
    [((4, 2), 50.0, False, k) for k in KERNELS]
    + [((4, 1), None, True, k) for k in KERNELS]
    + [((2, 2), 7.0, True, "vectorized")],
)
def test_every_gradient_passes_finite_differences(heads, theta, alibi, impl):
    H, Hkv = heads
    mha, rng = make(H, Hkv, d=2, theta=theta, alibi=alibi, impl=impl, block_size=2 if impl == "chunked" else None)
    B, Lq, Lk = 2, 3, 4
    q, k, v = (rng.standard_normal((B, L, mha.embed_dim)) for L in (Lq, Lk, Lk))
    mask = masks.combine_masks(masks.causal_mask(Lq, Lk, diagonal=1), masks.padding_mask(np.array([4, 3]), Lk))
    pos = None if theta is None else np.array([[0, 2, 3, 7], [1, 2, 3, 4]])
    kw = dict(mask=mask) if pos is None else dict(mask=None)
    if pos is not None:  # self-attention lengths for explicit positions
        k, v = q[:, :Lq].copy(), q[:, :Lq].copy()
        kw = dict(mask=masks.causal_mask(Lq), positions=pos[:, :Lq])
    out, cache = mha.forward(q, k, v, **kw)
    d_out = rng.standard_normal(out.shape)
    grads = mha.backward(d_out, cache)

    def run(query, key, value):
        return mha.forward(query, key, value, **kw)[0]

    inputs = dict(query=q, key=k, value=v)
    report = check_function(run, {n: grads[n] for n in inputs}, inputs, d_out)
    for name, p in mha.params.items():
        report.add(name, grads[name], numerical_gradient(lambda _p: run(q, k, v), p, d_out))
    assert report.passed, str(report)
    for row in report.rows:
        assert row.zero_gradient or row.max_rel_err <= RTOL_TARGET, str(report)
    assert not report["W_k"].zero_gradient and not report["W_q"].zero_gradient


# --------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize(
    "heads, theta, alibi", [((4, 4), None, False), ((4, 2), 20.0, False), ((4, 1), 20.0, False), ((4, 2), None, True)]
)
@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize("prefill", [1, 4])
def test_cached_decoding_equals_the_full_causal_forward(heads, theta, alibi, impl, prefill):
    H, Hkv = heads
    mha, rng = make(H, Hkv, theta=theta, alibi=alibi, impl=impl, block_size=2 if impl == "chunked" else None)
    B, L = 2, 7
    x = rng.standard_normal((B, L, mha.embed_dim))
    full, _ = mha.forward(x, x, x, mask=masks.causal_mask(L))
    kv = KVCache()
    steps = [(0, prefill)] + [(t, t + 1) for t in range(prefill, L)]
    outs = [mha.forward(x[:, a:b], x[:, a:b], x[:, a:b], kv_cache=kv)[0] for a, b in steps]
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=0, atol=1e-12 * np.abs(full).max())
    d = mha.head_dim
    assert len(kv) == L and kv.keys.shape == (B, Hkv, L, d)
    assert kv.nbytes == 2 * B * Hkv * L * d * 8


def test_cached_weights_cover_every_cached_key():
    mha, rng = make(4, 2, theta=10.0)
    x = rng.standard_normal((1, 5, 16))
    kv = KVCache()
    _, c1 = mha.forward(x[:, :3], x[:, :3], x[:, :3], kv_cache=kv)
    np.testing.assert_array_equal(c1.attn_weights[0, 0] > 0, masks.causal_mask(3))  # causal within the call
    _, c2 = mha.forward(x[:, 3:5], x[:, 3:5], x[:, 3:5], kv_cache=kv)
    assert c2.attn_weights.shape == (1, 4, 2, 5)
    np.testing.assert_array_equal(c2.attn_weights[0, 1] > 0, masks.causal_mask(2, 5, diagonal=3))


def test_gqa_shrinks_the_cache_by_the_group_size():
    sizes = {}
    for Hkv in (8, 2, 1):
        mha, rng = make(8, Hkv, d=4)
        kv = KVCache()
        x = rng.standard_normal((1, 6, 32))
        mha.forward(x, x, x, kv_cache=kv)
        sizes[Hkv] = kv.nbytes
    assert sizes[8] == 4 * sizes[2] == 8 * sizes[1]


def test_backward_through_a_cached_call_is_refused():
    mha, rng = make()
    x = rng.standard_normal((1, 2, 16))
    out, cache = mha.forward(x, x, x, kv_cache=KVCache())
    with pytest.raises(ValueError, match="kv_cache"):
        mha.backward(np.ones_like(out), cache)


def test_a_cache_of_another_module_or_dtype_is_refused():
    a, rng = make(seed=0)
    b, _ = make(seed=1)
    x = rng.standard_normal((1, 2, 16))
    kv = KVCache()
    a.forward(x, x, x, kv_cache=kv)
    with pytest.raises(ValueError, match="kv_cache belongs to another module"):
        b.forward(x, x, x, kv_cache=kv)
    c, _ = make(dtype=np.float32)
    with pytest.raises(ValueError, match="kv_cache"):
        c.forward(x.astype(np.float32), x.astype(np.float32), x.astype(np.float32), kv_cache=kv)
    with pytest.raises(ValueError, match="kv_cache must be a KVCache"):
        a.forward(x, x, x, kv_cache={})


def test_float32_decoding_stays_float32():
    mha, rng = make(4, 2, theta=10.0, dtype=np.float32)
    x = rng.standard_normal((1, 3, 16)).astype(np.float32)
    kv = KVCache()
    out, _ = mha.forward(x, x, x, kv_cache=kv)
    assert out.dtype == np.float32 and kv.dtype == np.float32


# --------------------------------------------------------------------------- hypothesis


@st.composite
def configs(draw):
    Hkv = draw(st.integers(1, 3))
    H = Hkv * draw(st.integers(1, 3))
    d = 2 * draw(st.integers(1, 3))
    B, Lq, Lk = draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    rope = draw(st.booleans())
    impl = draw(st.sampled_from(KERNELS))
    seed = draw(st.integers(0, 2**31 - 1))
    return H, Hkv, d, B, Lq, Lk, rope, impl, seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_heads_dims_and_lengths(cfg):
    H, Hkv, d, B, Lq, Lk, rope, impl, seed = cfg
    theta = 25.0 if rope else None
    mha, rng = make(H, Hkv, d=d, theta=theta, impl=impl, seed=seed)
    q, k, v = (rng.standard_normal((B, L, H * d)) for L in (Lq, Lk, Lk))
    out, cache = mha.forward(q, k, v)
    ref, w = reference_mha(mha.params, q, k, v, H, Hkv, theta)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-11 * max(1.0, np.abs(ref).max()))
    grads = mha.backward(rng.standard_normal(out.shape), cache)
    assert grads["W_k"].shape == (Hkv * d, H * d) and all(np.all(np.isfinite(g)) for g in grads.values())


def test_variants_compose_with_the_relative_position_bias():
    """GQA + RoPE + ALiBi + a learned relative-position table in one module: every gradient, incl. the table's."""
    mha, rng = make(4, 2, d=2, theta=20.0, alibi=True, rel_pos_max_distance=2)
    x = rng.standard_normal((2, 4, mha.embed_dim))
    mask = masks.causal_mask(4)
    out, cache = mha.forward(x, x, x, mask=mask)
    d_out = rng.standard_normal(out.shape)
    grads = mha.backward(d_out, cache)
    report = check_function(
        lambda query: mha.forward(query, x, x, mask=mask)[0], {"query": grads["query"]}, dict(query=x.copy()), d_out
    )
    for name, p in mha.params.items():
        report.add(name, grads[name], numerical_gradient(lambda _p: mha.forward(x, x, x, mask=mask)[0], p, d_out))
    assert report.passed, str(report)
    assert not report["rel_bias"].zero_gradient and report["rel_bias"].max_rel_err <= RTOL_TARGET, str(report)
    with pytest.raises(ValueError, match="rel_pos_max_distance"):
        mha.forward(x, x, x, kv_cache=KVCache())
