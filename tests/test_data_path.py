"""The module's data path as data (mha_numpy/steps.py, mha_numpy/flow.py): the plan a reader sees, validation once
per call at the boundary, one dtype rule, empty calls, and the size of the module's functions."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import mha_numpy
from mha_numpy import KVCache, MultiHeadAttention, kernels, masks
from mha_numpy import functional as F

ROOT = Path(mha_numpy.__file__).parent
KERNELS = list(kernels.KERNELS)


def test_the_plan_is_readable_and_follows_the_options():
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, rope_theta=1e4, alibi=True, rng=0)
    assert [type(s).__name__ for s in mha.steps] == ["Project", "Split", "Rope", "Alibi", "RepeatKV", "Attend",
                                                     "Merge", "OutProject"]  # fmt: skip
    text = mha.describe()
    assert "Rope" in text and "W_q (16, 16)" in text and "W_k (8, 16)" in text
    assert "AppendToCache" in mha.describe(kv_cache=True) and "AppendToCache" not in text
    mha.alibi = False  # an option changed after construction: checked, and the next call's steps follow it
    assert "Alibi" not in mha.describe()
    with pytest.raises(ValueError, match="alibi must be True or False"):
        mha.alibi = "yes"
    with pytest.raises(ValueError, match="unknown option 'rope'"):
        MultiHeadAttention(16, 4, rope=1e4)


def counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("impl", KERNELS)
def test_a_call_validates_each_argument_once(monkeypatch, impl):
    """The mask, the dropout mask and the positions are checked at the module's boundary and never again below it
    (not in functional's pairs, not per head in the naive kernel); a pair called directly still checks them."""
    import mha_numpy._checks as checks
    import mha_numpy.functional as F
    import mha_numpy.kernels.base as base

    mha = MultiHeadAttention(8, 2, rope_theta=10.0, dropout=0.2, impl=impl, rng=0)
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    keep = np.ones((2, 2, 3, 3), bool)
    mask_calls = [counting(monkeypatch, m, "check_mask") for m in (F, base)]
    dropout_calls = counting(monkeypatch, base, "check_dropout")
    position_calls = counting(monkeypatch, F, "check_positions")
    array_calls = counting(monkeypatch, F, "as_float_array")
    out, cache = mha.forward(x, x, x, mask=masks.causal_mask(3), training=True, dropout_mask=keep, positions=[3, 4, 5])
    mha.backward(np.ones_like(out), cache)
    assert sum(map(len, mask_calls)) == 2  # the mask and the bias slot of check_args: once each, nothing below
    assert len(dropout_calls) == 1 and len(position_calls) == 1 and len(array_calls) == 0
    with pytest.raises(ValueError, match="mask with shape"):  # the pair on its own still checks
        F.apply_mask_forward(np.zeros((1, 1, 2, 2)), np.ones((3, 3), bool))
    assert checks.check_mask is not None


@pytest.mark.parametrize("impl", KERNELS)
def test_one_dtype_rule(impl):
    """A float32 call stays float32; a differentiated argument of another dtype is refused, naming it; a float mask
    (not differentiated) is converted. The same on every kernel."""
    kernel = kernels.get_kernel(impl)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    with pytest.raises(ValueError, match=r"bias has dtype float64 .* but q, k, v are float32"):
        kernel.forward(q, k, v, bias=np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"bias has dtype float64 .* but q, k, v are float32"):  # the pair too
        F.scaled_dot_product_attention_forward(q, k, v, bias=np.zeros((3, 3)))
    ctx, cache = kernel.forward(q, k, v, mask=np.where(np.tril(np.ones((3, 3))) > 0, 0.0, -1e300))  # float64 mask
    assert ctx.dtype == np.float32 and cache.attn_weights.dtype == np.float32
    assert all(g.dtype == np.float32 for g in kernel.backward(np.ones_like(ctx), cache)[:3])
    mha = MultiHeadAttention(8, 2, dtype=np.float32, impl=impl, rng=0)
    mha.params["W_q"] = mha.params["W_q"].astype(np.float64)  # replaced by another dtype
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"params\['W_q'\] has dtype float64 .* needs float32"):
        mha.forward(x, x, x)
    mha.params["W_q"] = np.zeros((8, 4), np.float32)  # or another shape
    with pytest.raises(ValueError, match=r"params\['W_q'\] .* shape \(8, 4\)"):
        mha.forward(x, x, x)
    del mha.params["W_q"]
    with pytest.raises(ValueError, match="params has no W_q"):
        mha.forward(x, x, x)


@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize("options", [{}, dict(alibi=True), dict(rel_pos_max_distance=2), dict(num_kv_heads=1),
                                     dict(rope_theta=10.0, qk_norm=True, softcap=2.0),
                                     dict(add_bias_kv=True, add_zero_attn=True)])  # fmt: skip
