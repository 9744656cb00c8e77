"""Causal linear attention with φ = elu + 1 (``mha_numpy.recurrent.linear``, issue 37): the recurrence is the (L, L)
masked form O = (φ(Q) φ(K)ᵀ ⊙ causal) V + φ(Q) S₀, recurrent == chunked, every gradient by central differences
and against torch autograd of the masked form."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import grad_check, rel_err

from mha_numpy.recurrent import linear_attention_backward, linear_attention_forward

NAMES = ("q", "k", "v", "initial_state")


def make(B=2, Hk=1, H=2, L=9, dk=3, dv=4, state=True, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    x = {"q": rng.standard_normal((B, Hk, L, dk)), "k": rng.standard_normal((B, Hk, L, dk)),
         "v": rng.standard_normal((B, H, L, dv))}  # fmt: skip
    x["initial_state"] = rng.standard_normal((B, H, dk, dv)) if state else None
    return {n: None if a is None else a.astype(dtype) for n, a in x.items()}


def phi(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def masked_form(q, k, v, initial_state):
    """The (L, L) form, written out: O = (φ(Q) φ(K)ᵀ ⊙ causal) V + φ(Q) S₀, S_L = S₀ + φ(K)ᵀ V."""
    G = v.shape[1] // q.shape[1]
    Q, K = np.repeat(phi(q), G, axis=1), np.repeat(phi(k), G, axis=1)  # head h reads key head h // G
    L = q.shape[2]
    A = (Q @ K.swapaxes(-1, -2)) * np.tril(np.ones((L, L)))  # (B, H, L, L)
    S0 = np.zeros((*v.shape[:2], q.shape[3], v.shape[3])) if initial_state is None else initial_state
    return A @ v + Q @ S0, S0 + K.swapaxes(-1, -2) @ v


@pytest.mark.parametrize("impl, chunk_size", [("recurrent", 4), ("chunked", 4), ("chunked", 64), ("chunked", 1)])
@pytest.mark.parametrize("state", [True, False])
def test_the_recurrence_is_the_masked_form(impl, chunk_size, state):
    x = make(state=state)
    (o, S), _ = linear_attention_forward(**x, impl=impl, chunk_size=chunk_size)
    o_ref, S_ref = masked_form(**x)
    assert rel_err(o, o_ref) <= 1e-13 and rel_err(S, S_ref) <= 1e-13


def test_recurrent_equals_chunked_in_every_gradient():
    x = make(L=11, seed=1)
    rng = np.random.default_rng(2)
    d_o, d_S = rng.standard_normal((2, 2, 11, 4)), rng.standard_normal((2, 2, 3, 4))
    got = {}
    for impl in ("recurrent", "chunked"):
        (o, S), cache = linear_attention_forward(**x, impl=impl, chunk_size=4)
        got[impl] = (o, S, linear_attention_backward(d_o, cache, d_S))
    (o1, S1, g1), (o2, S2, g2) = got["recurrent"], got["chunked"]
    assert max(rel_err(o1, o2), rel_err(S1, S2), *(rel_err(g1[n], g2[n]) for n in NAMES)) <= 1e-12


@pytest.mark.parametrize("impl", ["recurrent", "chunked"])
def test_central_differences_on_every_gradient(impl):
    x = make(L=5, seed=3)

    def forward(**kw):
        (o, S), cache = linear_attention_forward(**kw, impl=impl, chunk_size=2)
        return np.concatenate([o.ravel(), S.ravel()]), (cache, o.shape, S.shape)

    def backward(d_out, c):
        cache, o_shape, S_shape = c
        n = int(np.prod(o_shape))
        grads = linear_attention_backward(d_out[:n].reshape(o_shape), cache, d_out[n:].reshape(S_shape))
        return tuple(grads[k] for k in NAMES)

    grad_check(forward, backward, x, list(NAMES), allow_zero=False)


def test_gradients_match_torch_autograd_of_the_masked_form():
    torch = pytest.importorskip("torch")
    x = make(L=7, seed=4)
    rng = np.random.default_rng(5)
    d_o = rng.standard_normal((2, 2, 7, 4))
    t = {n: torch.from_numpy(a).requires_grad_() for n, a in x.items()}
    Q, K = (torch.nn.functional.elu(t[n]).add(1).repeat_interleave(2, dim=1) for n in ("q", "k"))
    o = ((Q @ K.transpose(-1, -2)).tril() @ t["v"] + Q @ t["initial_state"]).mul(torch.from_numpy(d_o)).sum()
    theirs = dict(zip(NAMES, (g.numpy() for g in torch.autograd.grad(o, list(t.values()))), strict=True))
    (_, _), cache = linear_attention_forward(**x)
    mine = linear_attention_backward(d_o, cache)
    assert max(rel_err(mine[n], theirs[n]) for n in NAMES) <= 1e-12


def test_float32_stays_float32_and_nothing_is_modified():
    x = make(dtype=np.float32)
    before = {n: a.copy() for n, a in x.items()}
    for impl in ("recurrent", "chunked"):
        (o, S), cache = linear_attention_forward(**x, impl=impl)
        d_o = np.ones_like(o)
        grads = linear_attention_backward(d_o, cache, np.ones_like(S))
        assert o.dtype == S.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
        assert all(np.array_equal(x[n], before[n]) for n in x) and np.array_equal(d_o, np.ones_like(o))
        o_ref, _ = masked_form(**{n: a.astype(np.float64) for n, a in x.items()})
        assert rel_err(o, o_ref) <= 1e-5


@pytest.mark.parametrize(
    "name, change",
    [
        ("q", lambda x: {"q": x["q"].astype(int)}),
        ("k", lambda x: {"k": x["k"][..., :-1]}),
        ("v", lambda x: {"v": x["v"].astype(np.float32)}),
        ("initial_state", lambda x: {"initial_state": x["initial_state"][..., :-1]}),
        ("impl", lambda x: {"impl": "masked"}),
        ("chunk_size", lambda x: {"chunk_size": 2.0}),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(name, change):
    x = make()
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        linear_attention_forward(**{**x, **change(x)})
