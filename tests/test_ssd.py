"""Mamba-2's SSD (issue 40): the chunked scan and its quadratic (attention) form against transformers'
``mamba2_chunk_scan`` (float32 casts lifted) and torch autograd, the (L, L) matrix times x against the scan, central
differences, one-token decoding; then the whole ``Mamba2Mixer`` layer."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy.gradcheck import check_function
from mha_numpy.recurrent import ssd as SSD

TOL = 1e-10  # float64 against torch autograd
FD = 1e-7  # float64 against central differences
GRADS = ("x", "dt", "A", "B", "C", "D", "initial_state")


def ssd_case(rng, b=2, H=4, G=2, L=11, P=3, N=5, dtype=np.float64):
    """x, dt, A, B, C, D, S0: two heads a group, decays e^{A·dt} from 0.02 to 0.99 (some heads forget at once)."""
    return {
        "x": rng.standard_normal((b, H, L, P)).astype(dtype),
        "dt": rng.uniform(0.05, 1.0, (b, H, L)).astype(dtype),
        "A": -rng.uniform(0.2, 4.0, H).astype(dtype),
        "B": rng.standard_normal((b, G, L, N)).astype(dtype),
        "C": rng.standard_normal((b, G, L, N)).astype(dtype),
        "D": rng.standard_normal(H).astype(dtype),
        "initial_state": rng.standard_normal((b, H, N, P)).astype(dtype),
    }


def finite_differences(forward, analytic, inputs, d_out):
    report = check_function(forward, analytic, inputs, d_out)
    assert report.passed, str(report)
    for row in report.rows:
        assert not row.zero_gradient and row.max_rel_err <= FD, str(report)


# --------------------------------------------------------------------------- the core


@pytest.mark.parametrize(
    "impl, chunk_size, with_state", [("chunked", 4, True), ("chunked", 3, False), ("quadratic", 64, True)]
)
def test_ssd_matches_transformers_chunk_scan_and_autograd(impl, chunk_size, with_state):
    """y, the final state and every gradient (the final state's upstream gradient included) against transformers'
    chunked scan with its casts lifted, to 1e-10: L = 11 over chunks of 4 and 3 (a padded last chunk), or one chunk."""
    require_torch()
    from mha_numpy.interop.mamba2 import torch_ssd

    rng = np.random.default_rng(0)
    case = ssd_case(rng)
    if not with_state:
        case["initial_state"] = None
    d_y, d_S = rng.standard_normal(case["x"].shape), rng.standard_normal((2, 4, 5, 3))
    (y, S), cache = SSD.ssd_forward(**case, chunk_size=chunk_size, impl=impl)
    g = SSD.ssd_backward(d_y, cache, d_S)
    theirs = torch_ssd(**case, chunk_size=4, d_y=d_y, d_final_state=d_S)
    assert rel_err(y, theirs["y"]) <= TOL and rel_err(S, theirs["final_state"]) <= TOL
    for name in GRADS:
        if case[name] is None:
            assert g[name] is None
        else:
            assert rel_err(g[name], theirs[name]) <= TOL, name


def test_ssd_matrix_times_x_is_the_scan():
    """The SSM as attention: M (B, H, L, L) from ``ssd_matrix_forward`` times x equals the chunked scan's y to 1e-12
    (zero initial state), M is zero above the diagonal, and its entries are C_i·B_j e^{γ_i − γ_j} dt_j + D δ_ij."""
    rng = np.random.default_rng(1)
    case = ssd_case(rng, L=9)
    case["initial_state"] = None
    (y, _), _ = SSD.ssd_forward(**case, chunk_size=4)
    M, _ = SSD.ssd_matrix_forward(case["dt"], case["A"], case["B"], case["C"], case["D"])
    assert M.shape == (2, 4, 9, 9)
    assert np.max(np.abs(M @ case["x"] - y)) <= 1e-12 * np.max(np.abs(y))
    assert not np.any(np.triu(M, 1))
    b, h, i, j = 1, 3, 7, 2  # head 3 reads group 1
    gam = np.cumsum(case["A"][h] * case["dt"][b, h])
    entry = case["C"][b, 1, i] @ case["B"][b, 1, j] * np.exp(gam[i] - gam[j]) * case["dt"][b, h, j]
    assert abs(M[b, h, i, j] - entry) <= 1e-14 * abs(entry)
    assert abs(M[b, h, i, i] - (case["C"][b, 1, i] @ case["B"][b, 1, i] * case["dt"][b, h, i] + case["D"][h])) <= 1e-14


def test_ssd_and_its_matrix_central_differences():
    """Every gradient of the scan (the initial state's, D's, A's included; the final state carries a gradient) and
    of the matrix against central differences, float64, tiny sizes."""
    rng = np.random.default_rng(2)
    case = ssd_case(rng, b=1, H=2, G=1, L=5, P=2, N=3)
    sizes = [case["x"].size, case["initial_state"].size]

    def forward(**inputs):
        (y, S), _ = SSD.ssd_forward(**inputs, chunk_size=2)
        return np.concatenate([y.ravel(), S.ravel()])

    d_out = rng.standard_normal(sum(sizes))
    d_y, d_S = d_out[: sizes[0]].reshape(case["x"].shape), d_out[sizes[0] :].reshape(case["initial_state"].shape)
    _, cache = SSD.ssd_forward(**case, chunk_size=2)
    finite_differences(forward, SSD.ssd_backward(d_y, cache, d_S), case, d_out)

    args = {n: case[n] for n in ("dt", "A", "B", "C", "D")}
    M, cache = SSD.ssd_matrix_forward(**args)
    d_M = np.tril(rng.standard_normal(M.shape))  # the entries above the diagonal are constant zeros
    finite_differences(lambda **a: SSD.ssd_matrix_forward(**a)[0], SSD.ssd_matrix_backward(d_M, cache), args, d_M)


def test_ssd_float32_stays_float32_near_transformers_as_shipped():
    """float32 in, float32 out (y, state, every gradient), within 1e-5 of transformers' scan as shipped."""
    require_torch()
    from mha_numpy.interop.mamba2 import torch_ssd

    rng = np.random.default_rng(3)
    case = ssd_case(rng, dtype=np.float32)
    d_y = rng.standard_normal(case["x"].shape).astype(np.float32)
    (y, S), cache = SSD.ssd_forward(**case, chunk_size=4)
    g = SSD.ssd_backward(d_y, cache)
    theirs = torch_ssd(**case, chunk_size=4, d_y=d_y, shipped=True)
    assert y.dtype == S.dtype == np.float32 and all(g[n].dtype == np.float32 for n in GRADS)
    assert rel_err(y, theirs["y"]) <= 1e-5 and rel_err(S, theirs["final_state"]) <= 1e-5
    assert all(rel_err(g[n], theirs[n]) <= 1e-5 for n in GRADS)


def test_transformers_scan_lifted_to_float64_is_float64_or_says_so(monkeypatch):
    """``mamba2_chunk_scan_float64`` runs transformers' own scan with float32 meaning float64: float64 out and torch
    restored; a float32 input refused naming it; a cast the lift cannot reach a TypeError, not a float32 result."""
    require_torch()
    import torch
    from transformers.models.mamba2 import modeling_mamba2

    from mha_numpy.interop.mamba2 import mamba2_chunk_scan_float64

    case = {n: torch.from_numpy(a) for n, a in ssd_case(np.random.default_rng(8)).items()}
    args = (case["x"].transpose(1, 2), case["dt"].transpose(1, 2), case["A"], case["B"].transpose(1, 2),
            case["C"].transpose(1, 2), 4)  # fmt: skip
    y, S = mamba2_chunk_scan_float64(*args, D=case["D"], return_final_states=True)
    assert y.dtype == S.dtype == torch.float64 and torch.float32 is not torch.float64
    assert torch.get_default_dtype() == torch.float32
    with pytest.raises(ValueError, match=r"float64 tensors, got torch.float32 for argument 'D'"):
        mamba2_chunk_scan_float64(*args, D=case["D"].float())
    fixed = torch.float32  # read before the block: the lift cannot change it
    monkeypatch.setattr(modeling_mamba2, "mamba2_chunk_scan", lambda *a, **k: a[0].to(fixed))
    with pytest.raises(TypeError, match="a cast the lift does not reach"):
        mamba2_chunk_scan_float64(*args)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(dt=np.ones((2, 4, 10))), r"dt with shape \(2, 4, 10\) must be \(B, H, L\) = \(2, 4, 11\)"),
        (dict(A=np.ones(4)), "A must be <= 0"),
        (dict(dt=-np.ones((2, 4, 11))), "dt must be >= 0"),
        (dict(B=np.ones((2, 3, 11, 5))), r"B with shape \(2, 3, 11, 5\) must be \(B, G, L, N\)"),
        (dict(C=np.ones((2, 2, 11, 4))), r"C with shape \(2, 2, 11, 4\) must have B's shape"),
        (dict(D=np.ones(3)), r"D with shape \(3,\) must be \(H,\)"),
        (dict(initial_state=np.ones((2, 4, 3, 5))), r"initial_state with shape \(2, 4, 3, 5\) must be"),
        (dict(x=np.full((2, 4, 11, 3), np.nan)), "x with shape .* must be finite"),
        (dict(C=np.ones((2, 2, 11, 5), np.float32)), "C has dtype float32, x has float64"),
        (dict(impl="fast"), "impl must be one of"),
        (dict(chunk_size=0), "chunk_size must be a positive int"),
    ],
)
def test_ssd_bad_input_names_the_argument(change, match):
    case = ssd_case(np.random.default_rng(4))
    with pytest.raises(ValueError, match=match):
        SSD.ssd_forward(**{**case, **change})


