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
