"""The layers around the gated delta rule (issue 37): the short causal convolution and its decoding state, the
gated RMSNorm, the gates, Qwen3-Next's in-projection split, each against transformers / torch autograd (float64,
1e-10) and central differences; then the whole ``Qwen3NextGatedDeltaNet`` layer."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy.gradcheck import check_function
from mha_numpy.recurrent import conv as CV
from mha_numpy.recurrent import gates as GT
from mha_numpy.recurrent import norms as NM
from mha_numpy.recurrent import qwen3_next as QN

TOL = 1e-10  # float64 against torch autograd
FD = 1e-7  # float64 against central differences


def randn(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def torch_of(torch, *arrays):
    return [torch.tensor(a, requires_grad=True) for a in arrays]


def finite_differences(forward, backward_grads, inputs, d_out):
    """Every named gradient against central differences of sum(forward(**inputs) · d_out), rows <= FD."""
    report = check_function(forward, backward_grads, inputs, d_out)
    assert report.passed, str(report)
    for row in report.rows:
        assert not row.zero_gradient and row.max_rel_err <= FD, str(report)


# --------------------------------------------------------------------------- the short causal convolution


def conv_case(rng, B=2, L=7, C=5, K=4, dtype=np.float64):
    return randn(rng, B, L, C, dtype=dtype), randn(rng, C, K, dtype=dtype), randn(rng, C, dtype=dtype)


@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv1d_matches_transformers_and_autograd(with_state):
    torch = require_torch()
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_fn

    rng = np.random.default_rng(0)
    x, w, b = conv_case(rng)
    s = randn(rng, 2, 3, 5) if with_state else None
    (y, final), cache = CV.causal_conv1d_forward(x, w, b, s)
    dy, ds = randn(rng, *y.shape), randn(rng, *final.shape)
    grads = CV.causal_conv1d_backward(dy, cache, ds)

    xt, wt, bt = torch_of(torch, x, w, b)
    st = torch.tensor(s, requires_grad=True) if with_state else torch.zeros(2, 3, 5, dtype=torch.float64)
    xs = torch.cat([st, xt], dim=1)  # (B, K-1+L, C): the state, then the sequence
    # transformers' function, (B, C, L) layout; with a state its padding reads the state instead of zeros
    yt = causal_conv1d_fn(xs.transpose(1, 2), wt, bt, activation="silu")[:, :, 3:].transpose(1, 2)
    if not with_state:
        ref = causal_conv1d_fn(xt.transpose(1, 2), wt, bt, activation="silu").transpose(1, 2)
        assert rel_err(y, ref.detach().numpy()) <= TOL
    assert rel_err(y, yt.detach().numpy()) <= TOL
    assert rel_err(final, xs[:, -3:].detach().numpy()) <= TOL
    ((yt * torch.tensor(dy)).sum() + (xs[:, -3:] * torch.tensor(ds)).sum()).backward()
    for name, t in [("x", xt), ("weight", wt), ("bias", bt)] + ([("initial_state", st)] if with_state else []):
        assert rel_err(grads[name], t.grad.numpy()) <= TOL, name
    assert (grads["initial_state"] is None) == (not with_state)


def test_causal_conv1d_central_differences_with_the_state_and_short_sequences():
    rng = np.random.default_rng(1)
    for L in (7, 2):  # L < K-1: the final state still holds part of the initial one
        x, w, b = conv_case(rng, L=L)
        s = randn(rng, 2, 3, 5)

        def forward(x, weight, bias, initial_state):  # y and the final state side by side: (B, L + K-1, C)
            (y, final), _ = CV.causal_conv1d_forward(x, weight, bias, initial_state)
            return np.concatenate([y, final], axis=1)

        d_out = randn(rng, 2, L + 3, 5)
        (_, _), cache = CV.causal_conv1d_forward(x, w, b, s)
        grads = CV.causal_conv1d_backward(d_out[:, :L], cache, d_out[:, L:])
        inputs = {"x": x, "weight": w, "bias": b, "initial_state": s}
        finite_differences(forward, grads, inputs, d_out)


def test_causal_conv1d_in_pieces_and_token_by_token_equals_one_call():
    """The decoding state: the last K-1 inputs carried from piece to piece give the one call's outputs; and
    transformers' one-token update (its state the last K inputs) agrees token by token."""
    torch = require_torch()
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_update

    rng = np.random.default_rng(2)
    x, w, b = conv_case(rng, L=9)
    (y, final), _ = CV.causal_conv1d_forward(x, w, b)
    for pieces in ([1] * 9, [2, 1, 4, 2], [5, 4]):
        state, outs = None, []
        for lo, hi in zip(np.cumsum([0, *pieces[:-1]]), np.cumsum(pieces)):
            (y_p, state), _ = CV.causal_conv1d_forward(x[:, lo:hi], w, b, state)
            outs.append(y_p)
        assert np.max(np.abs(np.concatenate(outs, axis=1) - y)) <= 1e-12 * np.max(np.abs(y)), pieces
        assert np.max(np.abs(state - final)) == 0.0, pieces
    hf_state = torch.zeros(2, 5, 4, dtype=torch.float64)  # (B, C, K): transformers keeps K inputs
    for t in range(9):
        y_t = causal_conv1d_update(torch.tensor(x[:, t : t + 1]).transpose(1, 2), hf_state, torch.tensor(w),
                                   torch.tensor(b), "silu")  # fmt: skip
        assert rel_err(y[:, t], y_t[:, :, 0].numpy()) <= TOL
    assert rel_err(final, hf_state[:, :, 1:].transpose(1, 2).numpy()) <= TOL  # its last K-1 are our state