def test_ssd_inputs_are_not_modified_and_a_second_backward_agrees():
    case = ssd_case(np.random.default_rng(5))
    copies = {n: a.copy() for n, a in case.items()}
    (y, S), cache = SSD.ssd_forward(**case, chunk_size=4)
    d_S = np.ones_like(S)
    g1, g2 = SSD.ssd_backward(np.ones_like(y), cache, d_S), SSD.ssd_backward(np.ones_like(y), cache, d_S)
    assert all(np.array_equal(case[n], copies[n]) for n in case) and np.array_equal(d_S, np.ones_like(S))
    assert all(np.array_equal(g1[n], g2[n]) for n in GRADS)


def test_an_empty_sequence_passes_the_state_and_its_gradient_through_as_new_arrays():
    """L = 0: the final state is the initial one's value in a new array (it was the caller's array itself, so writing
    into it changed the initial state), and its gradient comes back as a new array too; both forms."""
    case = ssd_case(np.random.default_rng(8), L=0)
    before = case["initial_state"].copy()
    for impl in SSD.IMPLS:
        (y, S), cache = SSD.ssd_forward(**case, impl=impl)
        assert y.shape == (2, 4, 0, 3) and np.array_equal(S, before)
        S += 1.0
        assert np.array_equal(case["initial_state"], before), impl
        d_S = np.ones_like(S)
        g = SSD.ssd_backward(y, cache, d_S)
        assert np.array_equal(g["initial_state"], d_S) and g["initial_state"] is not d_S, impl
        assert all(not np.any(g[n]) for n in ("A", "D")) and g["B"].shape == (2, 2, 0, 5)


