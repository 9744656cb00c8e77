"""The non-attention pairs of a Transformer block (models.layers): LayerNorm, RMSNorm, GELU, SiLU, the GELU MLP
and SwiGLU, BERT's embedding sum, mean pooling. Finite differences live in check_functional (test_functional);
here: the same functions against torch autograd, math.erf and the explicit Jacobian, and their bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy.models import layers as LY


def randn(rng, *shape):
    return rng.standard_normal(shape)


# --------------------------------------------------------------------------- erf and GELU


def test_scipy_erf_in_gelu_matches_math_erf_and_keeps_float32():
    from scipy.special import erf

    x = np.concatenate([np.linspace(-7, 7, 20_001), np.geomspace(1e-300, 30, 500), -np.geomspace(1e-300, 30, 500)])
    ref = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(erf(x) - ref) / np.maximum(np.abs(ref), 1e-300)) <= 1e-15
    x32 = x.astype(np.float32)
    assert erf(x32).dtype == np.float32
    ref32 = np.array([math.erf(float(v)) for v in x32])
    assert np.max(np.abs(erf(x32) - ref32)) <= 2 * np.finfo(np.float32).eps  # correctly rounded to float32
    g, _ = LY.gelu_forward(x32)
    assert g.dtype == np.float32
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x32.astype(np.float64)])
    # float32 rounding of x · Φ(x) (1 + erf cancels for x << 0, as in torch): error within a few ulp of |x|
    assert np.all(np.abs(g - exact) <= 4 * np.finfo(np.float32).eps * np.abs(x32) + 1e-44)  # + subnormals


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_forward_and_backward_match_torch(approximate):
    torch = require_torch()
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-9, 9, 2001), 3 * randn(rng, 999)])
    d = randn(rng, x.size)
    tx = torch.from_numpy(x).requires_grad_()
    ty = torch.nn.functional.gelu(tx, approximate=approximate)
    ty.backward(torch.from_numpy(d))
    out, cache = LY.gelu_forward(x, approximate)
    assert rel_err(out, ty.detach().numpy()) <= 1e-14
    assert rel_err(LY.gelu_backward(d, cache), tx.grad.numpy()) <= 1e-14
    out32, cache32 = LY.gelu_forward(x.astype(np.float32), approximate)
    assert out32.dtype == LY.gelu_backward(d.astype(np.float32), cache32).dtype == np.float32


def test_tanh_gelu_differs_from_exact_by_about_1e_3_at_most():
    x = np.linspace(-6, 6, 10001)
    gap = np.abs(LY.gelu(x) - LY.gelu(x, approximate="tanh")).max()
    assert 1e-5 < gap < 1e-3  # why BERT's exact form matters at 1e-10 agreement


def test_gelu_refuses_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        LY.gelu_forward(np.zeros(3), "sigmoid")


# --------------------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
def test_layer_norm_forward_and_backward_match_torch(dtype, tol):
    torch = require_torch()
    rng = np.random.default_rng(1)
    x = (randn(rng, 3, 5, 16) * 4 + 2).astype(dtype)
    gamma, beta, d = randn(rng, 16).astype(dtype), randn(rng, 16).astype(dtype), randn(rng, 3, 5, 16).astype(dtype)
    t = [torch.from_numpy(a).requires_grad_() for a in (x, gamma, beta)]
    ty = torch.nn.functional.layer_norm(t[0], (16,), t[1], t[2], eps=1e-12)
    ty.backward(torch.from_numpy(d))
    out, cache = LY.layer_norm_forward(x, gamma, beta, 1e-12)
    grads = LY.layer_norm_backward(d, cache)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert rel_err(out, ty.detach().numpy()) <= tol
    for ours, theirs in zip(grads, t):
        assert rel_err(ours, theirs.grad.numpy()) <= tol


def test_layer_norm_backward_equals_the_explicit_jacobian():
    """The compact form (two row means) is J^T d_out with the full E x E Jacobian of one row, written out."""
    rng = np.random.default_rng(2)
    E, eps = 7, 1e-5
    x, gamma, d = randn(rng, E), randn(rng, E), randn(rng, E)
    _, cache = LY.layer_norm_forward(x, gamma, np.zeros(E), eps)
    dx, _, _ = LY.layer_norm_backward(d, cache)
    sigma = np.sqrt(x.var() + eps)
    x_hat = (x - x.mean()) / sigma
    J = gamma[:, None] * (np.eye(E) - 1.0 / E - np.outer(x_hat, x_hat) / E) / sigma  # J[i, j] = ∂out_i / ∂x_j
    np.testing.assert_allclose(dx, J.T @ d, rtol=1e-12, atol=1e-14)


def test_layer_norm_gradient_is_orthogonal_to_shifts_and_scalings():
    """LayerNorm ignores adding a constant to a row or scaling it (up to eps): dx sums to 0 and is ⟂ x̂ per row."""
    rng = np.random.default_rng(3)
    x, d = randn(rng, 4, 9), randn(rng, 4, 9)
    _, cache = LY.layer_norm_forward(x, randn(rng, 9), randn(rng, 9), 0.0)
    dx, _, _ = LY.layer_norm_backward(d, cache)
    scale = np.abs(dx).max()
    assert np.abs(dx.sum(-1)).max() <= 1e-14 * 9 * scale
    assert np.abs((dx * cache[0]).sum(-1)).max() <= 1e-14 * 9 * scale


def test_layer_norm_refuses_mismatched_gamma():
    with pytest.raises(ValueError, match="gamma"):
        LY.layer_norm_forward(np.zeros((2, 4)), np.ones(3), np.zeros(3), 1e-5)


# --------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-6)])
def test_rms_norm_forward_and_backward_match_torch(dtype, tol):
    torch = require_torch()
    rng = np.random.default_rng(7)
    x = (randn(rng, 3, 5, 16) * 4 + 2).astype(dtype)
    w, d = randn(rng, 16).astype(dtype), randn(rng, 3, 5, 16).astype(dtype)
    tx, tw = (torch.from_numpy(a).requires_grad_() for a in (x, w))
    ty = torch.nn.functional.rms_norm(tx, (16,), tw, eps=1e-6)
    ty.backward(torch.from_numpy(d))
    out, cache = LY.rms_norm_forward(x, w, 1e-6)
    dx, dw = LY.rms_norm_backward(d, cache)
    assert out.dtype == dx.dtype == dw.dtype == dtype
    assert rel_err(out, ty.detach().numpy()) <= tol
    assert rel_err(dx, tx.grad.numpy()) <= tol and rel_err(dw, tw.grad.numpy()) <= tol


def test_rms_norm_float32_matches_hf_llama_rms_norm_and_float64_does_not_round_through_float32():
    """LlamaRMSNorm computes in float32 whatever the input: the same as ours in float32; in float64 it rounds the
    normalised x to float32 (~1e-8 relative), which ours does not (torch's own rms_norm is float64 throughout)."""
    torch = require_torch()
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    rng = np.random.default_rng(8)
    x, w, d = randn(rng, 2, 4, 12) * 3, randn(rng, 12), randn(rng, 2, 4, 12)
    for dtype in (np.float32, np.float64):
        hf = LlamaRMSNorm(12, eps=1e-6).to(getattr(torch, np.dtype(dtype).name))
        with torch.no_grad():
            hf.weight.copy_(torch.from_numpy(w))
        tx = torch.from_numpy(x.astype(dtype)).requires_grad_()
        ty = hf(tx)
        ty.backward(torch.from_numpy(d.astype(dtype)))
        out, cache = LY.rms_norm_forward(x.astype(dtype), w.astype(dtype), 1e-6)
        dx, dw = LY.rms_norm_backward(d.astype(dtype), cache)
        errs = [rel_err(out, ty.detach().numpy()), rel_err(dx, tx.grad.numpy()), rel_err(dw, hf.weight.grad.numpy())]
        if dtype == np.float32:
            assert max(errs) <= 1e-6, errs
        else:  # HF's float32 round trip, not ours: the float64 reference above agrees to 1e-13
            assert 1e-12 < errs[0] <= 1e-7, errs


def test_rms_norm_backward_equals_the_explicit_jacobian():
    """dx = r (dx̂ - x̂ mean(dx̂ x̂)) is Jᵀ d with J[i, j] = weight_i r (δ_ij - x̂_i x̂_j / E), written out."""
    rng = np.random.default_rng(9)
    E, eps = 7, 1e-5
    x, w, d = randn(rng, E), randn(rng, E), randn(rng, E)
    _, cache = LY.rms_norm_forward(x, w, eps)
    dx, _ = LY.rms_norm_backward(d, cache)
    r = 1 / np.sqrt(np.mean(x * x) + eps)
    x_hat = x * r
    J = w[:, None] * r * (np.eye(E) - np.outer(x_hat, x_hat) / E)  # J[i, j] = ∂out_i / ∂x_j
    np.testing.assert_allclose(dx, J.T @ d, rtol=1e-12, atol=1e-14)


def test_rms_norm_gradient_is_orthogonal_to_scalings_but_not_to_shifts():
    """RMSNorm ignores scaling a row (eps = 0), so dx ⟂ x̂; unlike LayerNorm it sees a shift, so dx need not sum to 0."""
    rng = np.random.default_rng(10)
    x, d = randn(rng, 4, 9), randn(rng, 4, 9)
    _, cache = LY.rms_norm_forward(x, randn(rng, 9), 0.0)
    dx, _ = LY.rms_norm_backward(d, cache)
    scale = np.abs(dx).max()
    assert np.abs((dx * cache[0]).sum(-1)).max() <= 1e-14 * 9 * scale
    assert np.abs(dx.sum(-1)).max() > 1e-3 * scale


def test_rms_norm_refuses_mismatched_weight():
    with pytest.raises(ValueError, match="weight"):
        LY.rms_norm_forward(np.zeros((2, 4)), np.ones(3), 1e-5)


# --------------------------------------------------------------------------- SiLU and SwiGLU


def test_silu_matches_torch_and_never_overflows():
    torch = require_torch()
    rng = np.random.default_rng(11)
    x = np.concatenate([np.linspace(-40, 40, 2001), 3 * randn(rng, 999), [-1e4, -800.0, 800.0, 1e4]])
    d = randn(rng, x.size)
    tx = torch.from_numpy(x).requires_grad_()
    ty = torch.nn.functional.silu(tx)
    ty.backward(torch.from_numpy(d))
    with np.errstate(over="raise", invalid="raise"):  # e^{-|x|}: no overflow (only a harmless underflow) at ±1e4
        out, cache = LY.silu_forward(x)
        dx = LY.silu_backward(d, cache)
    assert rel_err(out, ty.detach().numpy()) <= 1e-15 and rel_err(dx, tx.grad.numpy()) <= 1e-15
    out32, cache32 = LY.silu_forward(x.astype(np.float32))
    assert out32.dtype == LY.silu_backward(d.astype(np.float32), cache32).dtype == np.float32


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
def test_swiglu_matches_hf_llama_mlp(dtype, tol):
    torch = require_torch()
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    rng = np.random.default_rng(12)
    mlp = LlamaMLP(LlamaConfig(hidden_size=6, intermediate_size=10, num_attention_heads=2, num_key_value_heads=2)).to(
        getattr(torch, np.dtype(dtype).name)
    )
    x, d = randn(rng, 2, 3, 6).astype(dtype), randn(rng, 2, 3, 6).astype(dtype)
    tx = torch.from_numpy(x).requires_grad_()
    ty = mlp(tx)
    ty.backward(torch.from_numpy(d))
    weights = [p.detach().numpy() for p in (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)]
    out, cache = LY.swiglu_forward(x, *weights)
    grads = LY.swiglu_backward(d, cache)
    theirs = [tx.grad] + [p.weight.grad for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert rel_err(out, ty.detach().numpy()) <= tol
    for ours, t in zip(grads, theirs):
        assert rel_err(ours, t.numpy()) <= tol


# --------------------------------------------------------------------------- feed-forward, embeddings, pooling


def test_feed_forward_matches_torch_mlp():
    torch = require_torch()
    rng = np.random.default_rng(4)
    x, W1, b1, W2, b2 = randn(rng, 2, 3, 6), randn(rng, 24, 6), randn(rng, 24), randn(rng, 6, 24), randn(rng, 6)
    d = randn(rng, 2, 3, 6)
    t = [torch.from_numpy(a).requires_grad_() for a in (x, W1, b1, W2, b2)]
    F = torch.nn.functional
    ty = F.linear(F.gelu(F.linear(t[0], t[1], t[2])), t[3], t[4])
    ty.backward(torch.from_numpy(d))
    out, cache = LY.feed_forward_forward(x, W1, b1, W2, b2)
    assert rel_err(out, ty.detach().numpy()) <= 1e-14
    for ours, theirs in zip(LY.feed_forward_backward(d, cache), t):
        assert rel_err(ours, theirs.grad.numpy()) <= 1e-13


def test_bert_embeddings_accumulate_repeated_ids_and_positions():
    rng = np.random.default_rng(5)
    ids = np.array([[2, 2, 2], [1, 2, 0]])
    types = np.array([[0, 0, 1], [0, 1, 1]])
    word, pos, tt = randn(rng, 4, 3), randn(rng, 5, 3), randn(rng, 2, 3)
    out, cache = LY.bert_embeddings_forward(ids, types, word, pos, tt)
    np.testing.assert_array_equal(out[1, 2], word[0] + tt[1] + pos[2])
    d = randn(rng, 2, 3, 3)
    d_word, d_pos, d_tt = LY.bert_embeddings_backward(d, cache)
    np.testing.assert_allclose(d_word[2], d[0].sum(0) + d[1, 1])  # id 2 appears four times
    np.testing.assert_allclose(d_pos[:3], d.sum(0))  # position j is used by every sequence
    assert not d_pos[3:].any() and not d_word[3].any()
    np.testing.assert_allclose(d_tt[1], d[0, 2] + d[1, 1] + d[1, 2])


def test_mean_pool_ignores_padding():
    rng = np.random.default_rng(6)
    x = randn(rng, 2, 4, 3)
    keep = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    out, cache = LY.mean_pool_forward(x, keep)
    np.testing.assert_allclose(out[1], x[1, :2].mean(0))
    dx = LY.mean_pool_backward(np.ones((2, 3)), cache)
    assert not dx[1, 2:].any()
    with pytest.raises(ValueError, match="attention_mask"):
        LY.mean_pool_forward(x, keep[:, :3])


def test_ids_and_masks_given_as_ragged_lists_are_refused_naming_the_argument():
    """Reliability 10: a ragged nested list gave NumPy's own ValueError, which names no argument."""
    table, x = np.zeros((5, 2)), np.zeros((2, 2, 3))
    for call, name in (
        (lambda: LY.embedding_forward([[1, 2], [3]], table), "ids"),
        (lambda: LY.bert_embeddings_forward([[1, 2], [3]], [[0, 0], [0]], table, table, table), "input_ids"),
        (lambda: LY.mean_pool_forward(x, [[1, 1], [1]]), "attention_mask"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} is not a rectangular array"):
            call()
