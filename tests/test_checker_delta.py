"""Exercise 14 (the delta rule's backward through time): the checker's pair is the library's gated delta rule, a
correct file passes through ``python -m mha_numpy check``, and each catalogued mistake is what its diagnosis says.

The generic tests of test_checker.py run the rest: every variant of ``bugs._DELTA`` is caught and named, every
hand-written file of tests/data/students/delta_*.py fails where its bug is and is named, the solution passes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.checker import bugs
from mha_numpy.checker import delta_rule as DR
from mha_numpy.checker.cases import DELTA_RULE
from mha_numpy.recurrent import gated_delta_rule_backward, gated_delta_rule_forward

ROOT = Path(__file__).resolve().parent.parent
STUDENTS = Path(__file__).parent / "data" / "students"
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _case(with_state: bool, rng):
    B, H, L, dk, dv = 2, 3, 7, 4, 3
    x = dict(
        q=rng.standard_normal((B, H, L, dk)),
        k=rng.standard_normal((B, H, L, dk)) / 2,
        v=rng.standard_normal((B, H, L, dv)),
        g=-rng.uniform(0.05, 0.7, (B, H, L)),
        beta=rng.uniform(0.1, 0.9, (B, H, L)),
        initial_state=rng.standard_normal((B, H, dk, dv)) if with_state else None,
    )
    return x, rng.standard_normal((B, H, L, dv))


@pytest.mark.parametrize("with_state", [True, False], ids=["initial state", "none"])
def test_the_exercise_pair_is_the_library_gated_delta_rule(with_state):
    """The checker's reference pair (the cache translated) against gated_delta_rule_forward/backward in both forms,
    scale 1, no l2norm: the public pair the issue's tests check against torch autograd."""
    x, d_o = _case(with_state, np.random.default_rng(3))
    o, cache = DR.delta_rule_recurrent_forward(*x.values())
    got = dict(zip(NAMES, DR.delta_rule_recurrent_backward(d_o, cache), strict=True))
    assert cache[-1].shape == (2, 3, 8, 4, 3)  # S_0 and the state after each of the 7 tokens
    for impl in ("recurrent", "chunked"):
        (o_lib, S_lib), c_lib = gated_delta_rule_forward(**x, impl=impl, chunk_size=3, scale=1.0)
        want = gated_delta_rule_backward(d_o, c_lib)
        assert np.abs(o - o_lib).max() <= 1e-13 * np.abs(o_lib).max()
        assert np.abs(cache[-1][:, :, -1] - S_lib).max() <= 1e-13 * np.abs(S_lib).max()
        for name in NAMES:
            if want[name] is None:
                assert got[name] is None and not with_state
                continue
            assert np.abs(got[name] - want[name]).max() <= 1e-12 * np.abs(want[name]).max(), (impl, name)


def test_the_decay_on_the_wrong_side_scales_the_writes_gradients_by_a():
    """The diagnosis says: dv_t is a_t times the reference, dq and the initial state's gradient are right."""
    x, d_o = _case(True, np.random.default_rng(4))
    _, cache = DR.delta_rule_recurrent_forward(*x.values())
    right = dict(zip(NAMES, DR.delta_rule_recurrent_backward(d_o, cache), strict=True))
    wrong = dict(zip(NAMES, bugs.find("delta_decay_wrong_side").impl(d_o, cache), strict=True))
    a = np.exp(x["g"])[..., None]  # (B, H, L, 1)
    assert np.allclose(wrong["v"], a * right["v"], rtol=1e-12, atol=0)
    assert np.allclose(wrong["q"], right["q"], rtol=1e-12, atol=0)
    assert np.allclose(wrong["initial_state"], right["initial_state"], rtol=1e-12, atol=0)
    assert not np.allclose(wrong["k"], right["k"]) and not np.allclose(wrong["beta"], right["beta"])


def test_the_state_not_carried_leaves_dq_and_the_last_tokens_write_right():
    """Only what flows through S_t from later tokens is lost: dq everywhere, dk and dv of the last token stay right."""
    x, d_o = _case(True, np.random.default_rng(5))
    _, cache = DR.delta_rule_recurrent_forward(*x.values())
    right = dict(zip(NAMES, DR.delta_rule_recurrent_backward(d_o, cache), strict=True))
    wrong = dict(zip(NAMES, bugs.find("delta_state_not_carried").impl(d_o, cache), strict=True))
    assert np.allclose(wrong["q"], right["q"], rtol=1e-12, atol=0)
    for name in ("k", "v"):
        assert np.allclose(wrong[name][:, :, -1], right[name][:, :, -1], rtol=1e-12, atol=0)
        assert not np.allclose(wrong[name][:, :, :-1], right[name][:, :, :-1])


def test_the_cases_give_a_state_and_none_and_stay_inside_the_gates_bounds():
    cases = DELTA_RULE.cases(np.random.default_rng(0))
    assert [c.gives("initial_state") for c in cases] == [True, False]
    for case in cases:
        g, beta = case.get("g"), case.get("beta")
        assert g.max() < -1e-3 and beta.min() > 1e-3 and beta.max() < 1 - 1e-3  # central differences stay inside


def _check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mha_numpy", "check", str(path)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_check_passes_the_solution_and_names_a_bug_from_the_command_line():
    """The command a student runs: the solution exits 0; β's gradient from v_t exits 1 naming dbeta and the bug."""
    solved = _check(ROOT / "exercises" / "solutions" / "ex14_delta_rule_backward.py")
    assert solved.returncode == 0, solved.stdout + solved.stderr
    assert "delta_rule_recurrent_backward  PASS" in solved.stdout
    wrong = _check(STUDENTS / "delta_beta_without_error.py")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    row = wrong.stdout.split("delta_rule_recurrent_backward", 1)[1]
    assert row.split()[0] == "FAIL" and row.split()[1] == "dbeta", wrong.stdout
    assert bugs.find("delta_beta_without_error").title in wrong.stdout
