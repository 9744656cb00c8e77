"""Today's attention variants: grouped-query heads (repeat_kv), rotary positions (rope), ALiBi, sliding windows.

Each pair: the forward against an independent formula written here, the backward against float64 central
differences with a random upstream gradient (max rel err <= 1e-7 per input).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import grad_check

from mha_numpy import functional as F
from mha_numpy import masks

# --------------------------------------------------------------------------- repeat_kv (GQA / MQA)


@pytest.mark.parametrize("Hkv, n_rep", [(2, 3), (1, 4), (3, 1)])
def test_repeat_kv_gives_query_head_h_the_kv_head_h_div_n_rep(Hkv, n_rep):
    x = np.random.default_rng(1).standard_normal((2, Hkv, 5, 4))
    out, _ = F.repeat_kv_forward(x, n_rep)
    assert out.shape == (2, Hkv * n_rep, 5, 4)
    for h in range(Hkv * n_rep):
        np.testing.assert_array_equal(out[:, h], x[:, h // n_rep])
    grad_check(lambda x: F.repeat_kv_forward(x, n_rep), F.repeat_kv_backward, dict(x=x), ["x"], allow_zero=False)


def test_repeat_kv_backward_sums_each_group():
    d_out = np.random.default_rng(2).standard_normal((2, 6, 3, 4))
    _, cache = F.repeat_kv_forward(np.zeros((2, 2, 3, 4)), 3)
    dx = F.repeat_kv_backward(d_out, cache)
    np.testing.assert_allclose(dx[:, 0], d_out[:, 0] + d_out[:, 1] + d_out[:, 2], rtol=0, atol=1e-15)
    np.testing.assert_allclose(dx[:, 1], d_out[:, 3] + d_out[:, 4] + d_out[:, 5], rtol=0, atol=1e-15)


def test_repeat_kv_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="n_rep"):
        F.repeat_kv_forward(np.zeros((1, 2, 3, 4)), 0)
    with pytest.raises(ValueError, match="x must have 4 dimensions"):
        F.repeat_kv_forward(np.zeros((2, 3, 4)), 2)


# --------------------------------------------------------------------------- RoPE


def rope_reference(x, positions, theta):
    """Independent RoPE: each pair (i, i + d/2) as a complex number times e^{i·pos·theta^(-2i/d)}."""
    d = x.shape[-1]
    half = d // 2
    z = x[..., :half] + 1j * x[..., half:]  # (B, H, L, d/2)
    pos = np.asarray(positions, dtype=np.float64)
    angle = pos[..., None] * theta ** (-2.0 * np.arange(half) / d)  # (..., L, d/2)
    if angle.ndim == 3:
        angle = angle[:, None]  # (B, 1, L, d/2)
    w = z * np.exp(1j * angle)
    return np.concatenate([w.real, w.imag], axis=-1)


@pytest.mark.parametrize("positions", [None, "1d", "2d"])
def test_rope_matches_the_complex_rotation_and_gradcheck(positions):
    rng = np.random.default_rng(3)
    B, H, L, d = 2, 3, 5, 8
    x = rng.standard_normal((B, H, L, d))
    pos = {None: None, "1d": np.array([3, 4, 7, 8, 20]), "2d": rng.integers(0, 50, size=(B, L))}[positions]
    out, _ = F.rope_forward(x, pos, theta=500.0)
    expected = rope_reference(x, np.arange(L) if pos is None else pos, 500.0)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)  # a rotation
    grad_check(lambda x: F.rope_forward(x, pos, 500.0), F.rope_backward, dict(x=x), ["x"], allow_zero=False)


def test_rope_backward_is_the_inverse_rotation():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 6, 4))
    out, cache = F.rope_forward(x, None, 10.0)
    np.testing.assert_allclose(F.rope_backward(out, cache), x, rtol=0, atol=1e-14)


def test_rotated_scores_depend_only_on_the_distance():
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((1, 1, 1, 8)), rng.standard_normal((1, 1, 1, 8))

    def score(i, j):
        qi, _ = F.rope_forward(q, np.array([i]), 100.0)
        kj, _ = F.rope_forward(k, np.array([j]), 100.0)
        return float((qi * kj).sum())

    assert abs(score(7, 3) - score(4, 0)) < 1e-12 * abs(score(4, 0)) + 1e-13
    assert abs(score(20, 25) - score(0, 5)) < 1e-12 * abs(score(0, 5)) + 1e-13
    assert abs(score(7, 3) - score(7, 4)) > 1e-3  # and it does depend on the distance


def test_rope_keeps_float32():
    x = np.random.default_rng(6).standard_normal((1, 1, 3, 4)).astype(np.float32)
    out, cache = F.rope_forward(x)
    assert out.dtype == np.float32 and F.rope_backward(out, cache).dtype == np.float32


@pytest.mark.parametrize(
    "x_shape, positions, theta, match",
    [
        ((1, 2, 3, 5), None, 1e4, "head dim d=5 must be even"),
        ((1, 2, 3, 4), np.arange(4), 1e4, "positions with shape"),
        ((2, 2, 3, 4), np.zeros((3, 3)), 1e4, "positions with shape"),
        ((1, 2, 3, 4), np.array(["a", "b", "c"]), 1e4, "positions must be integer or float"),
        ((1, 2, 3, 4), None, 0.0, "theta"),
        ((1, 2, 3, 4), np.array([0.0, np.nan, 1.0]), 1e4, "non-finite"),
    ],
)
def test_rope_bad_input_names_the_argument(x_shape, positions, theta, match):
    with pytest.raises(ValueError, match=match):
        F.rope_forward(np.zeros(x_shape), positions, theta)


# --------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_of_the_paper():
    np.testing.assert_allclose(F.alibi_slopes(8), 2.0 ** -np.arange(1, 9), rtol=1e-15)  # 1/2 ... 1/256
    np.testing.assert_allclose(F.alibi_slopes(1), [2.0**-8], rtol=1e-15)
    # 12 heads: the 8 slopes of 8 heads, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (odd steps of the 16-head sequence)
    expected = np.concatenate([2.0 ** -np.arange(1, 9), 2.0 ** -(np.arange(4) + 0.5)])
    np.testing.assert_allclose(F.alibi_slopes(12), expected, rtol=1e-15)
    with pytest.raises(ValueError, match="num_heads"):
        F.alibi_slopes(0)


def test_alibi_bias_penalises_distance_per_head():
    bias = F.alibi_bias(4, 3, 5, offset=2)  # 3 queries at positions 2, 3, 4 after 2 earlier keys
    assert bias.shape == (1, 4, 3, 5)
    m = F.alibi_slopes(4)
    for h in range(4):
        for i in range(3):
            for j in range(5):
                assert bias[0, h, i, j] == -m[h] * abs(i + 2 - j)
    assert F.alibi_bias(2, 2, dtype=np.float32).dtype == np.float32


def test_alibi_through_the_mask_equals_a_per_row_shift_of_bloom_style_bias():
    """Under a causal mask, -m(i - j) and BLOOM's +m·j give the same weights (softmax ignores a per-row shift)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 4, 6, 8)) for _ in range(3))
    causal = masks.causal_mask(6)
    ours = masks.combine_masks(causal, F.alibi_bias(4, 6))
    bloom = masks.combine_masks(causal, F.alibi_slopes(4)[None, :, None, None] * np.arange(6.0))
    a, ca = F.scaled_dot_product_attention_forward(q, k, v, ours)
    b, cb = F.scaled_dot_product_attention_forward(q, k, v, bloom)
    np.testing.assert_allclose(ca.attn_weights, cb.attn_weights, rtol=0, atol=1e-14)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