def test_causal_conv1d_float32_stays_float32_and_inputs_are_not_modified():
    rng = np.random.default_rng(3)
    x, w, b = conv_case(rng, dtype=np.float32)
    s = randn(rng, 2, 3, 5, dtype=np.float32)
    copies = [a.copy() for a in (x, w, b, s)]
    (y, final), cache = CV.causal_conv1d_forward(x, w, b, s)
    d = CV.causal_conv1d_backward(np.ones_like(y), cache, np.ones_like(final))
    assert y.dtype == final.dtype == np.float32 and all(g.dtype == np.float32 for g in d.values())
    (y64, _), _ = CV.causal_conv1d_forward(*(a.astype(np.float64) for a in (x, w, b, s)))
    assert rel_err(y, y64) <= 1e-6
    assert all(np.array_equal(a, c) for a, c in zip((x, w, b, s), copies))
    (_, final0), _ = CV.causal_conv1d_forward(x, w, None, None, activation=None)
    final0[...] = 0  # the final state is a copy: writing it leaves x alone
    assert np.array_equal(x, copies[0])


@pytest.mark.parametrize(
    "change, match",
    [
        ({"x": np.zeros((2, 7))}, "x must have 3 dimensions"),
        ({"weight": np.zeros((4, 4))}, r"weight with shape \(4, 4\) must be \(C, K\)"),
        ({"bias": np.zeros(4)}, r"bias with shape \(4,\)"),
        ({"initial_state": np.zeros((2, 4, 5))}, r"initial_state with shape \(2, 4, 5\) must be \(B, K-1, C\)"),
        ({"weight": np.zeros((5, 4), np.float32)}, "weight has dtype float32, x has float64"),
        ({"activation": "gelu"}, "activation must be one of"),
        ({"x": np.zeros((2, 7, 5), int)}, "x must be a floating-point array"),
    ],
)
def test_causal_conv1d_bad_input_names_the_argument(change, match):
    x, w, b = conv_case(np.random.default_rng(4))
    args = {"x": x, "weight": w, "bias": b, "initial_state": None, "activation": "silu", **change}
    with pytest.raises(ValueError, match=match):
        CV.causal_conv1d_forward(**args)