# --------------------------------------------------------------------------- one-token decoding


def test_ssd_step_token_by_token_equals_the_full_scan_and_transformers_update():
    """``ssd_step`` from the initial state, one token a call: outputs and state equal one chunked call's to 1e-12,
    and transformers' ``mamba2_selective_state_update`` (casts lifted) to 1e-10; the state passed in is untouched."""
    require_torch()
    import torch

    from mha_numpy.interop.mamba2 import mamba2_selective_state_update_float64

    case = ssd_case(np.random.default_rng(6))
    x, dt, A, B, C, D, S0 = (case[n] for n in GRADS)
    (y, S_full), _ = SSD.ssd_forward(**case, chunk_size=4)
    S, outs, S0_copy = S0, [], S0.copy()
    theirs_state, theirs = torch.tensor(S0.transpose(0, 1, 3, 2).copy()), []  # theirs (B, H, P, N)
    P = x.shape[3]
    for t in range(x.shape[2]):
        y_t, S = SSD.ssd_step(x[:, :, t], dt[:, :, t], A, B[:, :, t], C[:, :, t], D, S)
        outs.append(y_t)
        dt_p = torch.tensor(dt[:, :, t, None]).expand(-1, -1, P)  # their layer's expansion over the head dim
        A_p = torch.tensor(A)[:, None, None].expand(-1, P, B.shape[3])
        theirs.append(mamba2_selective_state_update_float64(
            theirs_state, torch.tensor(x[:, :, t]), dt_p, A_p, torch.tensor(B[:, :, t]), torch.tensor(C[:, :, t]),
            torch.tensor(D)[:, None].expand(-1, P)).numpy())  # fmt: skip
    outs = np.stack(outs, axis=2)
    assert np.max(np.abs(outs - y)) <= 1e-12 * np.max(np.abs(y))
    assert np.max(np.abs(S - S_full)) <= 1e-12 * np.max(np.abs(S_full)) and np.array_equal(S0, S0_copy)
    assert rel_err(outs, np.stack(theirs, axis=2)) <= TOL
    assert rel_err(S, theirs_state.numpy().transpose(0, 1, 3, 2)) <= TOL