# --------------------------------------------------------------------------- sliding window


def test_sliding_window_mask_causal_and_symmetric():
    m = masks.sliding_window_mask(5, 5, 2)
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(m, expected)
    sym = masks.sliding_window_mask(4, 4, 2, causal=False)
    np.testing.assert_array_equal(sym, np.abs(np.subtract.outer(np.arange(4), np.arange(4))) <= 1)
    np.testing.assert_array_equal(masks.sliding_window_mask(3, 7, 10, offset=4), masks.causal_mask(3, 7, diagonal=4))
    decode = masks.sliding_window_mask(1, 6, 3, offset=5)  # one new query at position 5: keys 3, 4, 5
    np.testing.assert_array_equal(decode, [[0, 0, 0, 1, 1, 1]])


@pytest.mark.parametrize("args", [(0, 3, 2), (3, 3, 0), (3, 3, 1.5), (3, -1, 2)])
def test_sliding_window_mask_bad_input(args):
    with pytest.raises(ValueError, match="positive int"):
        masks.sliding_window_mask(*args)


# --------------------------------------------------------------------------- KVCache (storage alone)


def test_kv_cache_appends_in_order_and_reports_its_bytes():
    from mha_numpy import KVCache

    rng = np.random.default_rng(8)
    kv = KVCache()
    assert len(kv) == 0 and kv.nbytes == 0 and kv.keys is None
    chunks = [rng.standard_normal((2, 3, n, 4)) for n in (5, 1, 1, 3, 1)]
    for c in chunks:
        keys, values = kv.append(c, 2 * c)
    full = np.concatenate(chunks, axis=2)  # (2, 3, 11, 4)
    np.testing.assert_array_equal(keys, full)
    np.testing.assert_array_equal(values, 2 * full)
    assert len(kv) == 11 and kv.keys.shape == (2, 3, 11, 4)
    assert kv.nbytes == 2 * 2 * 3 * 11 * 4 * 8
    assert kv.bytes_per_token == 3 * (4 + 4) * 8
    np.testing.assert_array_equal(kv.positions(2), [11, 12])


def test_kv_cache_never_aliases_the_caller_arrays():
    from mha_numpy import KVCache

    kv = KVCache()
    k = np.ones((1, 1, 2, 2))
    kv.append(k, k)
    k[...] = 5.0
    assert np.all(kv.keys == 1.0)


def test_kv_cache_bad_input_names_the_argument():
    from mha_numpy import KVCache, MultiHeadAttention

    kv = KVCache()
    kv.append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match="kv_cache holds"):
        kv.append(np.zeros((1, 1, 1, 4)), np.zeros((1, 1, 1, 4)))  # other number of heads
    with pytest.raises(ValueError, match="kv_cache holds"):
        kv.append(np.zeros((1, 2, 1, 4), np.float32), np.zeros((1, 2, 1, 4), np.float32))
    with pytest.raises(ValueError, match="K .* and V"):
        kv.append(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 2, 4)))
    a, b = MultiHeadAttention(8, 2, rng=0), MultiHeadAttention(8, 2, rng=0)
    kv.bind(a)
    with pytest.raises(ValueError, match="kv_cache belongs to another module"):
        kv.bind(b)
    with pytest.raises(ValueError, match="kv_cache holds float64"):
        fresh = KVCache()
        fresh.append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)))
        fresh.bind(MultiHeadAttention(8, 2, rng=0, dtype=np.float32))