# --------------------------------------------------------------------------- the gated RMSNorm


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gated_rms_norm_matches_autograd_and_central_differences(activation):
    torch = require_torch()
    rng = np.random.default_rng(5)
    x, z, w = randn(rng, 2, 3, 4, 5), randn(rng, 2, 3, 4, 5), 1 + 0.3 * randn(rng, 5)
    out, cache = NM.gated_rms_norm_forward(x, z, w, 1e-6, activation)
    d_out = randn(rng, *out.shape)
    dx, dz, dw = NM.gated_rms_norm_backward(d_out, cache)

    xt, zt, wt = torch_of(torch, x, z, w)
    act = torch.nn.functional.silu if activation == "silu" else torch.sigmoid
    ref = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-6) * wt * act(zt)  # the modules' formula, float64
    (ref * torch.tensor(d_out)).sum().backward()
    assert rel_err(out, ref.detach().numpy()) <= TOL
    for name, ours, t in (("x", dx, xt), ("z", dz, zt), ("weight", dw, wt)):
        assert rel_err(ours, t.grad.numpy()) <= TOL, name

    def forward(x, z, weight):
        return NM.gated_rms_norm_forward(x, z, weight, 1e-6, activation)[0]

    finite_differences(forward, {"x": dx, "z": dz, "weight": dw}, {"x": x, "z": z, "weight": w}, d_out)


@pytest.mark.parametrize("model", ["qwen3_next", "kimi_linear"])
def test_gated_rms_norm_against_the_modules_as_shipped_in_float32(model):
    """float32 against Qwen3NextRMSNormGated (silu) and KimiLinearRMSNormGated (sigmoid) as shipped."""
    torch = require_torch()
    if model == "qwen3_next":
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated as Norm
    else:
        from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNormGated as Norm
    rng = np.random.default_rng(6)
    x, z = randn(rng, 6, 5, dtype=np.float32), randn(rng, 6, 5, dtype=np.float32)
    w = (1 + 0.3 * randn(rng, 5)).astype(np.float32)
    module = Norm(5, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(torch.tensor(w))
    ref = module(torch.tensor(x), torch.tensor(z)).detach().numpy()
    out, _ = NM.gated_rms_norm_forward(x, z, w, 1e-6, "silu" if model == "qwen3_next" else "sigmoid")
    assert out.dtype == np.float32 and rel_err(out, ref) <= 1e-6


# --------------------------------------------------------------------------- the gates


@pytest.mark.parametrize("per_channel", [False, True])
def test_decay_gate_matches_autograd_and_central_differences(per_channel):
    """Qwen3-Next's g = −exp(A_log)·softplus(a + dt_bias) (a (B, L, H)) and Kimi's per-channel forget gate
    (a (B, L, H, d), KimiLinearForgetGate's formula), and β = σ(b)."""
    torch = require_torch()
    rng = np.random.default_rng(7)
    shape = (2, 5, 3, 4) if per_channel else (2, 5, 3)
    a, A_log, dt_bias = 2 * randn(rng, *shape), randn(rng, 3), randn(rng, *shape[2:])
    g, cache = GT.decay_forward(a, A_log, dt_bias)
    d_g = randn(rng, *shape)
    da, dA_log, ddt = GT.decay_backward(d_g, cache)

    at, At, dtt = torch_of(torch, a, A_log, dt_bias)
    if per_channel:  # KimiLinearForgetGate: A_log (1, 1, H, 1), softplus written out (u < 20 here)
        u = at + dtt
        ref = -At.view(1, 1, 3, 1).exp() * torch.where(u > 20.0, u, torch.log(1.0 + torch.exp(u)))
    else:  # Qwen3NextGatedDeltaNet.forward
        ref = -At.exp() * torch.nn.functional.softplus(at + dtt)
    (ref * torch.tensor(d_g)).sum().backward()
    assert np.all(g < 0) and rel_err(g, ref.detach().numpy()) <= TOL
    for name, ours, t in (("a", da, at), ("A_log", dA_log, At), ("dt_bias", ddt, dtt)):
        assert ours.shape == t.shape and rel_err(ours, t.grad.numpy()) <= TOL, name

    def forward(a, A_log, dt_bias):
        return GT.decay_forward(a, A_log, dt_bias)[0]

    finite_differences(forward, {"a": da, "A_log": dA_log, "dt_bias": ddt},
                       {"a": a, "A_log": A_log, "dt_bias": dt_bias}, d_g)  # fmt: skip

    b = 3 * randn(rng, 2, 5, 3)
    beta, c_b = GT.sigmoid_forward(b)
    bt = torch.tensor(b, requires_grad=True)
    torch.sigmoid(bt).backward(torch.tensor(d_g[..., 0] if per_channel else d_g))
    assert rel_err(beta, torch.sigmoid(bt).detach().numpy()) <= TOL
    assert rel_err(GT.sigmoid_backward(d_g[..., 0] if per_channel else d_g, c_b), bt.grad.numpy()) <= TOL
    d_beta = d_g[..., 0] if per_channel else d_g
    finite_differences(lambda b: GT.sigmoid_forward(b)[0], {"b": GT.sigmoid_backward(d_beta, c_b)}, {"b": b}, d_beta)


def test_softplus_and_sigmoid_never_overflow_and_keep_float32():
    u = np.array([-800.0, -30.0, 0.0, 30.0, 800.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is the right answer
        sp, c = GT.softplus_forward(u)
        s, _ = GT.sigmoid_forward(u)
        du = GT.softplus_backward(np.ones_like(u), c)
    assert np.isclose(sp[2], np.log(2)) and sp[-1] == 800.0 and sp[0] == 0.0 and np.isclose(sp[3], 30 + np.exp(-30))
    assert np.allclose(du, s) and s[0] == 0.0 and s[-1] == 1.0
    g, _ = GT.decay_forward(u.astype(np.float32)[:, None], np.zeros(1, np.float32), np.zeros(1, np.float32))
    assert g.dtype == np.float32


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros((2, 3)), np.zeros(4), np.zeros(4)), r"a with shape \(2, 3\) must end in dt_bias's shape"),
        ((np.zeros((2, 3)), np.zeros(3), np.zeros(2)), r"dt_bias with shape \(2,\) must be \(H,\) or \(H, d\)"),
        ((np.zeros((2, 3)), np.zeros((3, 1)), np.zeros(3)), "A_log must have 1 dimensions"),
        ((np.zeros((2, 3), np.float32), np.zeros(3), np.zeros(3)), "must share one dtype"),
    ],
)
def test_decay_gate_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        GT.decay_forward(*args)


