"""The command line: the commands run, print their tables and exit with the right code; every user mistake is
one line on stderr naming the argument, exit code 2, and never a traceback (issue 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


# --------------------------------------------------------------------------- user mistakes: one line, exit 2


def _not_writable_dir(tmp_path):
    """A directory no file can be created in: chmod for a normal user; sysfs's root for root (chmod binds not root)."""
    if os.geteuid() != 0:
        d = tmp_path / "read_only"
        d.mkdir()
        d.chmod(0o555)
        return d
    return Path("/sys")


def assert_usage_error(argv, option: str, capsys) -> str:
    """``main(argv)`` ends with exit code 2 and exactly one stderr line naming ``option``, no traceback."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors (type=, choices) exit from parse_args
        code = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1, f"{argv}: expected one line on stderr, got:\n{err}"
    assert option in lines[0] and "Traceback" not in err, lines[0]
    return lines[0]


MISTAKES = [  # (argv, the argument the message must name)
    (["gradcheck", "--lq", "0"], "--lq"),
    (["gradcheck", "--lq", "-3"], "--lq"),
    (["gradcheck", "--lk", "0"], "--lk"),
    (["gradcheck", "--batch", "0"], "--batch"),
    (["gradcheck", "--kdim", "0"], "--kdim"),
    (["gradcheck", "--vdim", "-1"], "--vdim"),
    (["gradcheck", "--embed-dim", "0"], "--embed-dim"),
    (["gradcheck", "--heads", "3"], "--heads"),
    (["gradcheck", "--heads", "0"], "--heads"),
    (["gradcheck", "--dropout", "1.5"], "--dropout"),
    (["gradcheck", "--dropout", "-0.1"], "--dropout"),
    (["gradcheck", "--eps", "0"], "--eps"),
    (["gradcheck", "--eps", "-1e-6"], "--eps"),
    (["gradcheck", "--eps", "nan"], "--eps"),
    (["gradcheck", "--rtol", "-1"], "--rtol"),
    (["gradcheck", "--seed", "-1"], "--seed"),
    (["gradcheck", "--lq", "two"], "--lq"),
    (["gradcheck", "--mask", "sideways"], "--mask"),
    (["tour", "--heads", "3"], "--heads"),
    (["crosscheck", "--batch", "0"], "--batch"),
    (["train", "--lr", "-1"], "--lr"),
    (["train", "--heads", "3"], "--heads"),
    (["train", "--steps", "0"], "--steps"),
    (["train", "--clip", "-1"], "--clip"),
    (["bert", "Hello", "--out", "attn.bmp"], "--out"),
    (["bert", "Hello", "--layer", "-1"], "--layer"),
    (["bert", "Hello", "--layer", "6"], "--layer"),
]


@pytest.mark.parametrize("argv, option", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_mistake_is_one_line_naming_the_argument_and_exit_2(argv, option, capsys):
    assert_usage_error(argv, option, capsys)


def test_eps_zero_is_a_usage_error_not_a_table_of_failures(capsys):
    line = assert_usage_error(["gradcheck", "--eps", "0"], "--eps", capsys)
    assert "positive" in line
    assert "FAIL" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["tour", "train"])
def test_out_directory_mistakes(command, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_usage_error([command, "--out", str(a_file)], "--out", capsys)  # an existing file
    assert_usage_error([command, "--out", str(a_file / "sub")], "--out", capsys)  # below a file
    assert_usage_error([command, "--out", str(_not_writable_dir(tmp_path))], "--out", capsys)
    assert_usage_error([command, "--out", "/proc/self/no/such/dir"], "--out", capsys)  # cannot be created
    assert a_file.read_text() == "x"


def test_bert_out_file_mistakes(tmp_path, capsys):
    assert_usage_error(["bert", "Hello", "--out", str(tmp_path / "missing" / "a.png")], "--out", capsys)
    assert_usage_error(["bert", "Hello", "--out", str(tmp_path)], "--out", capsys)  # a directory
    assert_usage_error(["bert", "Hello", "--out", str(_not_writable_dir(tmp_path) / "a.png")], "--out", capsys)


@pytest.mark.parametrize("name, magic", [("PNG", b"\x89PNG"), ("attn.svg", b"<?xml"), ("attn.PNG", b"\x89PNG")])
def test_bert_out_writes_exactly_the_file_it_names(name, magic, tmp_path, capsys):
    path = tmp_path / name
    assert main(["bert", "Hello world.", "--out", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no PNG.png next to it
    assert path.read_bytes().startswith(magic)


def test_a_missing_tour_out_directory_is_created(tmp_path, capsys):
    out = tmp_path / "new" / "figs"
    assert main(["tour", "--out", str(out)]) == 0
    assert any(out.glob("*.png")), capsys.readouterr().out
    assert not (out / ".mha_numpy_write_test").exists()


def test_a_missing_optional_package_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith(("matplotlib.", "mha_numpy.viz"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now fails as if not installed
    line = assert_usage_error(["tour", "--out", str(tmp_path)], "mha_numpy[viz]", capsys)
    assert "matplotlib" in line
    line = assert_usage_error(["train", "--steps", "1", "--out", str(tmp_path)], "mha_numpy[viz]", capsys)
    assert "trained" not in capsys.readouterr().out  # refused before training, not after


def test_mistakes_from_a_real_process_have_no_traceback(tmp_path):
    """The same rule end to end: a subprocess, as a user runs it."""
    for argv in (["gradcheck", "--lq", "0"], ["train", "--heads", "3"], ["tour", "--out", str(tmp_path / "f")]):
        if argv[0] == "tour":
            (tmp_path / "f").write_text("")
        r = run_cli(*argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and argv[1] in r.stderr
