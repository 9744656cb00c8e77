"""The gated delta rule (issue 37): Gated DeltaNet (Qwen3-Next), DeltaNet (g ≡ 0) and Kimi Delta Attention's
per-channel decay, recurrent and chunked, each with its hand-written backward (``mha_numpy.recurrent``).

Against torch autograd of transformers' functions with the float32 casts lifted (``interop.gated_delta``) in float64
to 1e-10; against the functions as shipped in float32 to 1e-5 relative; recurrent == chunked to 1e-12; central
differences on every gradient; decoding one token with the state; bad input refused, naming the argument.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import grad_check, rel_err

from mha_numpy.recurrent import gated_delta_rule_backward, gated_delta_rule_forward, gated_delta_rule_step

NAMES = ("q", "k", "v", "g", "beta", "initial_state")
IMPLS = ("recurrent", "chunked")


def make(B=2, Hk=2, H=4, L=7, dk=4, dv=3, state=True, per_channel=False, dtype=np.float64, seed=0):
    """Random inputs: g ≤ 0 (a per-head log decay, or one a key channel), β in (0, 1), an initial state or None."""
    rng = np.random.default_rng(seed)
    x = {
        "q": rng.standard_normal((B, Hk, L, dk)),
        "k": rng.standard_normal((B, Hk, L, dk)) / np.sqrt(dk),
        "v": rng.standard_normal((B, H, L, dv)),
        "g": -rng.uniform(0.05, 0.6, (B, H, L, dk) if per_channel else (B, H, L)),
        "beta": rng.uniform(0.1, 0.9, (B, H, L)),
        "initial_state": rng.standard_normal((B, H, dk, dv)) if state else None,
    }
    return {n: None if a is None else a.astype(dtype) for n, a in x.items()}


def upstream(o_shape, S_shape, dtype=np.float64, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(o_shape).astype(dtype), rng.standard_normal(S_shape).astype(dtype)


def ours(x, d_o, d_S, **kw):
    (o, S), cache = gated_delta_rule_forward(**x, **kw)
    return o, S, gated_delta_rule_backward(d_o, cache, d_S)


def theirs(x, d_o, d_S, **kw):
    from mha_numpy.interop.gated_delta import torch_gated_delta_rule

    return torch_gated_delta_rule(**x, d_o=d_o, d_final_state=d_S, **kw)


def assert_close(a, b, tol):
    o1, S1, g1 = a
    o2, S2, g2 = b
    errs = {"o": rel_err(o1, o2), "final_state": rel_err(S1, S2)}
    for n in NAMES:
        assert (g1[n] is None) == (g2[n] is None), n
        if g1[n] is not None:
            errs[n] = rel_err(g1[n], g2[n])
    assert max(errs.values()) <= tol, errs


CASES = {  # (Hk, H, L, chunk, state, l2norm): grouped heads, L not a multiple of the chunk, a state or none
    "grouped_state_l2norm": (2, 6, 11, 4, True, True),
    "grouped_no_state": (1, 3, 9, 4, False, False),
    "equal_heads_state": (2, 2, 8, 4, True, False),
}


@pytest.mark.parametrize("impl", ["recurrent", "chunked"])
@pytest.mark.parametrize("case", CASES)
def test_float64_matches_transformers_cast_lifted(case, impl):
    """Outputs, final state and every gradient against torch autograd of transformers' function of the same form,
    its float32 casts lifted."""
    pytest.importorskip("torch")
    Hk, H, L, C, state, l2 = CASES[case]
    x = make(Hk=Hk, H=H, L=L, state=state)
    d_o, d_S = upstream((2, H, L, 3), (2, H, 4, 3))
    kw = dict(impl=impl, chunk_size=C, use_qk_l2norm=l2)
    assert_close(ours(x, d_o, d_S, **kw), theirs(x, d_o, d_S, **kw), 1e-10)


@pytest.mark.parametrize("impl", ["recurrent", "chunked"])
@pytest.mark.parametrize("state", [True, False])
def test_kimi_per_channel_decay_matches_transformers(state, impl):
    """g (B, H, L, dk): Kimi Delta Attention's per-channel decay, the same function, against transformers'
    ``recurrent_kimi_delta_attention`` and ``chunk_kimi_delta_attention`` with their casts lifted (L = 6 not a
    multiple of the chunk)."""
    pytest.importorskip("torch")
    x = make(Hk=3, H=3, L=6, state=state, per_channel=True)
    d_o, d_S = upstream((2, 3, 6, 3), (2, 3, 4, 3))
    kw = dict(impl=impl, chunk_size=4, use_qk_l2norm=True)
    assert_close(ours(x, d_o, d_S, **kw), theirs(x, d_o, d_S, **kw), 1e-10)


def test_the_float64_lift_is_float64_end_to_end_or_says_so(monkeypatch):
    """transformers' own function run with float32 meaning float64 (``interop.lift``): float64 out and torch restored
    afterwards, even after an error; a float32 input refused naming it; a cast the lift cannot reach (a dtype read
    before the block) a TypeError, not a silent float32 result."""
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen

    from mha_numpy.interop import gated_delta as GD

    x = {n: None if a is None else torch.from_numpy(a).transpose(1, 2) for n, a in make(Hk=2, H=2, L=5).items()}
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o, S = GD.torch_chunk_gated_delta_rule_float64(*args, chunk_size=4, output_final_state=True)
    assert o.dtype == S.dtype == torch.float64
    assert torch.float32 is torch.float is not torch.float64 and torch.get_default_dtype() == torch.float32
    with pytest.raises(ValueError, match=r"float64 tensors, got torch.float32 for argument 2"):
        GD.torch_chunk_gated_delta_rule_float64(x["q"], x["k"], x["v"].float(), x["g"], x["beta"])
    fixed = torch.float32  # read before the block: the lift cannot change it
    monkeypatch.setattr(qwen, "torch_chunk_gated_delta_rule", lambda *a, **k: (a[2].to(fixed), None))
    with pytest.raises(TypeError, match="a cast the lift does not reach"):
        GD.torch_chunk_gated_delta_rule_float64(*args)

    def fails(*a, **k):
        assert torch.float32 is torch.float64 and torch.get_default_dtype() == torch.float64  # inside the block
        raise RuntimeError("inside the block")

    monkeypatch.setattr(qwen, "torch_chunk_gated_delta_rule", fails)
    with pytest.raises(RuntimeError, match="inside the block"):
        GD.torch_chunk_gated_delta_rule_float64(*args)
    assert torch.float32 is not torch.float64 and torch.Tensor.float is not torch.Tensor.double
    assert torch.get_default_dtype() == torch.float32 and torch.float is fixed


def flat_pair(impl, chunk_size=3, use_qk_l2norm=True, scale=None, state=True):
    """The forward and backward as one output (o and the final state side by side), for ``grad_check``."""
    names = NAMES if state else NAMES[:-1]

    def forward(**x):
        (o, S), cache = gated_delta_rule_forward(
            **x, chunk_size=chunk_size, impl=impl, use_qk_l2norm=use_qk_l2norm, scale=scale
        )
        return np.concatenate([o.ravel(), S.ravel()]), (cache, o.shape, S.shape)

    def backward(d_out, c):
        cache, o_shape, S_shape = c
        n = int(np.prod(o_shape))
        grads = gated_delta_rule_backward(d_out[:n].reshape(o_shape), cache, d_out[n:].reshape(S_shape))
        return tuple(grads[k] for k in names)

    return forward, backward, list(names)


@pytest.mark.parametrize(
    "impl, per_channel, l2, state, scale",
    [
        ("recurrent", False, True, True, None),
        ("recurrent", True, False, True, 0.7),
        ("recurrent", False, False, False, None),
        ("chunked", False, True, True, None),
        ("chunked", False, False, False, 0.7),
        ("chunked", True, True, True, None),
    ],
)
def test_central_differences_on_every_gradient(impl, per_channel, l2, state, scale):
    """Float64 central differences of a random upstream gradient (o and final state) on every input."""
    x = make(B=2, Hk=1, H=2, L=5, dk=3, dv=2, state=state, per_channel=per_channel, seed=3)
    forward, backward, names = flat_pair(impl, chunk_size=2, use_qk_l2norm=l2, scale=scale, state=state)
    grad_check(forward, backward, {n: x[n] for n in names}, names, allow_zero=False)


@pytest.mark.parametrize("per_channel", [False, True])
def test_decoding_one_token_equals_the_full_forward(per_channel):
    """gated_delta_rule_step token by token from the initial state: each o_t and the last state as both forms'."""
    x = make(Hk=1, H=2, L=6, per_channel=per_channel, seed=4)
    full = [gated_delta_rule_forward(**x, impl=impl, chunk_size=4, use_qk_l2norm=True)[0] for impl in IMPLS]
    state = x["initial_state"]
    for t in range(x["v"].shape[2]):
        step = {f"{n}_t": x[n][:, :, t] for n in ("q", "k", "v", "g", "beta")}
        o_t, state = gated_delta_rule_step(**step, state=state, use_qk_l2norm=True)
        for o, _ in full:
            assert np.abs(o_t - o[:, :, t]).max() <= 1e-12 * np.abs(o).max()
    for _, S in full:
        assert np.abs(state - S).max() <= 1e-12 * np.abs(S).max()


