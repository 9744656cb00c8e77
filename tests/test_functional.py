"""Each functional pair: the forward against a direct formula, the backward against central differences."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import grad_check

from mha_numpy import functional as F
from mha_numpy.gradcheck import check_functional


def randn(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_and_backward(lead, bias):
    rng = np.random.default_rng(1)
    x, W = randn(rng, *lead, 4), randn(rng, 5, 4)
    b = randn(rng, 5) if bias else None
    y, cache = F.linear_forward(x, W, b)
    expected = np.einsum("...i,oi->...o", x, W) + (b if bias else 0)
    np.testing.assert_allclose(y, expected, rtol=1e-13, atol=1e-13)
    dx, dW, db = F.linear_backward(np.ones_like(y), cache)
    assert dx.shape == x.shape and dW.shape == W.shape
    assert (db is None) == (not bias)
    names = ["x", "W", "b"] if bias else ["x", "W"]
    inputs = dict(x=x, W=W, b=b) if bias else dict(x=x, W=W)
    grad_check(F.linear_forward, F.linear_backward, inputs, names)


def test_split_and_merge_are_inverse_and_place_features_per_head():
    rng = np.random.default_rng(2)
    x = randn(rng, 2, 5, 12)
    heads, _ = F.split_heads_forward(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(heads[:, 1], x[:, :, 4:8])  # head 1 sees features 4..7
    merged, _ = F.merge_heads_forward(heads)
    np.testing.assert_array_equal(merged, x)
    grad_check(lambda x: F.split_heads_forward(x, 3), F.split_heads_backward, dict(x=x), ["x"])
    grad_check(F.merge_heads_forward, F.merge_heads_backward, dict(x=heads.copy()), ["x"])


def test_scores_forward_and_backward():
    rng = np.random.default_rng(3)
    q, k = randn(rng, 2, 3, 4, 5), randn(rng, 2, 3, 6, 5)
    s, _ = F.attention_scores_forward(q, k, 0.3)
    np.testing.assert_allclose(s, 0.3 * np.einsum("bhqd,bhkd->bhqk", q, k), rtol=1e-13)
    grad_check(
        lambda q, k: F.attention_scores_forward(q, k, 0.3), F.attention_scores_backward, dict(q=q, k=k), ["q", "k"]
    )


def test_apply_mask_bool_float_and_none():
    rng = np.random.default_rng(4)
    s = randn(rng, 2, 2, 3, 4)
    out, cache = F.apply_mask_forward(s, None)
    assert out is s and cache is None
    keep = rng.random((2, 1, 3, 4)) < 0.6
    out, _ = F.apply_mask_forward(s, keep)
    assert np.all(np.isneginf(out[np.broadcast_to(~keep, s.shape)]))
    np.testing.assert_array_equal(out[np.broadcast_to(keep, s.shape)], s[np.broadcast_to(keep, s.shape)])
    add = randn(rng, 3, 4)
    out, _ = F.apply_mask_forward(s, add)
    np.testing.assert_allclose(out, s + add)
    grad_check(lambda s: F.apply_mask_forward(s, add), F.apply_mask_backward, dict(s=s), ["s"])
    # gradient is zero at blocked positions
    _, cache = F.apply_mask_forward(s, keep)
    d = F.apply_mask_backward(np.ones_like(s), cache)
    assert np.all(d[np.broadcast_to(~keep, s.shape)] == 0)


def test_softmax_forward_matches_definition_and_is_stable():
    rng = np.random.default_rng(5)
    x = randn(rng, 2, 3, 7)
    p, _ = F.softmax_forward(x)
    np.testing.assert_allclose(p, np.exp(x) / np.exp(x).sum(-1, keepdims=True), rtol=1e-13)
    big = np.array([[1e4, 0.0, -1e4]], dtype=np.float32)
    p32, _ = F.softmax_forward(big)
    assert p32.dtype == np.float32 and np.all(np.isfinite(p32))
    np.testing.assert_allclose(p32, [[1.0, 0.0, 0.0]])


def test_softmax_fully_masked_row_is_zero_not_nan():
    x = np.array([[0.5, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    p, cache = F.softmax_forward(x)
    np.testing.assert_array_equal(p[1], 0.0)
    assert np.isclose(p[0].sum(), 1.0)
    dx = F.softmax_backward(np.ones_like(x) * 3.0, cache)
    assert np.all(np.isfinite(dx)) and np.all(dx[1] == 0)


def test_softmax_backward_is_the_full_vjp_not_the_diagonal():
    rng = np.random.default_rng(6)
    x = randn(rng, 5)
    p, cache = F.softmax_forward(x)
    dp = randn(rng, 5)
    jacobian = np.diag(p) - np.outer(p, p)  # built here only to check the VJP
    np.testing.assert_allclose(F.softmax_backward(dp, cache), jacobian.T @ dp, rtol=1e-12, atol=1e-15)
    diagonal_only = p * (1 - p) * dp
    assert not np.allclose(F.softmax_backward(dp, cache), diagonal_only)
    grad_check(F.softmax_forward, F.softmax_backward, dict(x=randn(rng, 2, 3, 6)), ["x"])


def test_dropout_inverted_scaling_and_fixed_mask_backward():
    rng = np.random.default_rng(7)
    x = randn(rng, 4, 50, 50)
    out, cache = F.dropout_forward(x, 0.25, np.random.default_rng(0))
    keep = cache[0]
    assert 0.70 < keep.mean() < 0.80  # about 1 - p kept
    np.testing.assert_allclose(out, np.where(keep, x / 0.75, 0.0))
    np.testing.assert_array_equal(F.dropout_backward(np.ones_like(x), cache), np.where(keep, 1 / 0.75, 0.0))
    same, _ = F.dropout_forward(x, 0.25, np.random.default_rng(0))
    np.testing.assert_array_equal(same, out)  # the same generator state gives the same mask
    identity, c0 = F.dropout_forward(x, 0.0)
    assert identity is x and c0 is None
    small = x[:1, :4, :5].copy()
    fixed = rng.random(small.shape) >= 0.25
    grad_check(lambda x: F.dropout_forward(x, 0.25, keep_mask=fixed), F.dropout_backward, dict(x=small), ["x"])


def test_context_forward_and_backward():
    rng = np.random.default_rng(8)
    p, v = randn(rng, 2, 2, 3, 4), randn(rng, 2, 2, 4, 5)
    c, _ = F.attention_context_forward(p, v)
    np.testing.assert_allclose(c, np.einsum("bhqk,bhkd->bhqd", p, v), rtol=1e-13)
    grad_check(F.attention_context_forward, F.attention_context_backward, dict(p=p, v=v), ["p", "v"])


def reference_sdpa(q, k, v, mask, scale):
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    s = s - np.max(np.where(np.isfinite(s), s, -1e300), axis=-1, keepdims=True)
    e = np.exp(s)
    tot = e.sum(-1, keepdims=True)
    w = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
    return np.einsum("bhqk,bhkd->bhqd", w, v), w


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal", "fully-masked-row"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_sdpa_forward_and_gradients(mask_kind, dropout):
    rng = np.random.default_rng(9)
    B, H, Lq, Lk, d = 2, 3, 4, 6, 5
    q, k, v = randn(rng, B, H, Lq, d), randn(rng, B, H, Lk, d), randn(rng, B, H, Lk, 7)
    mask = {
        "none": None,
        "bool": rng.random((B, 1, Lq, Lk)) < 0.7,
        "float": randn(rng, B, H, Lq, Lk),
        "causal": np.tril(np.ones((Lq, Lk), bool)),
        "fully-masked-row": np.ones((B, 1, Lq, Lk), bool),
    }[mask_kind]
    if mask_kind == "fully-masked-row":
        mask[1, 0, 2] = False
    keep = rng.random((B, H, Lq, Lk)) >= dropout if dropout else None
    out, cache = F.scaled_dot_product_attention_forward(q, k, v, mask, dropout_p=dropout, dropout_mask=keep)
    ref, w = reference_sdpa(q, k, v, mask, 1 / np.sqrt(d))
    np.testing.assert_allclose(cache.attn_weights, w, rtol=1e-12, atol=1e-15)
    if dropout == 0:
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)
    else:
        np.testing.assert_allclose(out, np.einsum("bhqk,bhkd->bhqd", w * keep / (1 - dropout), v), rtol=1e-12)
    assert out.shape == (B, H, Lq, 7)
    if mask_kind == "fully-masked-row":
        assert np.all(cache.attn_weights[1, :, 2] == 0) and np.all(out[1, :, 2] == 0)

    def fwd(q, k, v):
        return F.scaled_dot_product_attention_forward(q, k, v, mask, dropout_p=dropout, dropout_mask=keep)

    grad_check(fwd, F.scaled_dot_product_attention_backward, dict(q=q, k=k, v=v), ["q", "k", "v"])


def test_sdpa_backward_returns_one_gradient_per_differentiable_input():
    """The backward return convention (docs/architecture.md): (dq, dk, dv, d_bias) always, d_bias None without a
    bias, as linear_backward's db is None without b (it used to return 3 or 4 values depending on the bias)."""
    rng = np.random.default_rng(12)
    q, k, v = randn(rng, 2, 2, 3, 4), randn(rng, 2, 2, 5, 4), randn(rng, 2, 2, 5, 4)
    out, cache = F.scaled_dot_product_attention_forward(q, k, v)
    grads = F.scaled_dot_product_attention_backward(randn(rng, *out.shape), cache)
    assert len(grads) == 4 and grads[3] is None
    bias = randn(rng, 1, 2, 3, 5)
    out, cache = F.scaled_dot_product_attention_forward(q, k, v, bias=bias)
    grads = F.scaled_dot_product_attention_backward(randn(rng, *out.shape), cache)
    assert len(grads) == 4 and grads[3].shape == bias.shape


