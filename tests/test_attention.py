"""MultiHeadAttention: forward against an independent einsum implementation, every gradient against
central differences over the test matrix, initialization, dtype, and inputs left untouched."""

from __future__ import annotations

import numpy as np
import pytest
from reference import einsum_mha

from mha_numpy import MultiHeadAttention, masks
from mha_numpy.gradcheck import check_mha

RTOL_TARGET = 1e-7


def make(B=2, Lq=3, Lk=4, E=6, H=2, kdim=None, vdim=None, bias=True, dtype=np.float64, seed=0, dropout=0.0):
    rng = np.random.default_rng(seed)
    mha = MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, dtype=dtype, rng=seed, dropout=dropout)
    for name, p in mha.params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.5, p.shape)  # nonzero biases, so bias bugs show
    q = rng.standard_normal((B, Lq, E)).astype(dtype)
    k = rng.standard_normal((B, Lk, mha.kdim)).astype(dtype)
    v = rng.standard_normal((B, Lk, mha.vdim)).astype(dtype)
    return mha, q, k, v, rng


def mask_of(kind, B, Lq, Lk, rng):
    lengths = np.array([Lk] + [max(1, Lk - 2)] * (B - 1))
    return {
        "none": None,
        "padding": masks.padding_mask(lengths, Lk),
        "causal": masks.causal_mask(Lq, Lk),
        "bool": np.concatenate([np.ones((B, 1, Lq, 1), bool), rng.random((B, 1, Lq, Lk - 1)) < 0.6], axis=-1),
        "additive": rng.normal(0, 2, (B, 2, Lq, Lk)),
        "additive+padding": masks.combine_masks(rng.normal(0, 2, (Lq, Lk)), masks.padding_mask(lengths, Lk)),
    }[kind]


MATRIX = [
    # (B, Lq, Lk, E, H, kdim, vdim, bias, mask)
    (1, 3, 3, 4, 1, None, None, True, "none"),
    (2, 3, 3, 6, 2, None, None, True, "padding"),
    (3, 2, 5, 6, 2, None, None, True, "causal"),
    (2, 4, 3, 6, 3, 5, 7, True, "bool"),
    (2, 3, 4, 6, 2, 4, 3, False, "additive"),
    (2, 3, 5, 8, 2, 3, 5, False, "additive+padding"),
    (2, 4, 4, 6, 2, None, None, False, "causal"),
]


@pytest.mark.parametrize("B,Lq,Lk,E,H,kdim,vdim,bias,mask_kind", MATRIX)
def test_forward_matches_einsum_reference_and_gradients_pass(B, Lq, Lk, E, H, kdim, vdim, bias, mask_kind):
    mha, q, k, v, rng = make(B, Lq, Lk, E, H, kdim, vdim, bias)
    mask = mask_of(mask_kind, B, Lq, Lk, rng)
    out, cache = mha.forward(q, k, v, mask=mask)
    ref, w = einsum_mha(mha.params, q, k, v, mask, H)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(cache.attn_weights, w, rtol=1e-12, atol=1e-14)
    assert cache.attn_weights.shape == (B, H, Lq, Lk)
    report = check_mha(mha, q, k, v, mask=mask, rng=rng)
    assert report.passed, str(report)
    expected = {"query", "key", "value", "W_q", "W_k", "W_v", "W_o"} | ({"b_q", "b_k", "b_v", "b_o"} if bias else set())
    assert {r.name for r in report.rows} == expected
    assert all(r.max_rel_err <= RTOL_TARGET for r in report.rows), str(report)


def test_dropout_with_a_fixed_mask_is_gradient_checked_and_applied():
    mha, q, k, v, rng = make(B=2, Lq=3, Lk=4, dropout=0.4, seed=3)
    out_eval, c_eval = mha.forward(q, k, v)
    out_train, c_train = mha.forward(q, k, v, training=True)
    keep = c_train.dropout_mask
    assert keep is not None and keep.shape == (2, 2, 3, 4) and not keep.all()
    assert c_eval.dropout_mask is None
    np.testing.assert_allclose(c_train.attn_weights, c_eval.attn_weights)  # weights are pre-dropout
    assert not np.allclose(out_train, out_eval)
    again, _ = mha.forward(q, k, v, training=True, dropout_mask=keep)
    np.testing.assert_array_equal(again, out_train)
    report = check_mha(mha, q, k, v, training=True, rng=rng)
    assert report.passed, str(report)


def test_fully_masked_row_gives_zero_weights_zero_context_and_finite_gradients():
    mha, q, k, v, rng = make(B=2, Lq=3, Lk=4)
    mask = np.ones((2, 1, 3, 4), bool)
    mask[1, 0, 0] = False  # query 0 of sequence 1 may attend to nothing
    out, cache = mha.forward(q, k, v, mask=mask)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(cache.attn_weights[1, :, 0], 0.0)
    np.testing.assert_array_equal(cache.context[1, :, 0], 0.0)
    # with zero context, the output row is the output bias alone
    np.testing.assert_allclose(out[1, 0], mha.params["b_o"])
    grads = mha.backward(rng.standard_normal(out.shape), cache)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    report = check_mha(mha, q, k, v, mask=mask, rng=rng)
    assert report.passed, str(report)