# --------------------------------------------------------------------------- the in-projection split


def test_in_proj_split_matches_fix_query_key_value_ordering_and_its_backward():
    """Grouped heads (2 key heads, 6 value heads): the six tensors of transformers' split, and the backward its
    inverse (autograd of the torch split)."""
    torch = require_torch()
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    Hk, Hv, dk, dv = 2, 6, 4, 3
    owner = type("Sizes", (), dict(num_k_heads=Hk, num_v_heads=Hv, head_k_dim=dk, head_v_dim=dv))()
    rng = np.random.default_rng(8)
    qkvz, ba = randn(rng, 2, 5, Hk * (2 * dk + 2 * 3 * dv)), randn(rng, 2, 5, 2 * Hv)
    parts, cache = QN.in_proj_split_forward(qkvz, ba, Hk, Hv, dk, dv)
    qt, bat = torch_of(torch, qkvz, ba)
    ref = Qwen3NextGatedDeltaNet.fix_query_key_value_ordering(owner, qt, bat)
    d_parts = [randn(rng, *p.shape) for p in parts]
    sum((r * torch.tensor(d)).sum() for r, d in zip(ref, d_parts)).backward()
    for ours, theirs in zip(parts, ref):
        assert ours.shape == tuple(theirs.shape) and np.array_equal(ours, theirs.detach().numpy())
    d_qkvz, d_ba = QN.in_proj_split_backward(d_parts, cache)
    assert np.array_equal(d_qkvz, qt.grad.numpy()) and np.array_equal(d_ba, bat.grad.numpy())

    def forward(qkvz, ba):  # the six outputs side by side
        return np.concatenate([p.ravel() for p in QN.in_proj_split_forward(qkvz, ba, Hk, Hv, dk, dv)[0]])

    d_flat = np.concatenate([d.ravel() for d in d_parts])
    finite_differences(forward, {"qkvz": d_qkvz, "ba": d_ba}, {"qkvz": qkvz, "ba": ba}, d_flat)
    with pytest.raises(ValueError, match="num_v_heads = 5 must be a multiple of num_k_heads = 2"):
        QN.in_proj_split_forward(qkvz, ba, 2, 5, dk, dv)
    with pytest.raises(ValueError, match=r"mixed_ba with shape \(2, 5, 11\)"):
        QN.in_proj_split_forward(qkvz, ba[..., :11], Hk, Hv, dk, dv)