@pytest.mark.parametrize("state", [True, False])
def test_float32_within_1e_5_of_the_shipped_functions(state):
    """float32 in, float32 out (and gradients), within 1e-5 relative of transformers' functions as shipped."""
    pytest.importorskip("torch")
    cases = (("chunked", False, 2), ("recurrent", False, 2), ("recurrent", True, 4), ("chunked", True, 4))
    for impl, per_channel, Hk in cases:
        x = make(Hk=Hk, H=4, L=10, state=state, per_channel=per_channel, dtype=np.float32, seed=5)
        d_o, d_S = upstream((2, 4, 10, 3), (2, 4, 4, 3), np.float32)
        kw = dict(impl=impl, chunk_size=4, use_qk_l2norm=True)
        mine = ours(x, d_o, d_S, **kw)
        assert mine[0].dtype == mine[1].dtype == np.float32
        assert all(g is None or g.dtype == np.float32 for g in mine[2].values())
        assert_close(mine, theirs(x, d_o, d_S, shipped=True, **kw), 1e-5)


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 64])
def test_recurrent_equals_chunked(chunk_size):
    """The two forms are one function: outputs, state and every gradient to 1e-12 (chunks of 1, L not a multiple
    of the chunk, one chunk longer than L); DeltaNet (g ≡ 0) and Kimi's per-channel decay among them."""
    for gate in ("head", "zero", "channel"):
        x = make(Hk=2, H=4, L=13, per_channel=gate == "channel", seed=6)
        if gate == "zero":
            x["g"] = np.zeros_like(x["g"])
        d_o, d_S = upstream((2, 4, 13, 3), (2, 4, 4, 3))
        kw = dict(chunk_size=chunk_size, use_qk_l2norm=True)
        assert_close(ours(x, d_o, d_S, impl="recurrent", **kw), ours(x, d_o, d_S, impl="chunked", **kw), 1e-12)