def test_ssd_step_bad_input_names_the_argument():
    case = ssd_case(np.random.default_rng(7))
    x, dt, A, B, C, D, S0 = (case[n] for n in GRADS)
    token = dict(x_t=x[:, :, 0], dt_t=dt[:, :, 0], A=A, B_t=B[:, :, 0], C_t=C[:, :, 0], D=D, state=S0)
    for change, match in [
        (dict(x_t=x[:, :, :2]), r"x_t must have 3 dimensions, got shape \(2, 4, 2, 3\)"),
        (dict(state=S0[:, :2]), r"state with shape \(2, 2, 5, 3\) must be \(B, H, N, P\)"),
        (dict(dt_t=-dt[:, :, 0]), "dt_t must be >= 0"),
        (dict(A=-A), "A must be <= 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            SSD.ssd_step(**{**token, **change})


# --------------------------------------------------------------------------- the Mamba2Mixer layer


def mixer_and_input(dtype=np.float64, B=2, L=7, seed=0, **options):
    from mha_numpy.interop import mamba2 as MX

    module = MX.hf_mamba2_mixer(dtype=dtype, seed=seed, **options)  # 4 heads in 2 groups, chunks of 4
    x = np.random.default_rng(seed).standard_normal((B, L, module.hidden_size)).astype(dtype)
    return MX, module, x


@pytest.mark.parametrize("impl, padded, limit", [("chunked", False, None), ("quadratic", True, None),
                                                 ("chunked", True, (0.2, 0.9))])  # fmt: skip
def test_mamba2_mixer_matches_transformers_in_float64(impl, padded, limit):
    """Output, the state after the call (conv and SSM), dL/dx and every parameter's gradient against Mamba2Mixer's
    torch path with its float32 casts lifted, to 1e-10: batch 2, 2 groups of 2 heads, L = 7 over chunks of 4, left
    padding in one row; a time-step limit that clamps some steps and not others."""
    require_torch()
    options = {} if limit is None else {"time_step_limit": limit}
    MX, module, x = mixer_and_input(**options)
    mask = None
    if padded:
        mask = np.ones(x.shape[:2], bool)
        mask[1, :3] = False
    report = MX.crosscheck_hf_mamba2_mixer(module, x, mask, impl=impl)
    assert report.passed and len(report.rows) == 12 and report.rtol == TOL, str(report)
    assert "as shipped" in report.notes[0]
    if limit is not None:
        _, cache = MX.from_hf_mamba2_mixer(module).forward(x, mask)
        inside = cache.c_dt[1]
        assert inside.any() and not inside.all()  # the clamp's gradient is 0 for some tokens, 1 for others


def test_mamba2_mixer_float32_against_transformers_as_shipped():
    require_torch()
    MX, module, x = mixer_and_input(np.float32)
    report = MX.crosscheck_hf_mamba2_mixer(module, x)
    assert report.passed and report.rtol == 1e-5, str(report)
    layer = MX.from_hf_mamba2_mixer(module)
    (y, state), cache = layer.forward(x)
    grads = layer.backward(np.ones_like(y), cache)
    assert y.dtype == state.conv.dtype == state.recurrent.dtype == np.float32
    assert all(grads[n].dtype == np.float32 for n in ("x", *layer.PARAM_NAMES))


def test_mamba2_mixer_decoding_token_by_token_equals_one_call_and_transformers_cache():
    """A prefill of 3 tokens, then one token a call with the conv and SSM state: outputs and state equal one call's
    to 1e-12 (both forms, and with a time-step limit that binds), and transformers' decoding with its cache (casts
    lifted; its one-token path is ``mamba2_selective_state_update``, which ignores the limit) to 1e-10."""
    require_torch()
    MX, module, x = mixer_and_input(L=8)
    for impl, limit in (("chunked", None), ("quadratic", None), ("chunked", (0.2, 0.9))):
        layer = MX.from_hf_mamba2_mixer(module, impl=impl)
        if limit is not None:  # a limit that binds: one token a call clamps as one call does (transformers' doesn't)
            layer = MX.Mamba2Mixer(8, 4, 4, 5, 2, 3, time_step_limit=limit, params=layer.params, chunk_size=4)
        (y, final), _ = layer.forward(x)
        state, outs = None, []
        for a, b in [(0, 3)] + [(t, t + 1) for t in range(3, 8)]:
            (y_p, state), _ = layer.forward(x[:, a:b], state=state)
            outs.append(y_p)
        assert np.max(np.abs(np.concatenate(outs, axis=1) - y)) <= 1e-12 * np.max(np.abs(y)), impl
        assert np.max(np.abs(state.recurrent - final.recurrent)) <= 1e-12 * np.max(np.abs(final.recurrent)), impl
        assert np.array_equal(state.conv, final.conv), impl
    layer = MX.from_hf_mamba2_mixer(module)
    (y, final), _ = layer.forward(x)
    y_hf, state_hf = MX.decode_hf_mamba2_mixer(module, x, prefill=3)
    assert rel_err(y, y_hf) <= TOL and rel_err(final.recurrent, state_hf.recurrent) <= TOL
    assert rel_err(final.conv, state_hf.conv) <= TOL


def test_mamba2_mixer_central_differences_for_every_parameter_input_and_state():
    """Every gradient of the layer, the initial state's included (a call in the middle of a sequence), against
    central differences; the output and both parts of the state after the call carry an upstream gradient; a
    time-step limit that binds for some tokens."""
    from mha_numpy.recurrent.mamba2 import Mamba2Mixer, Mamba2State

    rng = np.random.default_rng(9)
    E, H, P, N, G, K, B, L = 4, 2, 2, 3, 1, 3, 2, 5
    sizes_ = (E, H, P, N, G, K)
    opts = dict(chunk_size=2, time_step_limit=(0.0, 1.5))
    base = Mamba2Mixer(*sizes_, rng=1, **opts)
    params = {n: p + 0.2 * rng.standard_normal(p.shape) for n, p in base.params.items()}
    params["A_log"], params["dt_bias"] = np.log([0.5, 1.0]), np.array([0.5, -0.5])  # a memory of a few tokens
    x = rng.standard_normal((B, L, E))
    conv0, rec0 = rng.standard_normal((B, K - 1, base.conv_dim)), 0.3 * rng.standard_normal((B, H, N, P))
    shapes = [(B, L, E), (B, K - 1, base.conv_dim), (B, H, N, P)]
    sizes = [int(np.prod(s)) for s in shapes]

    def forward(x, conv0, rec0, **params):  # y and the state after the call, flattened side by side
        layer = Mamba2Mixer(*sizes_, params=params, **opts)
        (y, s), _ = layer.forward(x, state=Mamba2State(conv0, rec0))
        return np.concatenate([y.ravel(), s.conv.ravel(), s.recurrent.ravel()])

    d_out = rng.standard_normal(sum(sizes))
    d_y, d_conv, d_rec = (d.reshape(s) for d, s in zip(np.split(d_out, np.cumsum(sizes)[:-1]), shapes))
    layer = Mamba2Mixer(*sizes_, params=params, **opts)
    _, cache = layer.forward(x, state=Mamba2State(conv0, rec0))
    assert cache.c_dt[1].any() and not cache.c_dt[1].all()
    g = layer.backward(d_y, cache, Mamba2State(d_conv, d_rec))
    analytic = {"x": g["x"], "conv0": g["state"].conv, "rec0": g["state"].recurrent}
    analytic.update({n: g[n] for n in Mamba2Mixer.PARAM_NAMES})
    finite_differences(forward, analytic, {"x": x, "conv0": conv0, "rec0": rec0, **params}, d_out)


def test_mamba2_mixer_bad_input_names_the_argument_and_nothing_is_modified():
    from mha_numpy.recurrent.layer import DeltaNetState
    from mha_numpy.recurrent.mamba2 import Mamba2Mixer, Mamba2State

    layer = Mamba2Mixer(8, 4, 4, 3, 2, rng=0)
    x = np.random.default_rng(10).standard_normal((2, 5, 8))
    copies = (x.copy(), {n: p.copy() for n, p in layer.params.items()})
    state = layer.zero_state(2)
    (y, new_state), cache = layer.forward(x, np.ones((2, 5), bool), state)
    layer.backward(np.ones_like(y), cache, new_state)
    assert np.array_equal(x, copies[0]) and all(np.array_equal(layer.params[n], p) for n, p in copies[1].items())
    assert not np.any(state.conv) and not np.any(state.recurrent) and new_state is not state
    cases = [
        (dict(x=x[..., :7]), r"x with shape \(2, 5, 7\) and dtype float64 must be \(B, L, E = 8\)"),
        (dict(attention_mask=np.ones((2, 5), int)), "attention_mask must be a bool"),
        (dict(state=Mamba2State(state.conv[:, :2], state.recurrent)), r"state.conv must be \(2, 3, 28\)"),
        (dict(state=DeltaNetState(state.conv, state.recurrent)), "state must be a Mamba2State or None, got DeltaN"),
    ]
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            layer.forward(**{"x": x, **change})
    with pytest.raises(ValueError, match=r"d_out must have the shape \(2, 5, 8\)"):
        layer.backward(np.ones((2, 5, 7)), cache)
    with pytest.raises(ValueError, match="d_state must be a Mamba2State or None"):
        layer.backward(np.ones_like(y), cache, DeltaNetState(state.conv, state.recurrent))
    for kwargs, match in [
        (dict(n_groups=3), "n_groups = 3 must divide num_heads = 4"),
        (dict(impl="recurrent"), "impl must be one of"),
        (dict(time_step_limit=(0.5, 0.1)), "limit must be"),
        (dict(params={"W_out": np.zeros((8, 16))}), "the weights lack 7 of the 8 tensors"),
    ]:
        with pytest.raises(ValueError, match=match):
            Mamba2Mixer(**{"hidden_size": 8, "num_heads": 4, "head_dim": 4, "state_size": 3, **kwargs})


def test_time_step_and_grouped_gated_norm_against_autograd_and_central_differences():
    """The two pieces Mamba-2 adds: Δ = clamp(softplus(dt + dt_bias), lo, hi) and MambaRMSNormGated's order (gate,
    then RMSNorm over groups, then the weight), each against torch (float64, 1e-10) and central differences."""
    torch = require_torch()
    from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated

    from mha_numpy.recurrent import gates as GT
    from mha_numpy.recurrent import norms as NM

    rng = np.random.default_rng(11)
    dt, dt_bias = rng.standard_normal((2, 5, 4)), rng.standard_normal(4)
    delta, cache = GT.time_step_forward(dt, dt_bias, (0.3, 1.2))
    d = rng.standard_normal(delta.shape)
    g_dt, g_bias = GT.time_step_backward(d, cache)
    t_dt, t_bias = torch.tensor(dt, requires_grad=True), torch.tensor(dt_bias, requires_grad=True)
    t_delta = torch.clamp(torch.nn.functional.softplus(t_dt + t_bias), 0.3, 1.2)
    grads = torch.autograd.grad(t_delta, [t_dt, t_bias], torch.tensor(d))
    assert rel_err(delta, t_delta.detach().numpy()) <= TOL
    assert rel_err(g_dt, grads[0].numpy()) <= TOL and rel_err(g_bias, grads[1].numpy()) <= TOL
    finite_differences(lambda dt, dt_bias: GT.time_step_forward(dt, dt_bias, (0.3, 1.2))[0],
                       {"dt": g_dt, "dt_bias": g_bias}, {"dt": dt, "dt_bias": dt_bias}, d)  # fmt: skip

    x, z, w = rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 3, 6)), rng.standard_normal(6)
    out, cache = NM.grouped_gated_rms_norm_forward(x, z, w, 3, 1e-6)
    d = rng.standard_normal(out.shape)
    dx, dz, dw = NM.grouped_gated_rms_norm_backward(d, cache)
    norm = MambaRMSNormGated(6, group_size=3, eps=1e-6).double()  # float64 in, float32 inside: compared at 1e-6
    with torch.no_grad():
        norm.weight.copy_(torch.tensor(w))
    assert rel_err(out, norm(torch.tensor(x), torch.tensor(z)).detach().numpy()) <= 1e-6
    finite_differences(lambda x, z, w: NM.grouped_gated_rms_norm_forward(x, z, w, 3, 1e-6)[0],
                       {"x": dx, "z": dz, "w": dw}, {"x": x, "z": z, "w": w}, d)  # fmt: skip
    with pytest.raises(ValueError, match="group_size 4 must divide x's last dimension 6"):
        NM.grouped_gated_rms_norm_forward(x, z, w, 4)