# --------------------------------------------------------------------------- the Qwen3-Next layer


def deltanet_and_input(dtype=np.float64, B=2, L=7, seed=0):
    from mha_numpy.interop import qwen3_next_deltanet as QX

    module = QX.hf_qwen3_next_deltanet(dtype=dtype, seed=seed)  # 2 key heads, 6 value heads
    x = np.random.default_rng(seed).standard_normal((B, L, module.hidden_size)).astype(dtype)
    return QX, module, x


@pytest.mark.parametrize("impl, padded", [("chunked", False), ("recurrent", True), ("chunked", True)])
def test_gated_deltanet_layer_matches_transformers_in_float64(impl, padded):
    """Output, the state after the call, dL/dx and every parameter's gradient against Qwen3NextGatedDeltaNet with its
    float32 casts lifted, to 1e-10: batch 2, grouped heads, L = 7 over chunks of 4, left padding in one row."""
    require_torch()
    QX, module, x = deltanet_and_input()
    mask = None
    if padded:
        mask = np.ones(x.shape[:2], bool)
        mask[1, :3] = False
    report = QX.crosscheck_hf_qwen3_next_deltanet(module, x, mask, impl=impl, chunk_size=4)
    assert report.passed and len(report.rows) == 11, str(report)
    assert "as shipped" in report.notes[0]


def test_gated_deltanet_layer_float32_against_transformers_as_shipped():
    require_torch()
    QX, module, x = deltanet_and_input(np.float32)
    report = QX.crosscheck_hf_qwen3_next_deltanet(module, x, chunk_size=4)
    assert report.passed and report.rtol == 1e-5, str(report)
    layer = QX.from_hf_qwen3_next_deltanet(module)
    (y, state), cache = layer.forward(x)
    grads = layer.backward(np.ones_like(y), cache)
    assert y.dtype == state.conv.dtype == state.recurrent.dtype == np.float32
    assert all(grads[n].dtype == np.float32 for n in ("x", *layer.PARAM_NAMES))


def test_gated_deltanet_decoding_token_by_token_equals_one_call_and_transformers_cache():
    """A prefill of 3 tokens, then one token a call with the state: our outputs and state equal one call's to 1e-12,
    and transformers' decoding with its cache (casts lifted) to 1e-10."""
    require_torch()
    QX, module, x = deltanet_and_input(L=8)
    for impl in ("chunked", "recurrent"):
        layer = QX.from_hf_qwen3_next_deltanet(module, chunk_size=4, impl=impl)
        (y, final), _ = layer.forward(x)
        state, outs = None, []
        for a, b in [(0, 3)] + [(t, t + 1) for t in range(3, 8)]:
            (y_p, state), _ = layer.forward(x[:, a:b], state=state)
            outs.append(y_p)
        scale = np.max(np.abs(y))
        assert np.max(np.abs(np.concatenate(outs, axis=1) - y)) <= 1e-12 * scale, impl
        assert np.max(np.abs(state.recurrent - final.recurrent)) <= 1e-12 * np.max(np.abs(final.recurrent)), impl
        assert np.array_equal(state.conv, final.conv), impl
    y_hf, state_hf = QX.decode_hf_qwen3_next_deltanet(module, x, prefill=3)
    assert rel_err(y, y_hf) <= TOL and rel_err(final.recurrent, state_hf.recurrent) <= TOL
    assert rel_err(final.conv, state_hf.conv) <= TOL