def test_sdpa_custom_scale_and_alias():
    rng = np.random.default_rng(10)
    q, k, v = randn(rng, 1, 1, 2, 3), randn(rng, 1, 1, 2, 3), randn(rng, 1, 1, 2, 3)
    out, cache = F.scaled_dot_product_attention(q, k, v, scale=0.25)
    np.testing.assert_allclose(cache.scores, 0.25 * q @ k.swapaxes(-1, -2))
    np.testing.assert_allclose(out, reference_sdpa(q, k, v, None, 0.25)[0], rtol=1e-13)


def test_check_functional_covers_every_pair():
    report = check_functional()
    assert report.passed, str(report)
    pairs = {row.name.split(":")[0] for row in report.rows}
    attention = {"linear", "split", "merge", "scores", "mask", "softmax", "dropout", "context", "sdpa"}
    variants = {
        "repeat_kv",
        "rope",
        "soft_cap",
        "rope_interleaved",
        "concat_features",
        "sink_softmax",
        "diff_values",
        "diff_lambda",
        "diff_combine",
        "merge_attention",
        "partial_rope",
        "gate_query",
        "output_gate",
    }
    block = {"add", "embedding", "bert_embeddings", "layer_norm", "gelu", "gelu_tanh", "feed_forward", "mean_pool",
             "rms_norm", "silu", "swiglu"}  # fmt: skip
    assert pairs == attention | variants | block