def test_self_attention_gradient_is_the_sum_of_the_three_paths():
    mha, x, _, _, rng = make(B=2, Lq=4, Lk=4)
    d_out = rng.standard_normal(x.shape)
    out, cache = mha.forward(x, x, x)
    g = mha.backward(d_out, cache)
    total = g["query"] + g["key"] + g["value"]

    from mha_numpy.gradcheck import numerical_gradient

    numeric = numerical_gradient(lambda x_: mha.forward(x_, x_, x_)[0], x.copy(), d_out)
    np.testing.assert_allclose(total, numeric, rtol=1e-6, atol=1e-8)
    assert not np.allclose(g["query"], numeric, atol=1e-3)  # one path alone is not the gradient


def test_float32_end_to_end_keeps_dtype_and_agrees_with_float64():
    mha64, q, k, v, _ = make(B=2, Lq=3, Lk=5, kdim=4, vdim=3)
    mha32 = MultiHeadAttention(6, 2, kdim=4, vdim=3, dtype=np.float32)
    mha32.params = {n: p.astype(np.float32) for n, p in mha64.params.items()}
    mask = masks.padding_mask(np.array([5, 2]))
    out32, c32 = mha32.forward(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), mask=mask)
    out64, c64 = mha64.forward(q, k, v, mask=mask)
    assert out32.dtype == np.float32 and c32.attn_weights.dtype == np.float32
    np.testing.assert_allclose(out32, out64, rtol=1e-4, atol=1e-5)
    grads = mha32.backward(np.ones_like(out32), c32)
    assert all(g.dtype == np.float32 for g in grads.values())
    assert all(p.dtype == np.float32 for p in MultiHeadAttention(8, 2, dtype=np.float32).params.values())


def test_large_logits_in_float32_do_not_overflow():
    mha = MultiHeadAttention(4, 1, bias=False, dtype=np.float32, rng=0)
    mha.params = {n: np.eye(4, dtype=np.float32) for n in mha.params}
    x = np.zeros((1, 3, 4), np.float32)
    x[0, :, 0] = [1e2, -1e2, 1e2]  # scores up to ±1e4 / 2
    out, cache = mha.forward(x, x, x)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(cache.attn_weights))
    assert np.abs(cache.scores).max() >= 1e3
    np.testing.assert_allclose(cache.attn_weights.sum(-1), 1.0, rtol=1e-6)
    grads = mha.backward(np.ones_like(out), cache)
    assert all(np.all(np.isfinite(g)) for g in grads.values())


def test_inputs_and_mask_are_never_mutated():
    mha, q, k, v, rng = make(B=2, Lq=3, Lk=4)
    mask = masks.combine_masks(masks.padding_mask(np.array([4, 2])), rng.normal(size=(3, 4)))
    copies = [a.copy() for a in (q, k, v, mask)]
    out, cache = mha.forward(q, k, v, mask=mask)
    d_out = rng.standard_normal(out.shape)
    d_copy = d_out.copy()
    mha.backward(d_out, cache)
    for a, c in zip((q, k, v, mask, d_out), copies + [d_copy]):
        np.testing.assert_array_equal(a, c)


def test_pytorch_initialization_statistics():
    E = 64
    packed = MultiHeadAttention(E, 4, rng=0)
    bound = np.sqrt(6 / (E + 3 * E))  # xavier over the packed (3E, E) in_proj_weight
    for name in ("W_q", "W_k", "W_v"):
        w = packed.params[name]
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
        assert abs(w.var() - bound**2 / 3) < 0.1 * bound**2 / 3  # U(-a, a) has variance a²/3
    assert np.abs(packed.params["W_o"]).max() <= 1 / np.sqrt(E)
    assert all(np.all(packed.params[b] == 0) for b in ("b_q", "b_k", "b_v", "b_o"))
    sep = MultiHeadAttention(E, 4, kdim=16, vdim=32, rng=0)
    assert np.abs(sep.params["W_k"]).max() <= np.sqrt(6 / (16 + E))
    assert sep.params["W_k"].shape == (E, 16) and sep.params["W_v"].shape == (E, 32)
    # seeded: the same seed gives the same weights, a Generator is used as given
    np.testing.assert_array_equal(
        MultiHeadAttention(8, 2, rng=5).params["W_q"], MultiHeadAttention(8, 2, rng=5).params["W_q"]
    )
    assert set(MultiHeadAttention(8, 2, bias=False).params) == {"W_q", "W_k", "W_v", "W_o"}


def test_cache_exposes_named_intermediates():
    mha, q, k, v, _ = make(B=2, Lq=3, Lk=4, E=6, H=3)
    out, cache = mha.forward(q, k, v)
    assert cache.Q.shape == (2, 3, 3, 2) and cache.K.shape == (2, 3, 4, 2) and cache.V.shape == (2, 3, 4, 2)
    assert cache.scores.shape == cache.attn_weights.shape == (2, 3, 3, 4)
    assert cache.context.shape == (2, 3, 3, 2)
    np.testing.assert_allclose(cache.scores, cache.Q @ cache.K.swapaxes(-1, -2) / np.sqrt(2))
