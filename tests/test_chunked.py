"""mha_numpy.chunked: the blocked online-softmax path agrees with the vectorized one (outputs, lazily
computed weights, gradients), passes the float64 gradient checks, skips fully masked tiles, handles
fully masked rows and dropout, validates its arguments, and its memory grows like L·block, not L²."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy import MultiHeadAttention, chunked, masks
from mha_numpy import functional as F
from mha_numpy.gradcheck import check_function, check_mha

B, H, LQ, LK, D = 2, 2, 7, 5, 3  # 7 and 5: not multiples of the block sizes 3 and 16
BLOCKS = [1, 3, 16, 64]  # 64 > L: one tile per head
MASKS = ["none", "padding", "causal", "bool", "additive", "additive+padding", "fully masked rows"]


def make_mask(kind, rng, Lq=LQ, Lk=LK):
    lengths = np.array([Lk, 2])
    return {
        "none": None,
        "padding": masks.padding_mask(lengths, Lk),  # (B, 1, 1, Lk)
        "causal": masks.causal_mask(Lq, Lk),  # (Lq, Lk)
        "bool": np.concatenate([np.ones((B, 1, Lq, 1), bool), rng.random((B, 1, Lq, Lk - 1)) < 0.5], axis=-1),
        "additive": rng.normal(0, 2, (B, H, Lq, Lk)),
        "additive+padding": masks.combine_masks(rng.normal(0, 2, (Lq, Lk)), masks.padding_mask(lengths, Lk)),
        # batch 1 has no key at all, and in batch 0 query rows 1 and 4 see nothing
        "fully masked rows": np.stack([np.ones((Lq, Lk), bool), np.zeros((Lq, Lk), bool)])[:, None]
        & ~np.isin(np.arange(Lq), [1, 4])[None, None, :, None],
    }[kind]


def qkv(rng, dtype=np.float64, Lq=LQ, Lk=LK):
    return (
        rng.standard_normal((B, H, Lq, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D)).astype(dtype),
        rng.standard_normal((B, H, Lk, D + 1)).astype(dtype),  # dv != d
    )


def close(a, b, tol=1e-12) -> bool:
    """|a - b| <= tol · max(1, max |b|): relative, but also fine for a gradient that is 0 (b_k)."""
    return float(np.abs(np.asarray(a) - b).max()) <= tol * max(1.0, float(np.abs(b).max()))


def both(q, k, v, mask, d_context, **kw):
    """(context, weights, dq, dk, dv) of the vectorized path and of impl=chunked with kw."""
    out = []
    for impl, extra in (("vectorized", {}), ("chunked", kw)):
        ctx, cache = F.scaled_dot_product_attention_forward(q, k, v, mask, impl=impl, **extra)
        grads = F.scaled_dot_product_attention_backward(d_context, cache)
        out.append((ctx, cache.attn_weights, *grads))
    return out


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("kind", MASKS)
def test_functional_matches_vectorized(kind, block_size, num_threads):
    rng = np.random.default_rng(0)
    q, k, v = qkv(rng)
    mask = make_mask(kind, rng)
    d_context = rng.standard_normal((B, H, LQ, D + 1))
    ref, got = both(q, k, v, mask, d_context, block_size=block_size, num_threads=num_threads)
    for name, a, b in zip(["context", "attn_weights", "dq", "dk", "dv"], got, ref):
        assert np.isfinite(a).all(), name
        assert rel_err(a, b) <= 1e-12, name


@pytest.mark.parametrize(
    "kind, block_size, num_threads",
    [
        ("none", 1, 1),
        ("padding", 3, 2),
        ("causal", 3, 1),
        ("bool", 16, 2),
        ("additive", 64, 1),
        ("fully masked rows", 3, 2),
    ],
)
def test_functional_gradcheck(kind, block_size, num_threads):
    rng = np.random.default_rng(1)
    q, k, v = (x[:, :1] for x in qkv(rng))  # one head: a quicker check, B = 2 still
    mask = make_mask(kind, rng)
    mask = mask if mask is None or mask.ndim < 4 else mask[:, :1]
    ctx, cache = chunked.attention_forward(q, k, v, mask, block_size=block_size, num_threads=num_threads)
    d_context = rng.standard_normal(ctx.shape)  # random upstream gradient
    dq, dk, dv = chunked.attention_backward(d_context, cache)

    def fwd(q, k, v):
        return chunked.attention_forward(q, k, v, mask, block_size=block_size, num_threads=num_threads)[0]

    report = check_function(fwd, dict(q=dq, k=dk, v=dv), dict(q=q, k=k, v=v), d_context)
    assert report.passed, str(report)
    assert max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)


def mha_case(rng, self_attention, bias, dtype=np.float64, **kw):
    E, Lq, Lk = 6, 5, 4
    kdim, vdim = (None, None) if self_attention else (4, 3)
    mha = MultiHeadAttention(E, 2, bias=bias, kdim=kdim, vdim=vdim, dtype=dtype, rng=3, **kw)
    for name, p in mha.params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.5, p.shape)  # nonzero biases, so bias bugs show
    if self_attention:  # query is key is value: the fused QKV projection
        x = rng.standard_normal((B, Lq, E)).astype(dtype)
        return mha, (x, x, x)
    return mha, (
        rng.standard_normal((B, Lq, E)).astype(dtype),
        rng.standard_normal((B, Lk, 4)).astype(dtype),
        rng.standard_normal((B, Lk, 3)).astype(dtype),
    )


@pytest.mark.parametrize(
    "self_attention, bias, kind, block_size, num_threads",
    [
        (True, True, "causal", 3, 2),
        (True, False, "padding", 2, 1),
        (False, True, "additive+padding", 3, 1),
        (False, True, "fully masked rows", 16, 2),
    ],
)
def test_module_matches_vectorized_and_gradcheck(self_attention, bias, kind, block_size, num_threads):
    rng = np.random.default_rng(2)
    mha, (query, key, value) = mha_case(rng, self_attention, bias, impl="chunked", block_size=block_size)
    mha.num_threads = num_threads
    ref = MultiHeadAttention(6, 2, bias=bias, kdim=mha.kdim, vdim=mha.vdim, rng=0)
    ref.params = {n: p.copy() for n, p in mha.params.items()}
    mask = make_mask(kind, rng, query.shape[1], key.shape[1])
    out, cache = mha.forward(query, key, value, mask)
    out_ref, cache_ref = ref.forward(query, key, value, mask)
    d_output = rng.standard_normal(out.shape)
    grads, grads_ref = mha.backward(d_output, cache), ref.backward(d_output, cache_ref)
    assert rel_err(out, out_ref) <= 1e-12
    for name in ("attn_weights", "scores", "Q", "K", "V", "context"):
        assert rel_err(getattr(cache, name), getattr(cache_ref, name)) <= 1e-12, name
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        assert grads[name].shape == grads_ref[name].shape, name
        assert close(grads[name], grads_ref[name]), name
    report = check_mha(mha, query, key, value, mask=mask)
    assert report.passed, str(report)
    assert max(r.max_rel_err for r in report.rows) <= 1e-7, str(report)


def test_fully_masked_rows_give_zero_weights_context_and_finite_gradients():
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng)
    mask = make_mask("fully masked rows", rng)
    ctx, cache = chunked.attention_forward(q, k, v, mask, block_size=2, num_threads=2)
    grads = chunked.attention_backward(rng.standard_normal(ctx.shape), cache)
    assert np.all(ctx[1] == 0) and np.all(ctx[0, :, [1, 4]] == 0)
    assert np.all(cache.attn_weights[1] == 0) and np.all(cache.attn_weights[0, :, [1, 4]] == 0)
    assert np.all(grads[0][1] == 0) and all(np.isfinite(g).all() for g in grads)
    np.testing.assert_allclose(cache.attn_weights[0, :, [0, 2, 3, 5, 6]].sum(-1), 1.0, rtol=1e-12)


def test_causal_mask_skips_the_tiles_above_the_diagonal():
    # A tile that is computed multiplies its (all-zero) weights by V: NaN in V would leak in as 0·NaN.
    # With block 4, queries 0-3 must never touch keys 4-7, so NaN there leaves those rows finite.
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 1, 8, 3)) for _ in range(3))
    v[0, 0, 4:] = np.nan
    ctx, cache = chunked.attention_forward(q, k, v, masks.causal_mask(8), block_size=4, num_threads=1)
    assert np.isfinite(ctx[0, 0, :4]).all()
    assert np.isnan(ctx[0, 0, 4:]).all()  # the test would be vacuous if NaN never propagated
    ref, _ = F.scaled_dot_product_attention_forward(q[..., :4, :], k[..., :4, :], v[..., :4, :], masks.causal_mask(4))
    assert rel_err(ctx[0, 0, :4], ref[0, 0]) <= 1e-12


def test_dropout_regenerates_the_same_tiles_in_the_backward():
    rng = np.random.default_rng(5)
    mha, (x, _, _) = mha_case(rng, True, True, impl="chunked", block_size=3, dropout=0.3)
    out, cache = mha.forward(x, x, x, training=True)
    keep = cache.dropout_mask  # assembled from the per-tile generators, on request
    assert keep.shape == (B, 2, 5, 5) and 0 < keep.mean() < 1
    ref = MultiHeadAttention(6, 2, dropout=0.3, rng=0)
    ref.params = mha.params
    out_ref, cache_ref = ref.forward(x, x, x, training=True, dropout_mask=keep)
    assert rel_err(out, out_ref) <= 1e-12
    d_output = rng.standard_normal(out.shape)
    grads, grads_ref = mha.backward(d_output, cache), ref.backward(d_output, cache_ref)
    for name in grads:
        assert close(grads[name], grads_ref[name]), name
    report = check_mha(mha, x, x, x, training=True)  # holds cache.dropout_mask fixed
    assert report.passed, str(report)


def test_float32_keeps_its_dtype_and_agrees_with_float64():
    rng = np.random.default_rng(6)
    mha64, (x, _, _) = mha_case(rng, True, True, impl="chunked", block_size=3)
    mha32 = MultiHeadAttention(6, 2, dtype=np.float32, rng=0, impl="chunked", block_size=3)
    mha32.params = {n: p.astype(np.float32) for n, p in mha64.params.items()}
    out64, c64 = mha64.forward(x, x, x)
    out32, c32 = mha32.forward(*(x.astype(np.float32),) * 3)
    d = rng.standard_normal(out64.shape)
    g64, g32 = mha64.backward(d, c64), mha32.backward(d.astype(np.float32), c32)
    assert out32.dtype == np.float32 and c32.attn_weights.dtype == np.float32
    assert rel_err(out32, out64) <= 1e-5
    for name in g32:
        assert g32[name].dtype == np.float32, name
        assert close(g32[name], g64[name], 1e-4), name


def test_matches_torch_sdpa_in_float64():
    torch = require_torch()
    rng = np.random.default_rng(7)
    q, k, v = qkv(rng)
    mask = make_mask("additive+padding", rng)
    d_context = rng.standard_normal((B, H, LQ, D + 1))
    ctx, cache = chunked.attention_forward(q, k, v, mask, block_size=3, num_threads=2)
    grads = chunked.attention_backward(d_context, cache)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    t_ctx = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(mask))
    t_ctx.backward(torch.tensor(d_context))
    assert rel_err(ctx, t_ctx.detach().numpy()) <= 1e-10
    for g, t in zip(grads, (tq, tk, tv)):
        assert rel_err(g, t.grad.numpy()) <= 1e-10


def test_inputs_are_not_modified():
    rng = np.random.default_rng(8)
    mha, (x, _, _) = mha_case(rng, True, True, impl="chunked", block_size=3)
    mask = make_mask("additive", rng, 5, 5)
    before = [a.copy() for a in (x, mask, *mha.params.values())]
    out, cache = mha.forward(x, x, x, mask)
    d_output = rng.standard_normal(out.shape)
    d_before = d_output.copy()
    mha.backward(d_output, cache)
    for a, b in zip([x, mask, *mha.params.values(), d_output], [*before, d_before]):
        np.testing.assert_array_equal(a, b)


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
    ],
)
def test_bad_impl_arguments_raise_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(6, 2, **kwargs)
    q = np.zeros((1, 1, 2, 3))
    with pytest.raises(ValueError, match=match):
        F.scaled_dot_product_attention_forward(q, q, q, **kwargs)


def test_bad_shapes_raise_before_any_work():
    q = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match="head dim"):
        chunked.attention_forward(q, np.zeros((1, 2, 3, 5)), q)
    with pytest.raises(ValueError, match="mask"):
        chunked.attention_forward(q, q, q, mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="d_context"):
        _, cache = chunked.attention_forward(q, q, q)
        chunked.attention_backward(np.zeros((1, 2, 3, 3)), cache)


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


def test_module_matches_torch_mha_in_float64():
    torch = require_torch()
    rng = np.random.default_rng(10)
    mha, (x, _, _) = mha_case(rng, True, True, impl="chunked", block_size=2)
    P, E = mha.params, mha.embed_dim
    out, cache = mha.forward(x, x, x, masks.causal_mask(5))
    d_output = rng.standard_normal(out.shape)
    grads = mha.backward(d_output, cache)
    t = {n: torch.tensor(p, requires_grad=True) for n, p in P.items()}
    tx = torch.tensor(x.transpose(1, 0, 2).copy(), requires_grad=True)  # (L, B, E), torch's default layout
    t_out, _ = torch.nn.functional.multi_head_attention_forward(
        tx, tx, tx, E, 2, torch.cat([t["W_q"], t["W_k"], t["W_v"]]), torch.cat([t["b_q"], t["b_k"], t["b_v"]]),
        None, None, False, 0.0, t["W_o"], t["b_o"],
        attn_mask=torch.tensor(masks.to_torch_attn_mask(masks.causal_mask(5))), need_weights=False,
    )  # fmt: skip
    t_out.backward(torch.tensor(d_output.transpose(1, 0, 2).copy()))
    assert rel_err(out, t_out.detach().numpy().transpose(1, 0, 2)) <= 1e-10
    d_x = grads["query"] + grads["key"] + grads["value"]
    assert rel_err(d_x, tx.grad.numpy().transpose(1, 0, 2)) <= 1e-10
    for name in P:
        assert close(grads[name], t[name].grad.numpy(), 1e-10), name
