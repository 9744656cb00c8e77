"""Every declared option with every other, on every kernel: read from the declarations (``steps.OPTIONS``), so a new
option is tested with its neighbours with no edit here.

Each option's ``example`` (the options that turn it on) makes one factor; the call adds two (a KV cache, dropout). Every
single factor and every pair of factors runs on the three kernels: a combination the builder refuses must be refused
with a ValueError naming both factors' options; every other one is gradient-checked (float64, central differences
along one random direction per input and parameter, a random upstream gradient) or, with a KV cache, decoded token by
token and compared with the full causal forward. ``tests/test_combinations.py`` walks the whole product of the
options of 0.2; this file covers the pairs of all of them.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import directional_errors

from mha_numpy import MultiHeadAttention, kernels, masks, steps

H, D, B, L = 4, 2, 2, 4
E = H * D
FACTORS = {name: opt.example for name, opt in steps.OPTIONS.items() if opt.example}
CALL = ("kv_cache", "dropout")
KERNELS = {"vectorized": {}, "naive": {}, "chunked": dict(block_size=2, num_threads=2)}
SINGLES = [(a,) for a in (*FACTORS, *CALL)]
PAIRS = list(itertools.combinations((*FACTORS, *CALL), 2))


def module(combo, impl, seed=0):
    options = {k: v for name in combo if name in FACTORS for k, v in FACTORS[name].items()}
    mha = MultiHeadAttention(E, H, dropout=0.3 if "dropout" in combo else 0.0, rng=seed,
                             impl=kernels.get_kernel(impl, **KERNELS[impl]), **options)  # fmt: skip
    rng = np.random.default_rng(seed + 1)
    for p in mha.params.values():  # no parameter at a value where its gradient could hide (0 biases, t = 0)
        p += rng.normal(0, 0.3, p.shape)
    return mha


def keep_mask(mha, rng, Lk):
    return rng.random((B, H, L, Lk)) >= 0.3


def appended(mha) -> int:
    return sum(step.appended for step in mha.steps)


def option_names(factor: str) -> set[str]:
    """The names a refusal may use for a factor: its options' (a call factor: its own)."""
    return set(FACTORS.get(factor, {factor: None}))


def test_the_factors_are_the_declared_options():
    """The factors come from the declarations: the options of 0.3 are there, and MLA is one of them."""
    for name in ("num_kv_heads", "rope_theta", "alibi", "rel_pos_max_distance", "softcap", "sinks", "qk_norm",
                 "diff_attention", "add_bias_kv", "add_zero_attn", "recompute", "head_temperature",
                 "kv_lora_rank"):  # fmt: skip
        assert name in FACTORS, name


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("combo", SINGLES + PAIRS, ids="+".join)
def test_every_pair_of_options_runs_and_is_right_or_is_refused_naming_both(combo, impl):
    rng = np.random.default_rng(len("".join(combo)))
    try:
        mha = module(combo, impl)
        plan = mha._plan(kv_cache="kv_cache" in combo or False)  # the builder's refusals
    except ValueError as error:
        message = str(error)
        for factor in combo:  # each factor named by one of its options
            assert any(name in message for name in option_names(factor)), (factor, message)
        return
    del plan
    x = rng.standard_normal((B, L, E))
    mask = masks.causal_mask(L)
    keep = keep_mask(mha, rng, L + appended(mha)) if "dropout" in combo else None
    call = dict(mask=mask, training=keep is not None, dropout_mask=keep)
    if "kv_cache" in combo:  # forward only: token by token equals the full causal forward
        full, _ = mha.forward(x, x, x, **call)
        cache, outs = mha.new_kv_cache(), []
        for t in range(L):
            step_keep = None if keep is None else np.concatenate([keep[:, :, t : t + 1, : t + 1],
                                                                   keep[:, :, t : t + 1, L:]], axis=-1)  # fmt: skip
            xt = x[:, t : t + 1]
            outs.append(mha.forward(xt, xt, xt, kv_cache=cache, training=keep is not None, dropout_mask=step_keep)[0])
        assert np.abs(np.concatenate(outs, axis=1) - full).max() <= 1e-12 * np.abs(full).max()
        return
    errors = directional_errors(mha, x, call, rng)
    assert max(errors.values()) <= 1e-6, errors


@pytest.mark.parametrize("factor", list(FACTORS))
def test_each_declared_example_changes_the_call_at_these_sizes(factor):
    """An example that changed nothing at L = 4 would make its pairs pass whatever its step does: each must change
    the output of the module without it (the parameters both have, shared), or the kind of call (recompute's)."""
    on, plain = module((factor,), "vectorized"), module((), "vectorized")
    plain.params.update({n: p for n, p in on.params.items() if n in plain.params and p.shape == plain.params[n].shape})
    x = np.random.default_rng(7).standard_normal((B, L, E))
    (out_on, cache_on), (out_plain, cache_plain) = (m.forward(x, x, x, mask=masks.causal_mask(L)) for m in (on, plain))
    changed = np.abs(out_on - out_plain).max() > 1e-6 * np.abs(out_plain).max()
    assert changed or type(cache_on) is not type(cache_plain), factor
