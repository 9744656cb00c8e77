"""The memory budget: a call that would keep more for its backward than ``memory_budget`` (64 MiB by default on
``impl="auto"``) runs as ``recompute=True`` does, with the same outputs and gradients; what cannot recompute (a KV
cache, differential attention) runs the default path; ``flow.kept_bytes`` counts what the default path keeps."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy import KVCache, MultiHeadAttention
from mha_numpy.attention import MHACache
from mha_numpy.flow import RecomputeCache
from mha_numpy.kernels import AutoKernel
from mha_numpy.kernels.auto import MEMORY_BUDGET
from mha_numpy.masks import causal_mask

B, L, E, H = 2, 7, 16, 4


def _modules(impl, **options):
    """The same module twice: one with no budget (never recomputes), one whose budget every call exceeds."""
    plain = MultiHeadAttention(E, H, impl=impl, rng=3, memory_budget=2**62, **options)
    tight = MultiHeadAttention(E, H, impl=impl, rng=3, memory_budget=0, **options)
    return plain, tight


@pytest.mark.parametrize("impl", ["vectorized", "chunked", "auto"])
@pytest.mark.parametrize("options", [{}, dict(num_kv_heads=2, rope_theta=10000.0), dict(alibi=True, sinks=True)])
def test_over_budget_recomputes_with_the_same_outputs_and_gradients(impl, options):
    plain, tight = _modules(impl, **options)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, L, E))
    mask = causal_mask(L) & (rng.random((B, 1, 1, L)) > 0.2)  # causal and padded: some rows blocked
    d_out = rng.standard_normal((B, L, E))
    out_p, cache_p = plain(x, x, x, mask=mask)
    out_t, cache_t = tight(x, x, x, mask=mask)
    assert isinstance(cache_p, MHACache) and isinstance(cache_t, RecomputeCache)
    scale = max(np.abs(out_p).max(), 1.0)
    assert np.abs(out_t - out_p).max() <= 1e-13 * scale
    g_p, g_t = plain.backward(d_out, cache_p), tight.backward(d_out, cache_t)
    assert g_p.keys() == g_t.keys()
    largest = max(np.abs(g).max() for g in g_p.values())  # b_k's gradient is 0 in theory: judged against this
    for name in g_p:
        err = np.abs(g_t[name] - g_p[name]).max() / max(np.abs(g_p[name]).max(), 1e-3 * largest)
        assert err <= 1e-12, (name, err)


def test_auto_has_a_64_mib_budget_that_other_kernels_do_not_have():
    assert MEMORY_BUDGET == 64 * 2**20 and AutoKernel.default_memory_budget == MEMORY_BUDGET
    assert MultiHeadAttention(E, H).kernel.default_memory_budget is None  # vectorized: no budget by default
    assert MultiHeadAttention(E, H, impl="chunked").kernel.default_memory_budget is None


def test_auto_recomputes_exactly_when_the_estimate_exceeds_its_budget(monkeypatch):
    """The default budget decides by itself (no flag); lowered so that a small call crosses it."""
    mha = MultiHeadAttention(E, H, impl="auto", rng=0)
    x = np.random.default_rng(1).standard_normal((B, L, E))
    _, cache = mha(x, x, x)
    assert isinstance(cache, MHACache)  # far below 64 MiB
    kept = _kept_bytes_of(cache)
    monkeypatch.setattr(mha.kernel, "default_memory_budget", kept)  # the estimate is not above: the default path
    assert isinstance(mha(x, x, x)[1], MHACache)
    monkeypatch.setattr(mha.kernel, "default_memory_budget", kept - 1)  # one byte less: recompute
    assert isinstance(mha(x, x, x)[1], RecomputeCache)
    mha.memory_budget = kept  # the module's own budget wins over the kernel's
    assert isinstance(mha(x, x, x)[1], MHACache)


def _kept_bytes_of(cache: MHACache) -> int:
    """What the default path really keeps for the backward, from its cache: Q, K, V, the context (each also made
    again as a gradient by the backward) and the kernel's (B, H, Lq, Lk) arrays."""
    heads = sum(a.nbytes for a in (cache.Q, cache.K, cache.V, cache.context))
    scores = [getattr(cache.attention, n, None) for n in ("scores", "masked_scores", "attn_weights")]
    kept_scores = [a for a in scores if isinstance(a, np.ndarray)] if cache.attention.kernel.score_arrays else []
    return 2 * heads + sum(a.nbytes for a in kept_scores)


@pytest.mark.parametrize("impl", ["vectorized", "chunked"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kept_bytes_counts_the_arrays_the_default_path_keeps(impl, dtype):
    """The estimate is the arrays themselves: Q, K, V (GQA: fewer key/value heads), the context, the scores."""
    from mha_numpy import flow

    mha = MultiHeadAttention(E, H, impl=impl, rng=0, num_kv_heads=2, dtype=dtype)
    rng = np.random.default_rng(2)
    q, kv = rng.standard_normal((B, L, E)).astype(dtype), rng.standard_normal((B, L + 3, E)).astype(dtype)
    steps, specs = mha._plan()
    f = mha._begin(steps, specs, q, kv, kv, None, False, None, None, None)
    _, cache = mha(q, kv, kv)
    assert flow.kept_bytes(f) == _kept_bytes_of(cache)


def test_what_cannot_recompute_runs_the_default_path_under_any_budget():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, E))
    mha = MultiHeadAttention(E, H, impl="auto", rng=0, memory_budget=0)
    kv = KVCache()
    out, cache = mha(x, x, x, kv_cache=kv)  # decoding keeps every head's K and V: no recompute, no refusal
    assert isinstance(cache, MHACache) and len(kv) == 3
    diff = MultiHeadAttention(E, H, impl="auto", rng=0, memory_budget=0, diff_attention=True, num_kv_heads=2)
    assert isinstance(diff(x, x, x)[1], MHACache)


@pytest.mark.parametrize("bad", [-1, 1.5, "64MiB", True])
def test_a_bad_budget_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="memory_budget"):
        MultiHeadAttention(E, H, memory_budget=bad)
    mha = MultiHeadAttention(E, H)
    with pytest.raises(ValueError, match="memory_budget"):
        mha.memory_budget = bad