def test_an_empty_sequence_passes_the_state_through():
    """L = 0: the final state is the initial one's value in a new array (it was the caller's array itself, so writing
    into it changed the initial state), and its gradient passes back as a new array too."""
    x = make(L=0)
    before = x["initial_state"].copy()
    for impl in IMPLS:
        (o, S), cache = gated_delta_rule_forward(**x, impl=impl)
        assert o.shape == (2, 4, 0, 3) and np.array_equal(S, before)
        S += 1.0
        assert np.array_equal(x["initial_state"], before)
        d_S = np.ones_like(S)
        grads = gated_delta_rule_backward(o, cache, d_S)
        assert np.array_equal(grads["initial_state"], d_S) and grads["initial_state"] is not d_S


def test_nothing_is_modified():
    """Inputs, upstream gradients, the initial state and the cache are read, never written; the final state is a new
    array."""
    for impl, per_channel in [(i, p) for i in IMPLS for p in (False, True)]:
        x = make(L=9, per_channel=per_channel, seed=7)
        before = {n: a.copy() for n, a in x.items()}
        d_o, d_S = upstream((2, 4, 9, 3), (2, 4, 4, 3))
        d_before = (d_o.copy(), d_S.copy())
        (o, S), cache = gated_delta_rule_forward(**x, impl=impl, chunk_size=4, use_qk_l2norm=True)
        first = gated_delta_rule_backward(d_o, cache, d_S)
        again = gated_delta_rule_backward(d_o, cache, d_S)  # the cache is read, not consumed
        assert all(np.array_equal(first[n], again[n]) for n in NAMES)
        S[...] = 0.0
        for n, a in x.items():
            assert np.array_equal(a, before[n]), n
        assert np.array_equal(d_o, d_before[0]) and np.array_equal(d_S, d_before[1])
    step = {f"{n}_t": x[n][:, :, 0] for n in ("q", "k", "v", "g", "beta")}
    gated_delta_rule_step(**step, state=x["initial_state"])
    assert np.array_equal(x["initial_state"], before["initial_state"])


def _bad(name, value=None, **kw):
    return pytest.param(name, value, kw, id=f"{name}-{kw.get('why', '')}")


