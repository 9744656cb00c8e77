"""The module's score options are FlexAttention score_mods, one implementation each (issue 36).

``MultiHeadAttention(softcap=..., alibi=True, rel_pos_max_distance=..., head_temperature=True)`` puts the pair
``functional.NAME_score`` / ``NAME_score_vjp`` on the kernels' one hook; a flex user passes the same pair as
``score_mod`` / ``score_mod_vjp`` (constants bound by ``partial``, learned arrays in ``params``). On the module's own
Q, K, V (its cache), under a causal mask given as the module's mask and as flex's ``mask_mod``, the flex call's output
and every gradient (q, k, v, the learned parameter) equal the module's, bit for bit, on the vectorized kernel and the
chunked one (3 x 3 tiles, 2 threads), float64.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from mha_numpy import MultiHeadAttention, kernels, masks
from mha_numpy import functional as F
from mha_numpy.flex import flex_attention_backward, flex_attention_forward

B, H, L, E = 2, 3, 7, 12


def flex_form(option: str, module):
    """option -> (score_mod, score_mod_vjp, params): the module's pair as a flex user passes it."""
    if option == "softcap":
        return partial(F.soft_cap_score, cap=1.5), partial(F.soft_cap_score_vjp, cap=1.5), {}
    if option == "alibi":
        slopes = F.alibi_slopes(H)
        return partial(F.alibi_score, slopes=slopes), partial(F.alibi_score_vjp, slopes=slopes), {}
    name = {"rel_pos_max_distance": "rel_bias", "head_temperature": "head_temperature"}[option]
    pair = {"rel_bias": (F.relative_position_score, F.relative_position_score_vjp),
            "head_temperature": (F.head_temperature_score, F.head_temperature_score_vjp)}[name]  # fmt: skip
    return *pair, {name: module.params[name]}


OPTIONS = {"softcap": 1.5, "alibi": True, "rel_pos_max_distance": 2, "head_temperature": True}


@pytest.mark.parametrize("impl", ["vectorized", "chunked"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_module_option_and_its_flex_mod_give_the_same_numbers(option, impl):
    rng = np.random.default_rng(0)
    kernel = kernels.ChunkedKernel(block_size=3, num_threads=2) if impl == "chunked" else kernels.get_kernel(impl)
    mha = MultiHeadAttention(E, H, rng=0, impl=kernel, **{option: OPTIONS[option]})
    if option == "head_temperature":
        mha.params["head_temperature"] = rng.normal(0.0, 0.5, H)  # not 0: the term changes the scores
    x, d_output = rng.normal(size=(B, L, E)), rng.normal(size=(B, L, E))
    _, cache = mha.forward(x, x, x, mask=masks.causal_mask(L))
    module_grads = mha.backward(d_output, cache)  # the learned parameter's gradient as the module returns it
    d_ctx = (d_output @ mha.params["W_o"]).reshape(B, L, H, E // H).transpose(0, 2, 1, 3)  # what its core received
    grads = kernel.backward(d_ctx, cache.attention)  # the module's core: dq, dk, dv and the option's parameter

    score_mod, vjp, params = flex_form(option, mha)
    out, flex_cache = flex_attention_forward(cache.Q, cache.K, cache.V, score_mod, params=params, score_mod_vjp=vjp,
                                             mask_mod=masks.causal_mod, kernel=kernel)  # fmt: skip
    dq, dk, dv, d_params = flex_attention_backward(d_ctx, flex_cache)
    np.testing.assert_array_equal(out, cache.context)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), grads[:3]):
        np.testing.assert_array_equal(got, want, err_msg=name)
    for name in params:
        np.testing.assert_array_equal(d_params[name], grads.score_params[option][name], err_msg=name)
        atol = 1e-14 * np.abs(d_params[name]).max()  # the module's d_ctx is rounded otherwise: its merged heads
        np.testing.assert_allclose(d_params[name], module_grads[name], rtol=0, atol=atol, err_msg=name)
