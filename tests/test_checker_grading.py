"""The teacher's mode (checker.grading, ``check --submit``): hidden cases that a memorised answer fails, points per
function, the library's own functions scoring 0, a score file in Gradescope's results.json format (as otter-grader
writes it), nbgrader's partial credit, and exercises that run without solutions/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from mha_numpy import functional as F
from mha_numpy.__main__ import main
from mha_numpy.checker import bugs, check_namespace
from mha_numpy.checker.grading import BadCases, GradeCases, grade_namespace, library_imports, parse_cases

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "exercises" / "solutions"


def _solutions(stem: str) -> dict:
    namespace: dict = {}
    exec(compile((SOLUTIONS / f"{stem}.py").read_text(), f"{stem}.py", "exec"), namespace)  # noqa: S102
    return {k: v for k, v in namespace.items() if callable(v) and not isinstance(v, type)}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1], "holds a JSON object"),
        ({"seeds": 1}, "unknown keys ['seeds']"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"seed": True}, "seed must be a non-negative integer"),
        ({"points": {}}, "at least one entry"),
        ({"points": {"softmax_bwd": 1}}, "does not know: ['softmax_bwd']"),
        ({"points": {"softmax_backward": -2}}, "must be a number >= 0"),
        ({"visibility": "secret"}, "visibility must be one of"),
    ],
)
def test_a_bad_cases_file_is_one_line_naming_what_is_wrong(data, message):
    with pytest.raises(BadCases, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        parse_cases(data, "cases.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("cases.json: ")


def test_the_hidden_seed_fails_an_answer_that_memorised_the_students_cases():
    seen: dict[bytes, np.ndarray] = {}

    def recording_softmax_forward(x):
        out = F.softmax_forward(x)
        seen[np.asarray(x).tobytes()] = out[0]
        return out

    check_namespace({"softmax_forward": recording_softmax_forward})  # the cases every student sees

    def softmax_forward(x):  # the outputs of the visible cases, looked up: no maths
        return seen.get(np.asarray(x).tobytes(), np.zeros_like(x)).copy(), None

    visible = grade_namespace({"softmax_forward": softmax_forward})
    hidden = grade_namespace({"softmax_forward": softmax_forward}, {"seed": 8091, "points": {"softmax_forward": 2}})
    assert (visible.points, visible.max_points) == (1.0, 1.0)
    assert (hidden.points, hidden.max_points) == (0.0, 2.0) and hidden.tests[0]["status"] == "FAIL"


def test_points_per_function_with_the_diagnosis_and_nbgraders_partial_credit():
    namespace = _solutions("ex05_softmax") | _solutions("ex09_capstone_model")
    bug = next(b for b in bugs.BUGS if b.function == "softmax_backward")

    def softmax_backward(d_out, cache):  # the student's, with the bug
        return bug.impl(d_out, cache)

    namespace["softmax_backward"] = softmax_backward
    cases = {"seed": 3, "points": {"softmax_forward": 1, "softmax_backward": 2, "capstone_model_backward": 5,
                                   "layer_norm_backward": 3}}  # fmt: skip
    grade = grade_namespace(namespace, cases)
    by_name = {t["name"]: t for t in grade.tests}
    assert [t["name"] for t in grade.tests] == list(cases["points"])
    assert by_name["softmax_forward"]["score"] == 1 and by_name["capstone_model_backward"]["score"] == 5
    assert by_name["softmax_backward"]["score"] == 0 and bug.wrote in by_name["softmax_backward"]["detail"]
    assert by_name["layer_norm_backward"]["status"] == "missing"
    assert isinstance(grade.points, float) and (grade.points, grade.max_points) == (6.0, 11.0)  # nbgrader's number


def test_the_librarys_own_function_under_the_exercises_name_scores_zero():
    grade = grade_namespace({"softmax_forward": F.softmax_forward, "softmax_backward": F.softmax_backward})
    assert grade.points == 0 and all("mha_numpy.functional's own function" in t["detail"] for t in grade.tests)
    sources = ["from mha_numpy.functional import softmax_backward", "import mha_numpy.attention as A",
               "from mha_numpy import train, pairs", "from mha_numpy.checker import check_namespace"]  # fmt: skip
    assert library_imports(sources) == ["mha_numpy.attention", "mha_numpy.functional", "mha_numpy.pairs"]


def test_cli_submit_writes_gradescopes_results_json_and_scores_a_broken_file_zero(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cases = {"seed": 11, "points": {"softmax_forward": 1, "softmax_backward": 2}, "visibility": "after_due_date"}
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    hand_in = tmp_path / "hand_in.py"
    hand_in.write_text((SOLUTIONS / "ex05_softmax.py").read_text())
    assert main(["check", "--submit", str(hand_in), "--cases", "cases.json", "--score", "out.json"]) == 0
    results = json.loads((tmp_path / "out.json").read_text())
    assert results["score"] == 3.0 and [t["name"] for t in results["tests"]] == ["softmax_forward", "softmax_backward"]
    for test in results["tests"]:
        assert set(test) == {"name", "score", "max_score", "status", "output", "visibility"}
        assert (
            test["status"] == "passed" and test["visibility"] == "after_due_date" and test["score"] == test["max_score"]
        )
    cheat = tmp_path / "cheat.py"
    cheat.write_text("from mha_numpy.functional import softmax_backward, softmax_forward\n")
    assert main(["check", "--submit", str(cheat), "--cases", "cases.json"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["score"] == 0 and all("own function, imported" in t["output"] for t in results["tests"])
    assert "imports mha_numpy.functional" in results["output"]
    broken = tmp_path / "broken.py"
    broken.write_text("def softmax_forward(x:\n")
    assert main(["check", "--submit", str(broken), "--cases", "cases.json"]) == 3
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["score"] == 0 and "syntax error" in results["output"] and len(results["tests"]) == 2
    capsys.readouterr()
    for argv, message in [
        (["check"], "give one FILE to check, or --submit FILE"),
        (["check", str(hand_in), "--submit", str(hand_in)], "give one FILE to check, or --submit FILE"),
        (["check", str(hand_in), "--cases", "cases.json"], "--cases goes with --submit"),
        (["check", "--submit", str(hand_in), "--cases", "nope.json"], "no such cases file: nope.json"),
        (["check", "--submit", str(hand_in), "--score", str(tmp_path / "no" / "r.json")], "not a file in an existing"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_the_exercises_run_without_solutions(tmp_path):
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "solutions" not in code, f"{path.name} reads exercises/solutions/ in a code cell"
    copy = tmp_path / "ex05_softmax.ipynb"  # a student's folder: the notebook and nothing else
    copy.write_text((ROOT / "exercises" / "ex05_softmax.ipynb").read_text())
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "check", copy.name], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 1 and "softmax_backward" in r.stdout and "not done yet" in r.stdout, r.stdout + r.stderr


def test_grade_cases_defaults_are_the_students_cases_one_point_each():
    assert GradeCases() == parse_cases({})
    grade = grade_namespace(_solutions("ex08_layer_norm"))
    assert [(t["name"], t["score"]) for t in grade.tests] == [("layer_norm_forward", 1.0), ("layer_norm_backward", 1.0)]


FLASH_CASES = {"points": {"flash_attention_forward": 1, "flash_attention_backward": 2, "flash_attention_systems": 4}}
SYSTEMS_L = 2048  # the stage's default is 4096: half keeps these fast (tests/test_checker_systems.py does the same)


def test_submit_grades_exercise_13s_systems_stage_as_a_test_of_its_own(monkeypatch):
    """--submit ran exercise 13's numbers only: a flash pair that builds the whole (L, L) matrix scored full marks."""
    from functools import partial

    from mha_numpy.checker import grading, resident, systems

    full_matrix = ROOT / "tests" / "data" / "students" / "flash_full_matrix.py"
    grade = grading.grade_file(full_matrix, systems_size=SYSTEMS_L)  # no cases file: 1 point for the stage
    by_name = {t["name"]: t for t in grade.tests}
    assert list(by_name) == ["flash_attention_forward", "flash_attention_backward", "flash_attention_systems"]
    stage = by_name["flash_attention_systems"]
    assert (stage["score"], stage["max_score"], stage["status"]) == (0.0, 1.0, "FAIL"), stage
    assert "memory" in stage["detail"].split(": ")[0] and (grade.points, grade.max_points) == (2.0, 3.0)

    cases = parse_cases(FLASH_CASES)  # the solution, its time against any load (the targets: test_checker_systems)
    monkeypatch.setattr(grading, "check_systems", partial(systems.check_systems, time_ratio=1e9, repeats=1))
    stage = grading.grade_file(SOLUTIONS / "ex13_flash_backward.py", cases, systems_size=SYSTEMS_L).tests[-1]
    assert (stage["name"], stage["score"], stage["status"]) == ("flash_attention_systems", 4.0, "PASS"), stage
    monkeypatch.setattr(resident, "available", lambda pid=None: False)  # no /proc: not measured is 0, never a pass
    stage = grading.grade_file(SOLUTIONS / "ex13_flash_backward.py", cases, systems_size=SYSTEMS_L).tests[-1]
    assert (stage["score"], stage["max_score"], stage["status"]) == (0.0, 4.0, "not measured"), stage


