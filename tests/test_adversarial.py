"""Adversarial inputs on every registered kernel and through the module: each case asserts the documented
result of docs/edge-cases.md or a ValueError naming the argument. (NaN/inf rows, empty inputs, large logits,
finite "minus infinity" masks, wrong d_context / d_output and foreign caches are in test_kernels.py; concurrent
callers in test_chunked.py; every CLI mistake in test_cli.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rel_err
from reference import attention

from mha_numpy import MultiHeadAttention, kernels
from mha_numpy import functional as F

KERNELS = sorted(kernels.KERNELS)
SHAPE = (2, 2, 4, 3)  # (B, H, L, d)


def qkv(rng, dtype=np.float64):
    return tuple(rng.standard_normal(SHAPE).astype(dtype) for _ in range(3))


@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_, object, np.complex128, np.longdouble])
def test_inputs_of_other_dtypes_are_refused_naming_the_argument(impl, dtype, rng):
    kernel = kernels.get_kernel(impl)
    q, k, v = qkv(rng)
    bad = np.zeros(SHAPE, dtype=dtype)
    for name, args in (("q", (bad, k, v)), ("k", (q, bad, v)), ("v", (q, k, bad))):
        with pytest.raises(ValueError, match=rf"^{name} must be a floating-point array .*{np.dtype(dtype)}"):
            kernel.forward(*args)


@pytest.mark.parametrize("impl", KERNELS)
def test_mixed_precision_q_k_v_are_refused(impl, rng):
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match="one dtype"):
        kernels.get_kernel(impl).forward(q, k.astype(np.float32), v)


@pytest.mark.parametrize("impl", KERNELS)
def test_read_only_and_non_contiguous_inputs_work_and_are_untouched(impl, rng):
    kernel = kernels.get_kernel(impl)
    q, k, v = (np.asfortranarray(x) for x in qkv(rng))  # non-contiguous in C order
    big = rng.standard_normal((2, 2, 8, 3))[:, :, ::2]  # a strided view: every other key
    mask = rng.random((2, 1, 4, 4)) < 0.7
    mask[..., 0] = True
    for a in (q, k, v, big, mask):
        a.setflags(write=False)
    before = [a.copy() for a in (q, k, v, big, mask)]
    ctx, cache = kernel.forward(q, big, v, mask)
    assert rel_err(ctx, attention(q, big, v, mask)[0]) <= 1e-12
    d = np.asfortranarray(rng.standard_normal(ctx.shape))
    d.setflags(write=False)
    kernel.backward(d, cache)
    for a, b in zip((q, k, v, big, mask), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize(
    "mask_shape", [(4,), (1, 4), (4, 1), (1, 1, 1, 1), (2, 1, 4, 1), (1, 2, 1, 4), (2, 2, 4, 4)], ids=str
)
def test_every_broadcastable_mask_shape(impl, mask_shape, rng):
    q, k, v = qkv(rng)
    mask = rng.random(mask_shape) < 0.6
    ctx, cache = kernels.get_kernel(impl).forward(q, k, v, mask)
    ref, w = attention(q, k, v, np.broadcast_to(mask, (2, 2, 4, 4)))
    assert rel_err(ctx, ref) <= 1e-12 and rel_err(cache.attn_weights, w) <= 1e-12


@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize(
    "mask, match",
    [
        (np.ones((3, 4), bool), r"mask with shape \(3, 4\) does not broadcast"),
        (np.ones((2, 2, 2, 4, 4), bool), r"mask with shape \(2, 2, 2, 4, 4\) does not broadcast"),
        (np.ones((4, 4), np.int64), "mask must be boolean .* got dtype int64"),
        (np.ones((4, 4), np.float16), "mask must be boolean .* got dtype float16"),
    ],
    ids=["wrong-shape", "five-dims", "int", "float16"],
)
def test_bad_masks_are_refused_naming_the_mask(impl, mask, match, rng):
    with pytest.raises(ValueError, match=match):
        kernels.get_kernel(impl).forward(*qkv(rng), mask)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dropout="0.1"), "dropout must be in"),
        (dict(dropout=None), "dropout must be in"),
        (dict(dropout=float("nan")), "dropout must be in"),
        (dict(rng="abc"), "rng must be"),
        (dict(rng=-1), "rng must be"),
        (dict(dtype="abc"), "dtype must be"),
        (dict(dtype=np.float16), "dtype must be"),
        (dict(embed_dim=True), "embed_dim must be a positive int"),
        (dict(num_heads=0), "num_heads must be a positive int"),
        (dict(impl=None), "impl must be"),
    ],
)
def test_module_arguments_are_checked_before_anything_runs(kwargs, match):
    args = dict(embed_dim=8, num_heads=2) | kwargs
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**args)


@pytest.mark.parametrize("impl", KERNELS)
def test_module_with_an_empty_memory_and_an_empty_batch(impl, rng):
    """Lk = 0 (cross-attention to nothing): output b_o, zero weights, zero input gradients; B = 0: empty."""
    mha = MultiHeadAttention(6, 2, kdim=4, vdim=3, rng=0, impl=impl)
    mha.params["b_o"][...] = rng.standard_normal(6)
    query = rng.standard_normal((2, 3, 6))
    out, cache = mha.forward(query, np.zeros((2, 0, 4)), np.zeros((2, 0, 3)))
    np.testing.assert_array_equal(out, np.broadcast_to(mha.params["b_o"], out.shape))
    assert cache.attn_weights.shape == (2, 2, 3, 0)
    g = mha.backward(rng.standard_normal(out.shape), cache)
    assert np.all(g["query"] == 0) and np.all(g["W_q"] == 0) and g["key"].shape == (2, 0, 4)
    out, cache = mha.forward(np.zeros((0, 3, 6)), np.zeros((0, 2, 4)), np.zeros((0, 2, 3)))
    assert out.shape == (0, 3, 6) and all(np.all(x == 0) for x in mha.backward(out, cache).values())


def test_functional_backward_refuses_a_d_context_that_would_broadcast(rng):
    ctx, cache = F.scaled_dot_product_attention_forward(*qkv(rng))
    with pytest.raises(ValueError, match=r"d_context has shape \(1, 2, 4, 3\)"):
        F.scaled_dot_product_attention_backward(np.ones((1, *ctx.shape[1:])), cache)
    with pytest.raises(ValueError, match="d_context has shape .* and dtype float32"):
        F.scaled_dot_product_attention_backward(np.ones(ctx.shape, np.float32), cache)