def test_empty_calls_give_empty_results(impl, options):
    """Lq = 0 or Lk = 0, with every score step: the documented empty result (no query: nothing; no key: zero weights
    and a zero output projection of zero contexts), and an empty decoding step appends nothing."""
    mha = MultiHeadAttention(8, 2, impl=impl, rng=0, **options)
    x = np.random.default_rng(2).standard_normal((2, 3, 8))
    for query, key in ((x[:, :0], x), (x, x[:, :0])):
        out, cache = mha.forward(query, key, key)
        extra = int(mha.add_bias_kv) + int(mha.add_zero_attn)
        assert out.shape == (2, query.shape[1], 8)
        assert cache.attn_weights.shape == (2, 2, query.shape[1], key.shape[1] + extra)
        grads = mha.backward(np.ones_like(out), cache)
        assert grads["query"].shape == query.shape and grads["key"].shape == key.shape
        if key.shape[1] == 0 and not mha.add_bias_kv:  # (appended keys are keys: then the weights are theirs)
            np.testing.assert_allclose(out, np.broadcast_to(mha.params["b_o"], out.shape))  # zero contexts, + b_o
    if "rel_pos_max_distance" not in options:
        kv = KVCache()
        mha.forward(x, x, x, kv_cache=kv)
        out, _ = mha.forward(x[:, :0], x[:, :0], x[:, :0], kv_cache=kv)
        assert out.shape == (2, 0, 8) and len(kv) == 3


def test_no_function_of_the_module_is_longer_than_40_lines():
    for name in ("attention.py", "steps.py", "flow.py"):
        for node in ast.walk(ast.parse((ROOT / name).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 40, f"{name}: {node.name} has {length} lines"


def test_the_plan_shown_in_the_architecture_doc_is_what_describe_prints():
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    shown = doc.split(">>> print(mha.describe())\n", 1)[1].split("```", 1)[0].strip()
    assert shown == MultiHeadAttention(64, 8, num_kv_heads=2, rope_theta=10000.0, rng=0).describe()


@pytest.mark.parametrize("impl", KERNELS)
def test_heads_of_their_own_size_and_a_scale_of_their_own(impl, rng):
    """head_dim d with H·d != E (W_q (H·d, E), W_o (E, H·d)) and scale != 1/√d: against an einsum reference on every
    kernel, every gradient by finite differences, recompute equal to the default path."""
    from helpers import grad_check

    E, H, d, scale = 12, 4, 5, 0.37
    mha = MultiHeadAttention(E, H, head_dim=d, scale=scale, num_kv_heads=2, impl=impl, rng=0)
    assert mha.params["W_q"].shape == (H * d, E) and mha.params["W_k"].shape == (2 * d, E)
    assert mha.params["W_o"].shape == (E, H * d) and "head_dim=5" in repr(mha) and "scale=0.37" in repr(mha)
    for n, p in mha.params.items():
        if n.startswith("b_"):
            p[...] = rng.normal(0, 0.5, p.shape)
    x = rng.standard_normal((2, 3, E))
    out, _ = mha.forward(x, x, x)
    P = mha.params
    q, k, v = (x @ P[f"W_{n}"].T + P[f"b_{n}"] for n in "qkv")
    Q = q.reshape(2, 3, H, d).transpose(0, 2, 1, 3)
    K, V = (np.repeat(a.reshape(2, 3, 2, d).transpose(0, 2, 1, 3), 2, axis=1) for a in (k, v))
    s = np.einsum("bhid,bhjd->bhij", Q, K) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    ref = np.einsum("bhij,bhjd->bhid", w, V).transpose(0, 2, 1, 3).reshape(2, 3, H * d) @ P["W_o"].T + P["b_o"]
    assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()

    def forward(query, **params):
        mha.params.update(params)
        return mha.forward(query, query, query)

    def backward(d_out, cache):
        g = mha.backward(d_out, cache)
        return (g["query"] + g["key"] + g["value"], *(g[n] for n in mha.params))

    grad_check(forward, backward, dict(query=x, **{n: p.copy() for n, p in mha.params.items()}), ["query", *P])
    lean = MultiHeadAttention(E, H, head_dim=d, scale=scale, num_kv_heads=2, impl=impl, rng=0, recompute=True)
    lean.params = mha.params
    assert np.abs(lean.forward(x, x, x)[0] - mha.forward(x, x, x)[0]).max() <= 1e-13 * np.abs(out).max()
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        MultiHeadAttention(E, H, head_dim=0)
    with pytest.raises(ValueError, match="not divisible by num_heads=5 .or give head_dim"):
        MultiHeadAttention(E, 5)
