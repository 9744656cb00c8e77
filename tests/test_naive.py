"""mha_numpy.naive: the per-(batch, head) loop agrees with the vectorized and chunked paths (outputs,
cache, gradients, the same dropout draw), passes the float64 gradient checks, and keeps float32."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy import MultiHeadAttention, masks, naive
from mha_numpy import functional as F
from mha_numpy.gradcheck import check_function, check_mha

B, H = 2, 2
MASKS = ["none", "padding", "causal", "bool", "additive", "fully masked rows"]


def make_mask(kind, rng, Lq, Lk):
    return {
        "none": None,
        "padding": masks.padding_mask(np.array([Lk, 2]), Lk),  # (B, 1, 1, Lk)
        "causal": masks.causal_mask(Lq, Lk),  # (Lq, Lk)
        "bool": np.concatenate([np.ones((B, 1, Lq, 1), bool), rng.random((B, 1, Lq, Lk - 1)) < 0.5], axis=-1),
        "additive": rng.normal(0, 2, (B, H, Lq, Lk)),
        # batch 1 sees no key at all; in batch 0, query row 1 sees nothing
        "fully masked rows": np.stack([np.ones((Lq, Lk), bool), np.zeros((Lq, Lk), bool)])[:, None]
        & (np.arange(Lq) != 1)[None, None, :, None],
    }[kind]


def close(a, b, tol=1e-12) -> bool:
    """|a - b| <= tol · max(1, max |b|): relative, but also fine for a gradient that is 0 (b_k)."""
    return float(np.abs(np.asarray(a) - b).max()) <= tol * max(1.0, float(np.abs(b).max()))


def make(rng, self_attention=False, bias=True, dtype=np.float64, Lq=5, Lk=4, **kw):
    E = 6
    kdim, vdim = (None, None) if self_attention else (4, 3)
    mhas = {
        impl: MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, dtype=dtype, rng=3, impl=impl, **extra, **kw)
        for impl, extra in (("vectorized", {}), ("naive", {}), ("chunked", dict(block_size=3)))
    }
    for name, p in mhas["vectorized"].params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.5, p.shape)  # nonzero biases, so bias bugs show
    for m in mhas.values():
        m.params = {n: p.copy() for n, p in mhas["vectorized"].params.items()}
    if self_attention:
        x = rng.standard_normal((B, Lq, E)).astype(dtype)
        return mhas, (x, x, x)
    return mhas, (
        rng.standard_normal((B, Lq, E)).astype(dtype),
        rng.standard_normal((B, Lk, 4)).astype(dtype),
        rng.standard_normal((B, Lk, 3)).astype(dtype),
    )


@pytest.mark.parametrize("self_attention", [False, True])
@pytest.mark.parametrize("kind", MASKS)
def test_three_implementations_agree(kind, self_attention):
    rng = np.random.default_rng(0)
    mhas, (query, key, value) = make(rng, self_attention, Lk=5 if self_attention else 4)
    mask = make_mask(kind, rng, query.shape[1], key.shape[1])
    d_output = rng.standard_normal(query.shape)
    results = {}
    for impl, mha in mhas.items():
        out, cache = mha.forward(query, key, value, mask)
        results[impl] = out, cache, mha.backward(d_output, cache)
    out_ref, cache_ref, grads_ref = results["vectorized"]
    for impl in ("naive", "chunked"):
        out, cache, grads = results[impl]
        assert rel_err(out, out_ref) <= 1e-12, impl
        for name in ("attn_weights", "scores", "Q", "K", "V", "context"):
            assert rel_err(getattr(cache, name), getattr(cache_ref, name)) <= 1e-12, (impl, name)
        assert grads.keys() == grads_ref.keys()
        for name in grads:
            assert np.isfinite(grads[name]).all(), (impl, name)
            assert close(grads[name], grads_ref[name]), (impl, name)


@pytest.mark.parametrize(
    "self_attention, bias, kind",
    [(False, True, "causal"), (True, False, "padding"), (False, True, "fully masked rows")],
)
def test_module_gradcheck(self_attention, bias, kind):
    rng = np.random.default_rng(1)
    mhas, (query, key, value) = make(rng, self_attention, bias, Lk=5 if self_attention else 4)
    mask = make_mask(kind, rng, query.shape[1], key.shape[1])
    report = check_mha(mhas["naive"], query, key, value, mask=mask)
    assert report.passed, str(report)
    assert max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_functional_gradcheck_and_agreement(kind):
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((B, H, 5, 3)), rng.standard_normal((B, H, 4, 3)), rng.standard_normal((B, H, 4, 2))
    mask = make_mask(kind, rng, 5, 4)
    ctx, cache = F.scaled_dot_product_attention_forward(q, k, v, mask, impl="naive")
    d_context = rng.standard_normal(ctx.shape)
    grads = F.scaled_dot_product_attention_backward(d_context, cache)
    ctx_ref, cache_ref = F.scaled_dot_product_attention_forward(q, k, v, mask)
    assert cache.impl == "naive" and rel_err(ctx, ctx_ref) <= 1e-12
    assert rel_err(cache.attn_weights, cache_ref.attn_weights) <= 1e-12
    for g, g_ref in zip(grads, F.scaled_dot_product_attention_backward(d_context, cache_ref)):
        assert rel_err(g, g_ref) <= 1e-12

    def fwd(q, k, v):
        return naive.attention_forward(q, k, v, mask)[0]

    report = check_function(fwd, dict(q=grads[0], k=grads[1], v=grads[2]), dict(q=q, k=k, v=v), d_context)
    assert report.passed, str(report)


def test_dropout_draws_the_same_mask_as_the_vectorized_path():
    rng = np.random.default_rng(3)
    mhas, (query, key, value) = make(rng, dropout=0.4)
    vec, nai = mhas["vectorized"], mhas["naive"]
    vec.rng, nai.rng = np.random.default_rng(11), np.random.default_rng(11)  # same generator state
    out_v, cache_v = vec.forward(query, key, value, training=True)
    out_n, cache_n = nai.forward(query, key, value, training=True)
    np.testing.assert_array_equal(cache_n.dropout_mask, cache_v.dropout_mask)
    assert 0 < cache_n.dropout_mask.mean() < 1
    assert rel_err(out_n, out_v) <= 1e-12
    d_output = rng.standard_normal(out_v.shape)
    grads_v, grads_n = vec.backward(d_output, cache_v), nai.backward(d_output, cache_n)
    for name in grads_v:
        assert close(grads_n[name], grads_v[name]), name
    report = check_mha(nai, query, key, value, training=True)  # holds cache.dropout_mask fixed
    assert report.passed, str(report)


def test_float32_keeps_its_dtype():
    rng = np.random.default_rng(4)
    mhas, (query, key, value) = make(rng, dtype=np.float32)
    out, cache = mhas["naive"].forward(query, key, value, masks.causal_mask(5, 4))
    grads = mhas["naive"].backward(np.ones_like(out), cache)
    assert out.dtype == np.float32 and cache.attn_weights.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())
    out_ref, _ = mhas["vectorized"].forward(query, key, value, masks.causal_mask(5, 4))
    assert rel_err(out, out_ref) <= 1e-5


def test_matches_torch_mha_in_float64():
    torch = require_torch()
    rng = np.random.default_rng(5)
    mhas, (x, _, _) = make(rng, self_attention=True)
    mha = mhas["naive"]
    P = mha.params
    mask = masks.padding_mask(np.array([5, 3]), 5)
    out, cache = mha.forward(x, x, x, mask)
    d_output = rng.standard_normal(out.shape)
    grads = mha.backward(d_output, cache)
    t = {n: torch.tensor(p, requires_grad=True) for n, p in P.items()}
    tx = torch.tensor(x, requires_grad=True)
    t_out, _ = torch.nn.functional.multi_head_attention_forward(
        tx.transpose(0, 1), tx.transpose(0, 1), tx.transpose(0, 1), 6, H,
        torch.cat([t["W_q"], t["W_k"], t["W_v"]]), torch.cat([t["b_q"], t["b_k"], t["b_v"]]),
        None, None, False, 0.0, t["W_o"], t["b_o"],
        key_padding_mask=torch.tensor(masks.to_torch_key_padding_mask(mask)), need_weights=False,
    )  # fmt: skip
    t_out = t_out.transpose(0, 1)
    t_out.backward(torch.tensor(d_output))
    assert rel_err(out, t_out.detach().numpy()) <= 1e-10
    assert rel_err(grads["query"] + grads["key"] + grads["value"], tx.grad.numpy()) <= 1e-10
    for name in P:
        assert close(grads[name], t[name].grad.numpy(), 1e-10), name  # b_k: 0 up to rounding
