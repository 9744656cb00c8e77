"""``mha_numpy.testing.verify_flex`` and ``verify --flex`` (issue 36, ground truth for torch users): a torch
FlexAttention call's eager forward against ``mha_numpy.flex``'s, a user's backward against ours in float64, the first
wrong gradient named. The right backward is examples/verify/flex_soft_cap.py's, written by hand in NumPy (dense,
sharing no code with the package); each wrong one is it with one thing broken."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy.__main__ import main
from mha_numpy.testing import verify_flex

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "verify" / "flex_soft_cap.py"
TARGET = f"{EXAMPLE}:soft_cap"
RIGHT = ["--flex", TARGET, "--mask-mod", "causal", "--numpy-twin", "soft_cap_np", "--params", "PARAMS"]


@pytest.fixture(scope="module")
def X():
    """The example module: torch's soft_cap and causal, the NumPy twin, PARAMS, the hand-written backward."""
    require_torch()
    spec = importlib.util.spec_from_file_location("flex_soft_cap_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch's dynamo (inside flex_attention) looks the mods' module up by name
    spec.loader.exec_module(module)
    return module


def inverse_causal(b, h, q_idx, kv_idx):
    """torch's _inverse_causal_mask: when Lq > Lk, the queries past the last key see nothing."""
    return q_idx <= kv_idx


def check(X, backward, mask_mod=None, **kw):
    mask_mod = mask_mod or X.causal
    return verify_flex(X.soft_cap, mask_mod, numpy_score_mod=X.soft_cap_np, params=X.PARAMS, backward=backward, **kw)


def test_a_right_backward_passes_every_case_with_gqa_and_a_fully_masked_row(X):
    report = check(X, functools.partial(X.backward, mask_mod=inverse_causal), inverse_causal, gqa=True)
    assert report.passed and report.first_wrong is None, str(report)
    names = [r.case.name for r in report.results]
    assert any("fully masked row" in n for n in names) and any(n.startswith("GQA 4/2") for n in names), names
    assert {r.case.B for r in report.results} >= {2} and all(r.case.Lq != r.case.Lk for r in report.results)
    for r in report.results:  # every tensor judged, in this order
        assert list(r.checks) == ["out", "lse", "dq", "dk", "dv", "cap"] and r.status == "PASS", r
    assert "RESULT: PASS" in str(report) and "first wrong:" not in str(report)


def _doubled_cap(X):
    def backward(*args):
        dq, dk, dv, d = X.backward(*args)
        return dq, dk, dv, {"cap": 2.0 * d["cap"]}

    return backward


def _dv_blhd(X):
    def backward(*args):
        dq, dk, dv, d = X.backward(*args)
        return dq, dk, dv.swapaxes(1, 2), d  # (B, Lk, Hkv, d): a GPU kernel's layout

    return backward


WRONG = {  # what is broken: (the backward, the tensor named first, the tensors that must still pass)
    "the soft-cap's tanh' missing": (lambda X: X.backward_without_tanh_prime, "dq", ("dv", "cap")),
    "the cap's gradient doubled": (_doubled_cap, "cap", ("dq", "dk", "dv")),
    "dv in the (B, L, H, d) layout": (_dv_blhd, "dv", ("dq", "dk", "cap")),
}


@pytest.mark.parametrize("what", list(WRONG))
def test_each_wrong_backward_is_named_and_the_right_tensors_pass(X, what):
    make, named, right = WRONG[what]
    report = check(X, make(X))
    assert not report.passed and report.first_wrong[0] == named, str(report)
    for r in report.results:
        assert r.status == "FAIL" and r.message.startswith(f"first wrong: {named}"), r.message
        assert all(r.checks[n].passed for n in ("out", "lse", *right)), r.checks
    if named == "dv":
        assert "shape (2, 9, 4, 8), expected (2, 4, 9, 8)" in report.results[0].message
    assert f"first wrong: {named} (max error" in str(report)
    assert report.to_dict()["first_wrong"]["tensor"] == named and "first wrong" in report.to_html()


def test_a_twin_that_disagrees_with_the_torch_mod_is_caught_at_the_forward(X):
    def twin(score, b, h, q_idx, kv_idx, *, cap):  # the cap forgotten outside the tanh
        return np.tanh(score / cap[h])

    report = verify_flex(X.soft_cap, X.causal, numpy_score_mod=twin, params=X.PARAMS, backward=X.backward)
    assert report.first_wrong[0] == "out", str(report)
    for r in report.results:
        assert list(r.checks) == ["out", "lse"] and "gradients not judged" in r.message  # the backward not judged


def test_a_plain_operator_mod_runs_unchanged_and_a_torch_function_asks_for_its_twin(X):
    torch = require_torch()
    from torch.nn.attention.flex_attention import noop_mask

    def rel_bias(score, b, h, q_idx, kv_idx):  # torch's _rel_bias
        return score + (q_idx - kv_idx)

    report = verify_flex(rel_bias, noop_mask)  # torch's noop_mask (batch.new_ones) is replaced by ours
    assert report.passed and any("score_mod ran unchanged on NumPy arrays" in n for n in report.notes), str(report)
    assert any("no backward given" in n for n in report.notes)
    with pytest.raises(ValueError, match=r"score_mod does not run on NumPy arrays.*numpy_score_mod="):
        verify_flex(X.soft_cap, params=X.PARAMS)
    with pytest.raises(ValueError, match=r"params: 'dq' is the name of a tensor of the report"):  # its row's name
        verify_flex(X.soft_cap, numpy_score_mod=X.soft_cap_np, params={"dq": np.ones(4)})
    assert torch.is_tensor(X.soft_cap(torch.zeros(2), 0, torch.tensor([0, 1]), 0, 0, cap=torch.ones(4)))


def test_a_backward_that_writes_into_its_input_or_raises_fails_its_case(X):
    def writes(q, k, v, params, d_out):
        grads = X.backward(q, k, v, params, d_out)
        q *= 2.0
        return grads

    def raises(*args):
        raise RuntimeError("kernel launch failed")

    report = check(X, writes, only="batch 2")
    assert report.results[0].status == "FAIL" and report.results[0].written == ("q",), str(report)
    report = check(X, raises, only="batch 2")
    assert report.results[0].status == "ERROR" and "RuntimeError: kernel launch failed" in report.results[0].message


# --------------------------------------------------------------------------- the command line


def verify(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(["verify", *argv])
    except SystemExit as e:  # argparse's own one-line error
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_exits_0_for_the_right_backward_and_1_naming_the_first_wrong_gradient(X, capsys):
    code, out, _ = verify(capsys, *RIGHT, "--backward", "backward", "--gqa", "--in-process")  # the child: below
    assert code == 0 and "RESULT: PASS: 3 passed" in out, out
    code, out, _ = verify(capsys, *RIGHT, "--backward", "backward_without_tanh_prime", "--json", "-", "--in-process")
    data = json.loads(out)
    assert code == 1 and data["first_wrong"]["tensor"] == "dq" and data["passed"] is False


MISTAKES = [
    (["--flex"], "give MODULE:SCORE_MOD, --mask-mod or both"),
    (["--flex", TARGET, "--params", "PARAMS"], "--numpy-twin"),  # torch.tanh on NumPy arrays: the twin asked for
    ([*RIGHT, "--layout", "blhd"], "argument --layout: does not apply with --flex"),
    ([*RIGHT, "--vjp", "x"], "argument --vjp: does not apply with --flex"),
    ([TARGET, "--mask-mod", "causal"], "argument --mask-mod: applies with --flex only"),
    ([*RIGHT, "--backward", "no_such_backward"], "argument --backward:"),
    ([*RIGHT[:-2], "--params", "soft_cap"], "argument --params: params must be a dict"),
    ([*RIGHT, "--only", "no such case"], "argument --only:"),
    ([*RIGHT, "--heads", "3", "--gqa"], "argument --heads:"),
    ([*RIGHT, "--tol", "-1"], "--tol"),
    ([*RIGHT, "--mask-mod", "no_colon_nor_module"], "argument --mask-mod"),
]


@pytest.mark.parametrize("argv, says", MISTAKES, ids=[f"{i}: {s}" for i, (_, s) in enumerate(MISTAKES)])
def test_a_usage_mistake_is_one_line_and_exit_2(X, argv, says, capsys):
    """In verify's process, but the --params one, which the child process finds and reports to it."""
    code, _, err = verify(capsys, *argv, *(() if "--params" in says else ("--in-process",)))
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err, err


def _run(argv, tmp_path, pythonpath):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    return subprocess.run([sys.executable, "-m", "mha_numpy", "verify", *argv], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)  # fmt: skip


def test_the_cli_in_a_process_of_its_own_exits_1_and_names_dq(X, tmp_path):
    r = _run([*RIGHT, "--backward", "backward_without_tanh_prime", "--only", "batch 2"], tmp_path, [str(ROOT)])
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.splitlines()[-1].startswith("first wrong: dq (max error"), r.stdout


def test_a_backward_that_ends_its_process_is_its_cases_error_and_verify_still_reports(tmp_path):
    """The cases run in a child process (as the matrix's): a backward that kills it (a crash in a GPU kernel's C
    code) is that case's ERROR, the cases after it not run, and verify prints the report and exits 1."""
    require_torch()
    (tmp_path / "mods.py").write_text(
        "import os\nimport signal\n\n\ndef double(score, b, h, q_idx, kv_idx):\n    return score * 2\n\n\n"
        "def backward(q, k, v, params, d_out):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = _run(["--flex", "mods:double", "--backward", "backward"], tmp_path, [str(tmp_path), str(ROOT)])
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    rows = [line for line in r.stdout.splitlines() if line[:2] in ("1 ", "2 ")]
    assert "ERROR" in rows[0] and "signal SIGKILL" in rows[0], r.stdout
    assert "ERROR" in rows[1] and "not run" in rows[1] and r.stdout.count("RESULT: FAIL") == 1, r.stdout


def test_torch_missing_is_one_line_and_exit_2(tmp_path):
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    (tmp_path / "mods.py").write_text("def double(score, b, h, q_idx, kv_idx):\n    return score * 2\n")
    r = _run(["--flex", "mods:double"], tmp_path, [str(tmp_path / "no_torch"), str(tmp_path), str(ROOT)])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "needs the package 'torch'" in r.stderr and "pip install" in r.stderr


def test_a_mod_from_exec_code_runs_under_torchs_dynamo_and_leaves_no_module_behind(X):
    """torch's eager flex_attention (its dynamo) looks a mod's globals up through its __module__: a mod from exec'd
    code (a snippet, a REPL tool) that reads a global (torch) had a module in no sys.modules, and every case failed
    (InternalTorchDynamoError) before; the stand-in module is taken out after the call."""
    namespace = {"__name__": "exec_made_mods_xyz"}
    exec("import numpy as np\nimport torch\n\n\ndef scaled(score, b, h, q_idx, kv_idx, *, w):\n"
         "    return torch.tanh(score) * w[h]\n\n\ndef scaled_np(score, b, h, q_idx, kv_idx, *, w):\n"
         "    return np.tanh(score) * w[h]\n", namespace)  # fmt: skip  # noqa: S102
    report = verify_flex(namespace["scaled"], numpy_score_mod=namespace["scaled_np"], params={"w": np.ones(4)},
                         only="batch 2")  # fmt: skip
    assert report.passed, str(report)
    assert "exec_made_mods_xyz" not in sys.modules