def test_gated_deltanet_central_differences_for_every_parameter_input_and_state():
    """Every gradient of the layer, the initial state's included (a call in the middle of a sequence), against
    central differences; the output and both parts of the state after the call all carry an upstream gradient."""
    from mha_numpy.recurrent.qwen3_next import DeltaNetState, GatedDeltaNet

    rng = np.random.default_rng(9)
    E, Hk, Hv, dk, dv, K, B, L = 6, 1, 2, 3, 2, 3, 2, 5
    base = GatedDeltaNet(E, Hk, Hv, dk, dv, K, chunk_size=2, rng=1)
    params = {n: p + 0.2 * randn(rng, *p.shape) for n, p in base.params.items()}
    params["A_log"], params["dt_bias"] = np.log([0.5, 1.0]), np.array([0.5, -0.5])  # a memory of a few tokens
    x, conv0, rec0 = randn(rng, B, L, E), randn(rng, B, K - 1, base.conv_dim), 0.3 * randn(rng, B, Hv, dk, dv)
    shapes = [(B, L, E), (B, K - 1, base.conv_dim), (B, Hv, dk, dv)]
    sizes = [int(np.prod(s)) for s in shapes]

    def forward(x, conv0, rec0, **params):  # y and the state after the call, flattened side by side
        layer = GatedDeltaNet(E, Hk, Hv, dk, dv, K, chunk_size=2, params=params)
        (y, s), _ = layer.forward(x, state=DeltaNetState(conv0, rec0))
        return np.concatenate([y.ravel(), s.conv.ravel(), s.recurrent.ravel()])

    d_out = randn(rng, sum(sizes))
    d_y, d_conv, d_rec = (d.reshape(s) for d, s in zip(np.split(d_out, np.cumsum(sizes)[:-1]), shapes))
    layer = GatedDeltaNet(E, Hk, Hv, dk, dv, K, chunk_size=2, params=params)
    _, cache = layer.forward(x, state=DeltaNetState(conv0, rec0))
    g = layer.backward(d_y, cache, DeltaNetState(d_conv, d_rec))
    analytic = {"x": g["x"], "conv0": g["state"].conv, "rec0": g["state"].recurrent}
    analytic.update({n: g[n] for n in GatedDeltaNet.PARAM_NAMES})
    finite_differences(forward, analytic, {"x": x, "conv0": conv0, "rec0": rec0, **params}, d_out)


def test_gated_deltanet_bad_input_names_the_argument_and_nothing_is_modified():
    from mha_numpy.recurrent.qwen3_next import DeltaNetState, GatedDeltaNet

    layer = GatedDeltaNet(8, 2, 4, 3, 2, rng=0)
    x = np.random.default_rng(10).standard_normal((2, 5, 8))
    copies = (x.copy(), {n: p.copy() for n, p in layer.params.items()})
    state = layer.zero_state(2)
    (y, new_state), cache = layer.forward(x, np.ones((2, 5), bool), state)
    layer.backward(np.ones_like(y), cache, new_state)
    assert np.array_equal(x, copies[0]) and all(np.array_equal(layer.params[n], p) for n, p in copies[1].items())
    assert not np.any(state.conv) and not np.any(state.recurrent) and new_state is not state
    cases = [
        (dict(x=x[..., :7]), r"x with shape \(2, 5, 7\) and dtype float64 must be \(B, L, E = 8\)"),
        (dict(x=x.astype(np.float32)), "in the parameters' dtype float64"),
        (dict(attention_mask=np.ones((2, 5), int)), "attention_mask must be a bool"),
        (dict(state=DeltaNetState(state.conv[:, :2], state.recurrent)), r"state.conv must be \(2, 3, 20\)"),
        (dict(state=(state.conv, state.recurrent)), "state must be a DeltaNetState or None"),
    ]
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            layer.forward(**{"x": x, **change})
    for kwargs, match in [
        (dict(num_v_heads=3), "num_v_heads = 3 must be a multiple of num_k_heads = 2"),
        (dict(impl="fast"), "impl must be 'chunked' or 'recurrent'"),
        (dict(params={"W_out": np.zeros((8, 8))}), "the weights lack 6 of the 7 tensors"),
    ]:
        with pytest.raises(ValueError, match=match):
            GatedDeltaNet(**{"hidden_size": 8, "num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 3, "head_v_dim": 2,
                             **kwargs})  # fmt: skip