def test_float32_stays_float32_through_every_pair():
    rng = np.random.default_rng(11)
    q, k, v = (randn(rng, 2, 2, 3, 4).astype(np.float32) for _ in range(3))
    mask = rng.normal(size=(3, 3))  # float64 additive mask must not promote the scores
    out, cache = F.scaled_dot_product_attention_forward(q, k, v, mask)
    assert out.dtype == np.float32 and cache.attn_weights.dtype == np.float32
    dq, dk, dv, _ = F.scaled_dot_product_attention_backward(np.ones_like(out), cache)
    assert dq.dtype == dk.dtype == dv.dtype == np.float32
    y, c = F.linear_forward(q, np.ones((5, 4), np.float32), np.ones(5, np.float32))
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in F.linear_backward(y, c))


@pytest.mark.parametrize("lead", [(3,), (2, 0), (0,)])
def test_a_linear_layer_with_zero_input_features_is_its_bias_and_zero_outputs_work_too(lead):
    """Reliability 10: 0 input features failed in reshape(-1, 0). x Wᵀ is then an empty sum, a zero matrix:
    y = b (or zeros), dx is (..., 0), dW is (out, 0), db sums dy as always. And W with 0 outputs: y (..., 0)."""
    rng = np.random.default_rng(3)
    x, W, b = np.zeros((*lead, 0)), np.zeros((4, 0)), randn(rng, 4)
    for bias in (b, None):
        y, cache = F.linear_forward(x, W, bias)
        np.testing.assert_array_equal(y, np.broadcast_to(0.0 if bias is None else b, (*lead, 4)))
        dy = randn(rng, *lead, 4)
        dx, dW, db = F.linear_backward(dy, cache)
        assert dx.shape == x.shape and dW.shape == W.shape
        if bias is not None:
            np.testing.assert_allclose(db, dy.reshape(-1, 4).sum(axis=0), rtol=1e-14)
    x = randn(rng, *lead, 3)
    y, cache = F.linear_forward(x, np.zeros((0, 3)), np.zeros(0))
    assert y.shape == (*lead, 0)
    dx, dW, db = F.linear_backward(np.zeros((*lead, 0)), cache)  # reshape(-1, 0) failed here too
    np.testing.assert_array_equal(dx, np.zeros_like(x))
    assert dW.shape == (0, 3) and db.shape == (0,)


def test_apply_mask_and_split_heads_check_their_arguments():
    """Reliability 4 and 10: integer scores under a bool mask became INT64_MIN silently; num_heads=2.0 or "2"
    gave a TypeError; a ragged nested list gave NumPy's own ValueError, which names no argument."""
    mask = np.array([[True, False]])
    for scores in (np.zeros((1, 1, 1, 2), dtype=np.int64), np.zeros((1, 1, 1, 2), dtype=bool)):
        with pytest.raises(ValueError, match=r"^scores must be a floating-point array .* shape \(1, 1, 1, 2\)"):
            F.apply_mask_forward(scores, mask)
    with pytest.raises(ValueError, match="^scores is not a rectangular array"):
        F.apply_mask_forward([[[[0.0, 1.0], [0.0]]]], mask)
    x = np.zeros((1, 2, 4))
    for bad in (2.0, "2", True, None, np.float64(2), [2]):
        with pytest.raises(ValueError, match="^num_heads must be a positive int"):
            F.split_heads_forward(x, bad)
    assert F.split_heads_forward(x, np.int64(2))[0].shape == (1, 2, 2, 2)
    for call, name in (
        (lambda: F.linear_forward([[1.0, 2.0], [3.0]], np.zeros((2, 2))), "x"),
        (lambda: F.linear_forward(np.zeros((1, 2)), [[1.0, 2.0], [3.0]]), "W"),
        (lambda: F.scaled_dot_product_attention_forward(x[None], x[None], [[[[0.0]], [[0.0, 1.0]]]]), "v"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} is not a rectangular array"):
            call()
