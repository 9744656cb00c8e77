"""``python -m mha_numpy verify MODULE:FUNCTION`` (issue 23): the table, exit 0 only if every case passes, 1 when one
fails, --json and --html, and every usage mistake one line on stderr with exit 2, never a traceback (exit 3 when the
user's module raises on import). Runs on a few cases each (--only) to stay cheap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mha_numpy.__main__ import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "verify"
CORRECT = f"{EXAMPLES / 'correct.py'}:attention"


def verify(capsys, *argv) -> tuple[int, str, str]:
    code = main(["verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_correct_function_prints_the_table_and_exits_0(capsys):
    code, out, err = verify(capsys, CORRECT, "--only", "padding")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith(f"mha_numpy verify: {CORRECT}")
    assert "rule: a tensor passes when" in out and "x budget" in out and "detected" in out
    assert any(line.startswith("RESULT: PASS") for line in lines)
    assert "PASS" in next(line for line in lines if line.lstrip().startswith("1 "))


def test_a_buggy_function_exits_1_and_its_convention_is_named(capsys, tmp_path):
    page = tmp_path / "report.html"
    code, out, _ = verify(capsys, f"{EXAMPLES / 'top_left_causal.py'}:attention", "--only", "is_causal [float64",
                          "--html", str(page))  # fmt: skip
    assert code == 1
    assert "FAIL" in out and "causal top-left" in out and "RESULT: FAIL" in out and f"wrote {page}" in out
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_the_progress_line_is_on_stderr_and_only_on_a_terminal(capsys, monkeypatch):
    from mha_numpy.commands import verify as command

    code, out, err = verify(capsys, CORRECT, "--only", "padding [float64")
    assert code == 0 and err == ""  # not a terminal here: no progress
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    code, out, err = verify(capsys, CORRECT, "--only", "padding [float64")
    assert "verify [1/1] PASS  causal bottom-right + padding [float64" in err and "verify [" not in out
    code, out, err = verify(capsys, CORRECT, "--only", "padding [float64", "--json", "-")
    assert err == "" and json.loads(out)  # --json to stdout: no progress either
    assert command.EXIT_USAGE == 2


def test_json_to_stdout_is_the_report_alone(capsys, tmp_path):
    code, out, _ = verify(capsys, f"{EXAMPLES / 'swapped_mask.py'}:attention", "--only", "padding [float64", "--json",
                          "-")  # fmt: skip
    data = json.loads(out)  # nothing but the JSON on stdout
    assert code == 1 and data["passed"] is False and data["k"] == 2
    assert data["detected"] == {"mask polarity": 1} and data["results"][0]["status"] == "FAIL"
    path = tmp_path / "r.json"
    code, out, _ = verify(capsys, CORRECT, "--only", "padding [float64", "--json", str(path))
    assert code == 0 and f"wrote {path}" in out and json.loads(path.read_text())["passed"] is True


def test_in_process_runs_the_cases_here_and_says_so(capsys):
    code, out, _ = verify(capsys, CORRECT, "--only", "padding [float64", "--in-process")
    assert code == 0 and "note: run in verify's own process (--in-process): no time limit" in out, out


def test_a_torch_function_by_its_module_name(capsys):
    pytest.importorskip("torch", reason="torch is not installed: pip install -r requirements-dev.txt")
    code, out, _ = verify(capsys, "torch.nn.functional:scaled_dot_product_attention", "--sdpa-backend", "math",
                          "--only", "is_causal [float64")  # fmt: skip
    assert code == 1 and "causal top-left" in out and "math backend" in out.splitlines()[0]


MISTAKES = [
    (["no_colon"], "MODULE:FUNCTION"),
    (["no_such_module_xyz:attention"], "no module named"),
    (["mha_numpy.masks:no_such_function"], "has no 'no_such_function'"),
    (["mha_numpy.testing:MASK_KINDS"], "is a dict, not a function"),
    ([f"{EXAMPLES / 'missing.py'}:attention"], "no such file"),
    ([CORRECT, "--only", "no such case"], "--only"),
    ([CORRECT, "--cases", "huge"], "--cases"),
    ([CORRECT, "--without", "wings"], "--without"),
    ([CORRECT, "--dtypes", "float8"], "--dtypes"),
    ([CORRECT, "--device", "cuda"], "--device"),
    ([CORRECT, "--vjp", "no_such_vjp"], "--vjp"),
    ([CORRECT, "--json", "/no/such/dir/r.json"], "--json"),
    ([CORRECT, "--html", "."], "--html"),
    ([CORRECT, "--torch", "--jax"], "--jax"),
    ([CORRECT, "--timeout", "0"], "--timeout"),
]


@pytest.mark.parametrize("argv, says", MISTAKES, ids=[" ".join(a[1:]) or a[0] for a, _ in MISTAKES])
def test_a_usage_mistake_is_one_line_and_exit_2(argv, says, capsys):
    try:
        code = main(["verify", *argv])
    except SystemExit as e:  # argparse's own one-line error (a bad choice)
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err, err


def test_a_module_that_raises_on_import_exits_3_in_one_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('broken on import')\n")
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "verify", f"{bad}:attention"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"verify: importing {bad} raised RuntimeError: broken on import"