# --------------------------------------------------------------------------- Kimi Linear's layer


@pytest.mark.parametrize(
    "dtype, padded, impl",
    [(np.float64, True, "chunked"), (np.float64, False, "recurrent"), (np.float32, False, "chunked")],
)
def test_kimi_delta_attention_layer_matches_transformers(dtype, padded, impl):
    """KimiLinearDeltaAttention: output, state, dL/dx and its 13 parameters' gradients; float64 against the module
    with its casts lifted (1e-10; L = 7 over chunks of 4; left padding in one row), float32 as shipped (1e-5)."""
    require_torch()
    from mha_numpy.interop import kimi_linear_kda as KX

    module = KX.hf_kimi_delta_attention(dtype=dtype)
    x = np.random.default_rng(11).standard_normal((2, 7, module.hidden_size)).astype(dtype)
    mask = None
    if padded:
        mask = np.ones(x.shape[:2], bool)
        mask[1, :3] = False
    report = KX.crosscheck_hf_kimi_delta_attention(module, x, mask, chunk_size=4, impl=impl)
    assert report.passed and len(report.rows) == 17, str(report)
    if dtype == np.float64:
        layer = KX.from_hf_kimi_delta_attention(module, chunk_size=4, impl=impl)
        (y, final), _ = layer.forward(x)
        state, outs = None, []
        for a, b in [(0, 2)] + [(t, t + 1) for t in range(2, 7)]:
            (y_p, state), _ = layer.forward(x[:, a:b], state=state)
            outs.append(y_p)
        assert np.max(np.abs(np.concatenate(outs, axis=1) - y)) <= 1e-12 * np.max(np.abs(y))
        assert np.max(np.abs(state.recurrent - final.recurrent)) <= 1e-12 * np.max(np.abs(final.recurrent))
        y_hf, state_hf = KX.decode_hf_kimi_delta_attention(module, x, prefill=2)
        assert rel_err(y, y_hf) <= TOL and rel_err(final.recurrent, state_hf.recurrent) <= TOL
    else:  # float32 stays float32: outputs, state, every gradient
        layer = KX.from_hf_kimi_delta_attention(module)
        (y, state), cache = layer.forward(x)
        grads = layer.backward(np.ones_like(y), cache)
        assert y.dtype == state.conv.dtype == state.recurrent.dtype == np.float32
        assert all(grads[n].dtype == np.float32 for n in ("x", *layer.PARAM_NAMES))