BAD = {  # id: (the argument the error names, a change to the inputs, keyword arguments)
    "g_positive": ("g", lambda x: {"g": -x["g"]}, {}),
    "g_nan": ("g", lambda x: {"g": np.where(x["g"] < -0.3, np.nan, x["g"])}, {}),
    "g_shape": ("g", lambda x: {"g": x["g"][:, :, :-1]}, {}),
    "g_per_channel_shape": ("g", lambda x: {"g": np.repeat(x["g"][..., None], 3, -1)}, {"impl": "chunked"}),
    "beta_above_1": ("beta", lambda x: {"beta": x["beta"] + 1.0}, {}),
    "beta_below_0": ("beta", lambda x: {"beta": -x["beta"]}, {}),
    "beta_shape": ("beta", lambda x: {"beta": x["beta"][..., None]}, {}),
    "q_ndim": ("q", lambda x: {"q": x["q"][0]}, {}),
    "q_int": ("q", lambda x: {"q": x["q"].astype(int)}, {}),
    "q_inf": ("q", lambda x: {"q": x["q"] * np.inf}, {}),
    "k_shape": ("k", lambda x: {"k": x["k"][:, :, :-1]}, {}),
    "v_heads": ("v", lambda x: {"v": x["v"][:, :3]}, {}),
    "v_dtype": ("v", lambda x: {"v": x["v"].astype(np.float32)}, {}),
    "beta_dtype": ("beta", lambda x: {"beta": x["beta"].astype(np.float32)}, {}),
    "initial_state_shape": ("initial_state", lambda x: {"initial_state": x["initial_state"][..., :-1]}, {}),
    "impl": ("impl", lambda x: {}, {"impl": "parallel"}),
    "chunk_size": ("chunk_size", lambda x: {}, {"chunk_size": 0}),
    "scale": ("scale", lambda x: {}, {"scale": "1/8"}),
    "use_qk_l2norm": ("use_qk_l2norm", lambda x: {}, {"use_qk_l2norm": 1}),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_a_value_error_naming_the_argument(case):
    name, change, kw = BAD[case]
    x = make(L=5)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        gated_delta_rule_forward(**{**x, **change(x)}, **kw)


def test_bad_upstream_gradients_and_step_inputs_are_named():
    x = make(L=5)
    (o, S), cache = gated_delta_rule_forward(**x)
    with pytest.raises(ValueError, match="^d_o"):
        gated_delta_rule_backward(o[..., :-1], cache)
    with pytest.raises(ValueError, match="^d_final_state"):
        gated_delta_rule_backward(o, cache, S.astype(np.float32))
    step = {f"{n}_t": x[n][:, :, 0] for n in ("q", "k", "v", "g", "beta")}
    with pytest.raises(ValueError, match="^q_t"):
        gated_delta_rule_step(**{**step, "q_t": x["q"]}, state=None)
    with pytest.raises(ValueError, match="^g_t must be <= 0"):
        gated_delta_rule_step(**{**step, "g_t": -step["g_t"]}, state=None)
    with pytest.raises(ValueError, match="^state must be"):
        gated_delta_rule_step(**step, state=x["initial_state"][..., :-1])


@pytest.mark.parametrize("per_channel", [False, True])
def test_blocks_of_chunks_give_the_same_numbers(monkeypatch, per_channel):
    """The chunked form works a block of chunks at a time (and Kimi's (C, C, dk) products a few chunks at a time):
    blocks of two chunks and of one give the same numbers as one block (L = 13: four chunks of 4, the last short)."""
    from mha_numpy.recurrent import decayed, delta_chunked

    x = make(Hk=2, H=2, L=13, per_channel=per_channel, seed=8)
    d_o, d_S = upstream((2, 2, 13, 3), (2, 2, 4, 3))
    whole = ours(x, d_o, d_S, impl="chunked", chunk_size=4)
    monkeypatch.setattr(delta_chunked, "BLOCK_TOKENS", 8)
    assert_close(ours(x, d_o, d_S, impl="chunked", chunk_size=4), whole, 0.0)
    monkeypatch.setattr(delta_chunked, "BLOCK_TOKENS", 1)
    monkeypatch.setattr(decayed, "BLOCK_ELEMENTS", 1)
    assert_close(ours(x, d_o, d_S, impl="chunked", chunk_size=4), whole, 0.0)


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_chunked_form_never_builds_an_L_by_L_array(per_channel):
    """L = 4096, d = 4, chunks of 16: an (L, L) float64 array would be 134 MB; forward and backward together stay
    under a quarter of that (8 MB and 13 MB measured; numpy's allocations are traced by tracemalloc)."""
    import tracemalloc

    L = 4096
    x = make(B=1, Hk=1, H=1, L=L, dk=4, dv=4, per_channel=per_channel, seed=9)
    tracemalloc.start()
    try:
        (o, S), cache = gated_delta_rule_forward(**x, chunk_size=16)
        gated_delta_rule_backward(o, cache, S)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < L * L * 8 / 4, peak