def test_submit_no_systems_lists_the_stage_skipped_at_0_points_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cases.json").write_text(json.dumps(FLASH_CASES))
    solution = str(SOLUTIONS / "ex13_flash_backward.py")
    assert main(["check", "--submit", solution, "--cases", "cases.json", "--no-systems"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    stage = results["tests"][-1]
    assert (stage["name"], stage["score"], stage["max_score"], stage["status"]) == (
        "flash_attention_systems", 0.0, 4.0, "failed"
    )  # fmt: skip
    assert stage["output"] == "skipped: not measured (--no-systems): 0 points, not a pass" and results["score"] == 3.0
    assert "flash_attention_systems: skipped (--no-systems)" in results["output"]
    out = capsys.readouterr().out
    assert "flash_attention_systems   0/4  skipped" in out and "flash_attention_systems: skipped (--no-systems)" in out


def test_the_systems_stage_is_not_measured_in_a_notebooks_namespace_nor_run_on_a_failing_pair():
    namespace = _solutions("ex13_flash_backward")
    assert "flash_attention_systems" not in [t["name"] for t in grade_namespace(namespace).tests]  # nbgrader's default
    stage = grade_namespace(namespace, FLASH_CASES).tests[-1]
    assert (stage["score"], stage["status"]) == (0.0, "not measured") and "check --submit" in stage["detail"]
    namespace["flash_attention_backward"] = lambda d_o, cache: (d_o, d_o, d_o)
    stage = grade_namespace(namespace, FLASH_CASES).tests[-1]
    assert (stage["score"], stage["status"]) == (0.0, "not run") and "do not both pass" in stage["detail"], stage
