"""The kernels' one score hook: a ``kernels.ScoreMod`` in FlexAttention's form, ``mod(score, b, h, q_idx, kv_idx,
**params)`` with its VJP, carries any score term with parameters through every kernel, which return the parameters'
gradients (``AttentionGrads.score_params``) with no kernel knowing the term.

A term written here, in the test (a per-head multiplier, a per-query offset, a distance penalty: three things
torch's own FlexAttention tests use), runs on every registered kernel and on split-KV shards; its outputs match a
plain NumPy reference and every gradient (q, k, v and each parameter) matches central differences in float64, with
a random upstream gradient, a fully masked row and rows saturated on one key (the chunked kernel's pivot path).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import grad_check, rel_err

from mha_numpy import functional as F
from mha_numpy import kernels

B, H, LQ, LK, D = 2, 3, 7, 9, 4


def mod(score, b, h, q_idx, kv_idx, *, head_scale, q_bias):
    return score * head_scale[h] + q_bias[q_idx] - 0.1 * np.abs(q_idx - kv_idx)


def mod_vjp(score, b, h, q_idx, kv_idx, d_out, *, head_scale, q_bias):
    d_scale = F.sum_by_index(d_out * score, h, head_scale.size)  # (H,) Σ over each head's entries
    d_bias = F.sum_by_index(d_out, q_idx, q_bias.size)  # (LQ,)
    return d_out * head_scale[h], {"head_scale": d_scale, "q_bias": d_bias}


def reference(q, k, v, mask, head_scale, q_bias):
    """softmax(mod(q kᵀ / √d) + mask) v written out on the whole (B, H, Lq, Lk) tensor; a blocked row gives 0."""
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(D)
    b, h, i, j = np.ix_(range(B), range(H), range(LQ), range(LK))
    s = mod(s, b, h, i, j, head_scale=head_scale, q_bias=q_bias)
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return p @ v


def kernel_cases():
    cases = {name: kernels.get_kernel(name) for name in kernels.KERNELS}
    cases["chunked, 2 x 2 tiles, 2 threads"] = kernels.ChunkedKernel(block_size=2, num_threads=2)
    cases["split-KV, 3 shards"] = kernels.SplitKVKernel(num_shards=3, inner="chunked")
    return cases


@pytest.fixture
def inputs():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(B, H, LQ, D)), rng.normal(size=(B, H, LK, D)), rng.normal(size=(B, H, LK, D))
    q[0, 1, 2] *= 30.0  # rows saturated on one key: the chunked kernel's pivot entries
    q[1, 0, 5] *= 40.0
    mask = np.ones((B, 1, LQ, LK), dtype=bool)
    mask[0, 0, 3] = False  # a fully masked row: zero weights, zero context, zero gradients
    mask[1, 0, :, 6:] = False
    return q, k, v, mask, rng.normal(1.0, 0.3, H), rng.normal(0, 0.5, LQ)


@pytest.mark.parametrize("name", list(kernel_cases()))
def test_a_score_term_with_parameters_runs_on_every_kernel_and_its_gradients_check(name, inputs):
    kernel = kernel_cases()[name]
    q, k, v, mask, head_scale, q_bias = inputs

    def forward(q, k, v, head_scale, q_bias):
        term = kernels.ScoreMod("test", mod, mod_vjp, {"head_scale": head_scale, "q_bias": q_bias})
        return kernel.forward(q, k, v, mask, score_mods=(term,))

    def backward(d, cache):
        grads = kernel.backward(d, cache)
        return (*grads[:3], grads.score_params["test"]["head_scale"], grads.score_params["test"]["q_bias"])

    out, cache = forward(q, k, v, head_scale, q_bias)
    assert rel_err(out, reference(q, k, v, mask, head_scale, q_bias)) <= 1e-13
    assert np.all(out[0, :, 3] == 0.0)
    if hasattr(cache, "scores") and not name.startswith("split"):  # the cache contract: scores after the mods
        b, h, i, j = np.ix_(range(B), range(H), range(LQ), range(LK))
        plain = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(D)
        assert rel_err(cache.scores, mod(plain, b, h, i, j, head_scale=head_scale, q_bias=q_bias)) <= 1e-13
    grad_check(forward, backward, dict(q=q, k=k, v=v, head_scale=head_scale, q_bias=q_bias),
               ["q", "k", "v", "head_scale", "q_bias"])  # fmt: skip


def test_the_chunked_kernels_parameter_gradients_do_not_depend_on_its_threads(inputs):
    q, k, v, mask, head_scale, q_bias = inputs
    term = kernels.ScoreMod("test", mod, mod_vjp, {"head_scale": head_scale, "q_bias": q_bias})
    results = []
    for threads in (1, 2, 2):
        kernel = kernels.ChunkedKernel(block_size=2, num_threads=threads)
        out, cache = kernel.forward(q, k, v, mask, score_mods=(term,))
        grads = kernel.backward(np.ones_like(out), cache)
        results.append(grads.score_params["test"])
    for other in results[1:]:
        for name in ("head_scale", "q_bias"):
            assert np.array_equal(other[name], results[0][name]), name  # bit for bit: summed in a fixed order


def test_the_elementwise_pair_form_is_the_same_hook():
    """0.3's ScoreMod(name, pair forward, pair backward) is ``ScoreMod.elementwise``: no index, no parameter."""
    from functools import partial

    cap = kernels.ScoreMod.elementwise("cap", partial(F.soft_cap_forward, cap=2.0), F.soft_cap_backward)
    s = np.linspace(-5, 5, 11)
    assert np.array_equal(cap(s, 0, 0, 0, 0), F.soft_cap_forward(s, 2.0)[0])
    d, params = cap.backward(s, 0, 0, 0, 0, np.ones_like(s))
    assert params == {} and np.array_equal(d, F.soft_cap_backward(np.ones_like(s), F.soft_cap_forward(s, 2.0)[1]))


def test_a_kernel_backward_is_still_five_gradients(inputs):
    """The return stays 0.3's five values (dq, dk, dv, d_bias, d_sinks); the score terms' parameters ride along."""
    q, k, v, mask, *_ = inputs
    for kernel in kernel_cases().values():
        out, cache = kernel.forward(q, k, v, mask)
        grads = kernel.backward(np.ones_like(out), cache)
        assert len(grads) == 5 and grads.score_params == {}
        dq, dk, dv, d_bias, d_sinks = grads
        assert d_bias is None and d_sinks is None


@pytest.mark.parametrize("name", list(kernel_cases()))
def test_a_call_with_no_key_gives_the_parameters_zero_gradients_not_none(name, inputs):
    """No key, so no block of scores: each parameter's gradient is zeros of its shape (Hypothesis found None here,
    through the module's relative bias on the chunked kernel)."""
    kernel = kernel_cases()[name]
    q, _, _, _, head_scale, q_bias = inputs
    empty = np.zeros((B, H, 0, D))
    term = kernels.ScoreMod("test", mod, mod_vjp, {"head_scale": head_scale, "q_bias": q_bias})
    out, cache = kernel.forward(q, empty, empty, score_mods=(term,))
    grads = kernel.backward(np.ones_like(out), cache).score_params["test"]
    assert np.array_equal(grads["head_scale"], np.zeros(H)) and np.array_equal(grads["q_bias"], np.zeros(LQ))
