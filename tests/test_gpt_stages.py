"""Exercise 15 graded by ``python -m mha_numpy check --gpt`` (checker.gpt_stages): the plain GPT the student's process
trains (checker.gpt_child) is the library's, the worked solution passes every stage with a small stage 4, a file with
a planted bug is stopped at the stage that has it (tests/data/students/gpt_*.py, each saying its stage), a run that
misses its loss or time target says so, CLI mistakes are one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.checker import capstone_block as CB
from mha_numpy.checker import capstone_gpt as G
from mha_numpy.checker import check_file, check_namespace, load_student
from mha_numpy.checker import gpt_child as GC
from mha_numpy.checker import gpt_stages as S

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "exercises" / "solutions"
SOLUTION = SOLUTIONS / "ex15_capstone_gpt.py"
PLANTED = sorted((ROOT / "tests" / "data" / "students").glob("gpt_*.py"))


def test_the_plain_gpt_of_the_students_process_is_the_librarys():
    """gpt_child (NumPy only: the child cannot import the library) makes capstone_block.block_forward's cache and
    capstone_gpt.loss_and_grads's loss and gradients, to rounding."""
    assert GC.PARAMS == CB.PARAMS and GC.EPS == CB.EPS
    rng = np.random.default_rng(4)
    P, x = CB.block_params(6, 3, 12, rng), rng.standard_normal((2, 5, 6))
    mine, (ref, _) = GC.block_forward(P, x, 3), CB.block_forward(P, x, np.zeros_like(x), 3, causal=True)
    assert set(ref) - set(mine) == {"d_y", "loss"}  # set by loss_and_grads, and exercise 10's own loss
    for name, value in mine.items():
        assert np.allclose(value, ref[name], rtol=0, atol=1e-13), name
    s = G.GPTSizes(vocab_size=9, context=6, hidden=8, layers=2, heads=2, inner=16)
    P = {k: v + 0.3 * np.random.default_rng(1).standard_normal(v.shape) for k, v in G.gpt_params(s).items()}
    ids = np.random.default_rng(2).integers(0, 9, (3, 7))
    ref_loss, ref = G.loss_and_grads(P, ids, s, None)
    loss, got = GC.loss_and_grads(P, ids, asdict(s), G.library_block_backward)
    assert abs(loss - ref_loss) < 1e-13
    largest = max(np.abs(g).max() for g in ref.values())
    for name in P:
        assert np.abs(got[name] - ref[name]).max() < 1e-12 * largest, name


def test_the_worked_solution_passes_every_stage_as_a_new_user_runs_it():
    """The command the notebook gives, with the small stage 4: five PASS lines, the loss, the bigram, the ratio."""
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "check", "--gpt", "--training", "small", str(SOLUTION)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("stage ") and ("PASS" in line or "FAIL" in line)]
    assert [line.split("  ")[0] for line in rows] == list(S.STAGES) and all(" PASS " in f"{x} " for x in rows), rows
    assert "the best bigram" in rows[-1] and "ratio" in rows[-1] and "s of CPU time" in rows[-1], rows[-1]
    assert r.stdout.splitlines()[-1] == "5 of 5 stages pass"


def test_training_off_says_stage_4_was_skipped_not_passed():
    """Stages 0-3 only: the summary says the loss was not trained, as --no-systems says for exercise 13."""
    report = check_file(SOLUTION, gpt="off")
    assert [r.status for r in report.rows] == ["PASS"] * 4
    assert "stage 4 skipped (--training off)" in report.summary() and "not passed" in report.summary()


def _stage(path: Path) -> tuple[str, str]:
    """(the stage's row label, a word its detail names) from the file's ``# gpt stage: N NAME... WORD`` line."""
    line = next(x for x in path.read_text().splitlines() if x.startswith("# gpt stage:")).split()[3:]
    return next(s for s in S.STAGES if s.startswith(f"stage {line[0]} ")), line[-1]


