"""The command line: tour and gradcheck run, print their tables, and exit with the right code."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mha_numpy.__main__ import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mha_numpy", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_the_commands():
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("tour", "gradcheck"):
        assert cmd in r.stdout


def test_tour_prints_every_step_backward_and_the_table():
    r = run_cli("tour")
    assert r.returncode == 0, r.stderr
    for step in (
        "projection",
        "split heads",
        "scores",
        "scale",
        "mask",
        "softmax",
        "weighted sum",
        "merge heads",
        "output projection",
        "BACKWARD",
        "GRADIENT CHECK",
        "W_o",
        "all gradients PASS",
    ):
        assert step in r.stdout, step
    assert "reproduce MultiHeadAttention.forward: True" in r.stdout


@pytest.mark.parametrize("mask", ["none", "causal", "additive", "fully-masked-row"])
def test_gradcheck_passes_for_configs(mask, capsys):
    code = main(
        [
            "gradcheck",
            "--mask",
            mask,
            "--batch",
            "2",
            "--lq",
            "3",
            "--lk",
            "4",
            "--kdim",
            "5",
            "--vdim",
            "3",
            "--skip-functional",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "W_k" in out and "FAIL" not in out


def test_gradcheck_exits_nonzero_when_a_gradient_is_wrong(monkeypatch, capsys):
    """Break the softmax backward into the diagonal-only shortcut: the check must catch it."""
    import mha_numpy.functional as F

    def diagonal_only(dp, cache):
        return cache * (1 - cache) * dp  # the classic bug

    monkeypatch.setattr(F, "softmax_backward", diagonal_only)
    code = main(["gradcheck", "--skip-functional", "--mask", "none"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL" in out


def test_gradcheck_with_dropout_holds_the_mask_fixed(capsys):
    assert main(["gradcheck", "--dropout", "0.3", "--skip-functional"]) == 0, capsys.readouterr().out