def test_kimi_delta_attention_central_differences_for_every_parameter_input_and_state():
    from mha_numpy.recurrent.kimi import KimiDeltaAttention
    from mha_numpy.recurrent.layer import DeltaNetState

    rng = np.random.default_rng(12)
    E, H, d, K, B, L = 5, 2, 2, 3, 2, 4
    base = KimiDeltaAttention(E, H, d, K, chunk_size=3, rng=2)
    params = {n: p + 0.2 * randn(rng, *p.shape) for n, p in base.params.items()}
    params["A_log"] = np.log([0.5, 1.0])  # a memory of a few tokens
    x, conv0, rec0 = randn(rng, B, L, E), randn(rng, B, K - 1, base.conv_dim), 0.3 * randn(rng, B, H, d, d)
    shapes = [(B, L, E), conv0.shape, rec0.shape]
    sizes = [int(np.prod(s)) for s in shapes]

    def forward(x, conv0, rec0, **params):
        layer = KimiDeltaAttention(E, H, d, K, chunk_size=3, params=params)
        (y, s), _ = layer.forward(x, state=DeltaNetState(conv0, rec0))
        return np.concatenate([y.ravel(), s.conv.ravel(), s.recurrent.ravel()])

    d_out = randn(rng, sum(sizes))
    d_y, d_conv, d_rec = (d.reshape(s) for d, s in zip(np.split(d_out, np.cumsum(sizes)[:-1]), shapes))
    layer = KimiDeltaAttention(E, H, d, K, chunk_size=3, params=params)
    _, cache = layer.forward(x, state=DeltaNetState(conv0, rec0))
    g = layer.backward(d_y, cache, DeltaNetState(d_conv, d_rec))
    analytic = {"x": g["x"], "conv0": g["state"].conv, "rec0": g["state"].recurrent}
    analytic.update({n: g[n] for n in KimiDeltaAttention.PARAM_NAMES})
    finite_differences(forward, analytic, {"x": x, "conv0": conv0, "rec0": rec0, **params}, d_out)


def test_left_padding_writes_nothing_into_the_state():
    """A row padded on the left gives, at its real tokens, the outputs and final state of the row alone (the padding
    tokens' zeroed inputs give q = k = v = 0: nothing written), for both layers; and padding tokens get no gradient."""
    from mha_numpy.recurrent.kimi import KimiDeltaAttention
    from mha_numpy.recurrent.qwen3_next import GatedDeltaNet

    x = np.random.default_rng(13).standard_normal((2, 6, 8))
    mask = np.ones((2, 6), bool)
    mask[1, :2] = False
    for layer in (GatedDeltaNet(8, 2, 4, 3, 2, chunk_size=4, rng=3), KimiDeltaAttention(8, 2, 3, rng=3)):
        (y, s), cache = layer.forward(x, mask)
        (y_alone, s_alone), _ = layer.forward(x[1:, 2:])
        assert np.max(np.abs(y[1, 2:] - y_alone[0])) <= 1e-12 * np.max(np.abs(y_alone)), layer
        assert np.max(np.abs(s.recurrent[1] - s_alone.recurrent[0])) <= 1e-12 * np.max(np.abs(s_alone.recurrent))
        dx = layer.backward(np.ones_like(y), cache)["x"]
        assert not np.any(dx[1, :2]) and np.all(np.abs(dx[1, 2:]).sum(-1) > 0), layer


def test_an_empty_call_keeps_the_state_and_passes_its_gradient_through():
    """L = 0 (nothing to decode) and K = 1 (a convolution without memory): the state after the call is the state
    before it, and its gradient comes back unchanged."""
    from mha_numpy.recurrent.kimi import KimiDeltaAttention
    from mha_numpy.recurrent.layer import DeltaNetState
    from mha_numpy.recurrent.qwen3_next import GatedDeltaNet

    rng = np.random.default_rng(14)
    for layer in (GatedDeltaNet(8, 2, 4, 3, 2, rng=0), GatedDeltaNet(8, 2, 4, 3, 2, 1, rng=0),
                  KimiDeltaAttention(8, 2, 3, rng=0)):  # fmt: skip
        zero = layer.zero_state(2)
        state = DeltaNetState(randn(rng, *zero.conv.shape), randn(rng, *zero.recurrent.shape))
        (y, after), cache = layer.forward(np.zeros((2, 0, 8)), state=state)
        assert y.shape == (2, 0, 8) and np.array_equal(after.conv, state.conv)
        assert np.array_equal(after.recurrent, state.recurrent)
        d_state = DeltaNetState(randn(rng, *zero.conv.shape), randn(rng, *zero.recurrent.shape))
        g = layer.backward(y, cache, d_state)
        assert np.array_equal(g["state"].conv, d_state.conv) and np.array_equal(g["state"].recurrent, d_state.recurrent)
        assert all(not np.any(g[n]) for n in layer.PARAM_NAMES)
