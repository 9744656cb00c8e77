"""Every combination of the data path's options with every kernel: it runs and passes a gradient check, or the one
builder (``steps.build_steps``) refuses it with a ValueError naming both options.

GQA × RoPE × ALiBi × relative bias × torch's appended keys × recompute × sinks × KV cache × dropout × 3 kernels. A call
with a KV cache is forward only: decoding token by token must equal the full causal forward. Every other call is
gradient-checked against central differences with a random upstream gradient, one random direction per input and
parameter (a wrong gradient passes only if its error is orthogonal to that direction: probability zero), and its
output is compared with the independent per-head reference where one exists (``variants_reference``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import directional_errors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha_numpy import KVCache, MultiHeadAttention, kernels, masks

H, D, B, L = 4, 2, 2, 4
E = H * D
OPTIONS = {
    "gqa": dict(num_kv_heads=2),
    "rope": dict(rope_theta=50.0),
    "alibi": dict(alibi=True),
    "rel_bias": dict(rel_pos_max_distance=2),
    "appended": dict(add_bias_kv=True, add_zero_attn=True),
    "recompute": dict(recompute=True),
    "sinks": dict(sinks=True),
}
CALL = ("kv_cache", "dropout")
FACTORS = (*OPTIONS, *CALL)
REFUSED = {frozenset({"recompute", "kv_cache"}): ("recompute", "kv_cache"),
           frozenset({"rel_bias", "kv_cache"}): ("rel_pos_max_distance", "kv_cache")}  # fmt: skip
KERNELS = {"vectorized": {}, "naive": {}, "chunked": dict(block_size=2, num_threads=2)}
COMBOS = [frozenset(f for f, on in zip(FACTORS, bits) if on) for bits in itertools.product((0, 1), repeat=len(FACTORS))]


def module(combo, impl, seed=0):
    kw = {k: v for name in combo if name in OPTIONS for k, v in OPTIONS[name].items()}
    mha = MultiHeadAttention(E, H, dropout=0.3 if "dropout" in combo else 0.0, rng=seed,
                             impl=kernels.get_kernel(impl, **KERNELS[impl]), **kw)  # fmt: skip
    rng = np.random.default_rng(seed + 1)
    for name, p in mha.params.items():
        if name.startswith("b_") or name == "sinks":
            p[...] = rng.normal(0, 0.5, p.shape)  # nonzero biases, so a missing bias gradient shows; sinks that count
    return mha


def keep_mask(mha, rng):
    extra = int(mha.add_bias_kv) + int(mha.add_zero_attn)
    return rng.random((B, H, L, L + extra)) >= 0.3


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "+".join(sorted(c)) or "plain")
def test_every_combination_runs_and_is_right_or_is_refused_naming_both(combo, impl):
    rng = np.random.default_rng(len(combo))
    refused = [names for pair, names in REFUSED.items() if pair <= combo]
    if refused:
        with pytest.raises(ValueError) as error:
            module(combo, impl).forward(*(np.zeros((1, 1, E)),) * 3, kv_cache=KVCache())
        message = str(error.value)
        assert any(all(name in message for name in names) for names in refused), message
        return
    mha = module(combo, impl)
    x = rng.standard_normal((B, L, E))
    mask = masks.causal_mask(L)
    keep = keep_mask(mha, rng) if "dropout" in combo else None
    if "kv_cache" in combo:  # forward only: token by token equals the full causal forward
        full, _ = mha.forward(x, x, x, mask=mask, training=keep is not None, dropout_mask=keep)
        kv, steps = KVCache(), []
        for t in range(L):
            step_keep = None if keep is None else np.concatenate([keep[:, :, t : t + 1, : t + 1],
                                                                   keep[:, :, t : t + 1, L:]], axis=-1)  # fmt: skip
            out, _ = mha.forward(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], kv_cache=kv,
                                 training=keep is not None, dropout_mask=step_keep)  # fmt: skip
            steps.append(out)
        assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-12 * np.abs(full).max()
        return
    errors = directional_errors(mha, x, dict(mask=mask, training=keep is not None, dropout_mask=keep), rng)
    assert max(errors.values()) <= 1e-6, errors
    if "recompute" in combo:  # the same numbers as the default path
        default = module(combo - {"recompute"}, impl)
        default.params = {n: p.copy() for n, p in mha.params.items()}
        call = dict(mask=mask, training=keep is not None, dropout_mask=keep)
        a, b = mha.forward(x, x, x, **call)[0], default.forward(x, x, x, **call)[0]
        assert np.abs(a - b).max() <= 1e-13 * np.abs(b).max()


def test_the_builder_is_the_only_place_that_refuses():
    """Every refusal message of the combinations comes from steps.build_steps, before any arithmetic."""
    from mha_numpy import steps

    config = steps.AttentionConfig(E, H, recompute=True)
    with pytest.raises(ValueError, match="kv_cache with recompute=True"):
        steps.build_steps(config, kv_cache=True)
    with pytest.raises(ValueError, match="kv_cache with rel_pos_max_distance"):
        steps.build_steps(steps.AttentionConfig(E, H, rel_pos_max_distance=1), kv_cache=True)
    plan = [type(step).__name__ for step in steps.build_steps(config)]
    assert plan == ["Project", "Split", "RepeatKV", "Attend", "Merge", "OutProject"]
    every = steps.AttentionConfig(E, H, num_kv_heads=2, rope_theta=1.0, alibi=True, rel_pos_max_distance=1,
                                  add_bias_kv=True, add_zero_attn=True)  # fmt: skip
    plan = [type(step).__name__ for step in steps.build_steps(every)]
    assert plan == ["Project", "Split", "Rope", "RelativeBias", "Alibi", "BiasKV", "ZeroAttn", "RepeatKV", "Attend",
                    "Merge", "OutProject"]  # fmt: skip


@st.composite
def cross_attention_calls(draw):
    """A module with a random subset of the options and a random cross-attention call (Lq != Lk, kdim, vdim)."""
    Hkv = draw(st.sampled_from([1, 2]))
    H, d = Hkv * draw(st.integers(1, 2)), 2 * draw(st.integers(1, 2))
    options = dict(
        num_kv_heads=Hkv, kdim=draw(st.integers(1, 5)), vdim=draw(st.integers(1, 5)), bias=draw(st.booleans())
    )
    for name, value in (("rope_theta", 30.0), ("alibi", True), ("rel_pos_max_distance", 2), ("add_bias_kv", True),
                        ("add_zero_attn", True), ("softcap", 1.5), ("qk_norm", True)):  # fmt: skip
        if draw(st.booleans()):
            options[name] = value
    if draw(st.booleans()):
        options["head_dim"] = d + 1 + (options.get("rope_theta") is not None)  # even for RoPE, != E / H
    shapes = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(0, 6))  # B, Lq, Lk (may be empty)
    return H, d, options, shapes, draw(st.sampled_from(["none", "padding", "random"])), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cross_attention_calls())
def test_random_options_and_shapes_agree_on_every_kernel_and_with_recompute(call):
    """Every kernel, and recompute, give the same output and gradients as the vectorized kernel (random options,
    shapes and masks, cross-attention); the inputs and parameters are never changed by a call."""
    H, d, options, (B, Lq, Lk), mask_kind, seed = call
    rng = np.random.default_rng(seed)
    base = MultiHeadAttention(H * d, H, rng=seed, **options)
    for p in base.params.values():
        p[...] = rng.normal(0, 0.5, p.shape) if p.ndim == 1 else p
    query, key = rng.standard_normal((B, Lq, H * d)), rng.standard_normal((B, Lk, base.kdim))
    value = rng.standard_normal((B, Lk, base.vdim))
    mask = {"none": None, "padding": rng.random((B, 1, 1, Lk)) < 0.7, "random": rng.random((Lq, Lk)) < 0.6}[mask_kind]
    d_out = rng.standard_normal((B, Lq, H * d))
    before = [a.copy() for a in (query, key, value, *base.params.values())]
    results = []
    for impl, recompute in (("vectorized", False), ("naive", False), ("chunked", False), ("vectorized", True),
                            ("chunked", True)):  # fmt: skip
        kernel = kernels.get_kernel(impl, **({"block_size": 2, "num_threads": 2} if impl == "chunked" else {}))
        mha = MultiHeadAttention(H * d, H, rng=0, impl=kernel, recompute=recompute, **options)
        mha.params = base.params
        out, cache = mha.forward(query, key, value, mask=mask)
        results.append((out, mha.backward(d_out, cache)))
    ref_out, ref_grads = results[0]
    largest = max([1e-300] + [float(np.abs(g).max()) for g in ref_grads.values() if g.size])
    for out, grads in results[1:]:
        assert np.abs(out - ref_out).max(initial=0) <= 1e-12 * max(1.0, np.abs(ref_out).max(initial=0))
        assert all(np.abs(grads[n] - ref_grads[n]).max(initial=0) <= 1e-12 * largest for n in ref_grads)
    assert all(np.array_equal(a, b) for a, b in zip(before, (query, key, value, *base.params.values())))