@pytest.mark.parametrize("path", PLANTED, ids=lambda p: p.stem)
def test_a_planted_bug_is_stopped_at_its_stage_and_named(path):
    """Each file runs in the checker's child process and in this one (a notebook); every stage before its own
    passes, its own FAILs naming the function, gradient or crash, and none after it runs."""
    stage, word = _stage(path)
    for report in (check_file(path, gpt="off"), check_namespace(load_student(path), gpt="off")):
        labels = [r.function for r in report.rows]
        assert labels == list(S.STAGES[: S.STAGES.index(stage) + 1]), str(report)
        assert all(r.status == "PASS" for r in report.rows[:-1]) and report.rows[-1].status == "FAIL", str(report)
        assert word in report.row_text(report.rows[-1]), str(report)
        assert not report.passed


def test_the_gpt_is_built_from_the_students_own_pairs():
    """A file holding exercises 1, 5 and 8 with exercise 15: stage 0 grades its pairs and the GPT's embedding,
    final LayerNorm, head and loss are the file's (stage 3 calls them: one of them made wrong fails it there)."""
    files = ("ex01_linear_embedding", "ex05_softmax", "ex08_layer_norm", "ex15_capstone_gpt")
    source = "\n".join((SOLUTIONS / f"{n}.py").read_text() for n in files)
    space = _namespace(source)
    report = check_namespace(space, gpt="off")
    assert [r.status for r in report.rows] == ["PASS"] * 4, str(report)
    assert "the GPT uses your embedding, layer_norm, linear, softmax_cross_entropy" in report.rows[0].detail
    calls = []
    space["softmax_cross_entropy_backward"] = lambda d, cache, real=space["softmax_cross_entropy_backward"]: (
        calls.append(1) or real(d, cache)
    )
    report = check_namespace(space, gpt="off")
    assert report.passed and calls, str(report)


def _namespace(source: str) -> dict:
    space: dict = {}
    exec(compile(source, "student.py", "exec"), space)  # noqa: S102 - the worked solutions
    return space


def test_a_run_that_misses_its_loss_or_time_target_says_which():
    """Stage 4 in this process (a notebook's namespace) on the small run cut short, then with no time to spare."""
    student = type("Student", (), {"namespace": load_student(SOLUTION), "names": []})()
    row = S.stage_loss(student, {}, replace(S.SMALL, steps=3))
    assert row.status == "FAIL" and row.detail.startswith("missed the loss target: validation "), row.detail
    row = S.stage_loss(student, {}, replace(S.SMALL, steps=3, target=10.0, seconds=1e-9))
    assert row.status == "FAIL" and row.detail.startswith("missed the time target: "), row.detail


def test_a_training_that_does_not_finish_is_stopped_at_the_wall_time_limit(tmp_path):
    """The training runs in the file's child process: a backward that never returns is killed after WALL_FACTOR times
    the stated CPU time."""
    slow = tmp_path / "slow.py"
    slow.write_text("import time\n\n\ndef capstone_block_backward(cache):\n    time.sleep(60)\n")
    from mha_numpy.checker.process import ChildProcess

    with ChildProcess(slow) as child:
        row = S.stage_loss(child, {}, replace(S.SMALL, seconds=0.5))
    assert row.status == "FAIL" and row.detail.startswith("missed the time target: the training did not finish"), row


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--training", "small", "x.py"], "check: --training goes with --gpt"),
        (["--gpt", "--submit", "x.py"], "check: --gpt checks a FILE"),
        (["--gpt", "--training", "long", "x.py"], "invalid choice: 'long'"),
    ],
)
def test_cli_mistakes_are_one_line_and_exit_2(argv, says):
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "check", *argv], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr


def test_the_exercise_notebook_is_checked_from_a_shell():
    """Its cells that use the library are checker cells (skipped in the child, which refuses the library): before,
    the corpus cell stopped the import and `check ex15_capstone_gpt.ipynb` could not run it."""
    report = check_file(ROOT / "exercises" / "ex15_capstone_gpt.ipynb", gpt="off")
    assert [(r.function, r.status) for r in report.rows] == [(S.STAGES[0], "PASS"), (S.STAGES[1], "not done yet")]
