"""The exercises' inline questions: a short form checked in the notebook (checker.short_answers) where the answer is a
number, a shape or a choice, a rubric for the teacher (checker.rubric) where it is prose, and both in the teacher's
results.json (checker.written, read from the notebook without running it).

The model answers are in exercises/solutions/inline.py (derived by hand, not taken from the checks).
"""

from __future__ import annotations

import ast
import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.__main__ import main
from mha_numpy.checker import answers, short_answers
from mha_numpy.checker.grading import MANUAL_TAG, grade_file
from mha_numpy.checker.rubric import RUBRIC, markdown
from mha_numpy.checker.short_answers import NOT_A_LITERAL
from mha_numpy.checker.written import NotALiteral, value, written_answers, written_tests

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = sorted((ROOT / "exercises").glob("ex*.ipynb"))
INLINE = runpy.run_path(str(ROOT / "exercises" / "solutions" / "inline.py"))
QUESTION = re.compile(r"\*\*Inline question (\d+)\.\*\*")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _key(path: Path, number: int | str) -> str:
    return f"{path.name[:4]}.inline_{number}"


def test_every_form_has_a_model_answer_and_a_mistake():
    assert set(INLINE["SOLUTIONS"]) == set(short_answers.FORMS) == set(INLINE["MISTAKES"])


@pytest.mark.parametrize("key", sorted(short_answers.FORMS))
def test_the_form_accepts_the_model_answer_and_rejects_a_mistake(key):
    assert short_answers.check(key, None).status == answers.NOT_ANSWERED
    right = short_answers.check(key, INLINE["SOLUTIONS"][key])
    assert right.correct, right
    wrong = short_answers.check(key, INLINE["MISTAKES"][key])
    assert wrong.status == answers.WRONG and wrong.message, wrong
    if not isinstance(INLINE["SOLUTIONS"][key], str):  # a choice names its options; a value is never given away
        assert repr(INLINE["SOLUTIONS"][key]) not in wrong.message


FLOATS = [k for k, v in sorted(INLINE["SOLUTIONS"].items()) if np.asarray(v).dtype.kind == "f"]


@pytest.mark.parametrize("key", FLOATS)
def test_a_hand_answer_with_four_significant_digits_is_right(key):
    four = np.vectorize(lambda x: float(f"{x:.4g}"))(np.asarray(INLINE["SOLUTIONS"][key], dtype=np.float64))
    assert short_answers.check(key, four.tolist()).correct


def test_a_set_of_choices_in_any_order_and_what_a_wrong_one_says():
    assert short_answers.check("ex14.inline_2", ("dg", "dbeta", "dv", "dk")).correct
    assert "one is missing" in short_answers.check("ex14.inline_2", ["dk", "dv"]).message
    assert "not among" in short_answers.check("ex14.inline_2", ["dk", "d_beta"]).message
    assert "a list of some of" in short_answers.check("ex14.inline_2", "dk").message
    ragged = short_answers.check("ex02.inline_1", [(0, 0), 1])  # no array: said, not raised
    assert ragged.status == answers.WRONG and "ragged" in ragged.message


def test_in_the_notebook_an_answer_computed_by_numpy_is_not_answered_as_in_the_teachers_grade():
    """The grade reads the form's line and never runs it: `inline_2 = np.zeros(3)` there is not an answer, so the
    notebook must not call it correct either."""
    for answer in (np.zeros(3), [np.float64(0.0)] * 3, np.array(0.0)):
        verdict = short_answers.check("ex05.inline_2", answer)
        assert verdict.status == answers.NOT_ANSWERED and verdict.message == NOT_A_LITERAL
    assert short_answers.check("ex05.inline_2", [0, 0.0, -0.0]).correct


def test_an_unknown_key_is_an_error_that_lists_the_keys():
    with pytest.raises(KeyError, match="ex05.inline_1"):
        short_answers.check("ex05.inline_9", 1)


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name[:4])
def test_every_inline_question_has_a_form_or_a_rubric_and_every_form_sits_under_its_question(path):
    """A new question without a form or a rubric entry fails here, so does an entry without its question. Each form
    cell is the registry's, right under its question (one question a markdown cell), saved unanswered."""
    cells = _cells(path)
    asked = [(i, _key(path, m.group(1))) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             for m in QUESTION.finditer(_text(c))]  # fmt: skip
    assert asked, f"{path.name}: no inline question"
    keys = [key for _, key in asked]
    assert len(set(keys)) == len(keys) == len({i for i, _ in asked}), f"{path.name}: one question a cell"
    for _, key in asked:
        assert key in short_answers.FORMS or key in RUBRIC, f"{key}: neither a short form nor a rubric entry"
    registered = {k for k in [*short_answers.FORMS, *RUBRIC] if k.startswith(path.name[:4] + ".")}
    assert registered == set(keys), f"{path.name}: registered without a question: {sorted(registered - set(keys))}"
    for i, key in asked:
        if key in short_answers.FORMS:
            form = cells[i + 1]
            assert form["cell_type"] == "code" and _text(form) == short_answers.form_cell(key), key
            shown = "".join("".join(o.get("data", {}).get("text/plain", "")) for o in form["outputs"])
            assert f"{key}: {answers.NOT_ANSWERED}" in shown, f"{key} saved without its verdict"
        if key not in RUBRIC:  # all short: no prose to write
            assert "*Your answer:*" not in _text(cells[i]), key


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name[:4])
def test_each_form_filled_with_its_model_answer_says_correct_in_the_notebook_and_in_the_grade(path):
    """The form's cell as written, its `inline_N = None` replaced by the model answer's text: the verdict the student
    sees (the cell run) and the teacher's (the line read, not run) are the same."""
    for cell in _cells(path):
        for key in re.findall(r'short_answers\.check\("([^"]+)"', _text(cell)):
            name = short_answers.variable(key)
            source = _text(cell).replace(f"{name} = None", f"{name} = {INLINE['SOLUTIONS'][key]!r}")
            *body, last = source.splitlines()
            namespace: dict = {}
            exec("\n".join(body), namespace)  # noqa: S102 - the notebook's own cell, answered
            assert eval(last, namespace).correct, key  # noqa: S307
            assignment = next(n for n in ast.parse(source).body if isinstance(n, ast.Assign))
            assert short_answers.check(key, value(assignment.value)).correct, key


def test_a_solved_copy_has_every_form_answered_and_the_grade_reads_each_as_right(tmp_path):
    """scripts/fill_exercises.py writes the model answers on the form lines, as values the teacher's grade reads."""
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("fill_exercises", ROOT / "scripts" / "fill_exercises.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for path in EXERCISES:
        nb = script.fill(nbformat.read(path, as_version=4), ROOT / "exercises" / "solutions" / f"{path.stem}.py")
        nbformat.write(nb, tmp_path / path.name)
        short = [t for t in written_tests(tmp_path / path.name) if t["name"].endswith("(short answer)")]
        assert all(t["status"] == "PASS" for t in short), (path.name, short)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("(5, 3)", (5, 3)), ("[0, 1.0, -2]", [0, 1.0, -2]), ('"nan"', "nan"), ("4 * 16384**2 * 4", 4294967296),
     ("-1 / 3", -1 / 3), ("(2 * 4 * 16384 * 4, 1)", (524288, 1)), ("[(0, 1), (1, 0)]", [(0, 1), (1, 0)])],
)  # fmt: skip
def test_a_form_line_is_read_as_a_literal_or_arithmetic_on_numbers(text, expected):
    assert value(ast.parse(text, mode="eval").body) == expected


@pytest.mark.parametrize("text", ["np.ones(3) - 1", "x", "len([1])", "[i for i in range(3)]", "10 ** 10 ** 10",
                                  "((2**64)**64)**64", '"a" * 3', "1 / 0", "True + 1"])  # fmt: skip
def test_anything_else_on_a_form_line_is_not_a_literal_and_never_runs(text):
    with pytest.raises(NotALiteral):
        value(ast.parse(text, mode="eval").body)


def _filled(tmp_path: Path, name: str, short: dict[str, str], written: dict[int, str], drop: str = "") -> Path:
    """A copy of an exercise notebook with these form lines (the text after `=`) and written answers, and the form
    cell of ``drop`` deleted."""
    stem = next(p for p in EXERCISES if p.name.startswith(name))
    nb = json.loads(stem.read_text(encoding="utf-8"))
    cells = []
    for cell in nb["cells"]:
        text = _text(cell)
        if drop and f'check("{drop}"' in text:
            continue
        for key, answer in short.items():
            text = text.replace(f"{short_answers.variable(key)} = None", f"{short_answers.variable(key)} = {answer}")
        m = QUESTION.search(text)
        if cell["cell_type"] == "markdown" and m and int(m.group(1)) in written:
            text += "\n" + written[int(m.group(1))]
        cells.append({**cell, "source": text})
    nb["cells"] = cells
    path = tmp_path / "hand_in.ipynb"  # renamed, as a hand-in is: the exercise is read from its title
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_teacher_mode_puts_each_short_and_written_answer_in_results_json(tmp_path, monkeypatch, capsys):
    short = {"ex12.inline_1": "(4, 10)", "ex12.inline_2": "2e-6", "ex12.inline_3": "np.zeros(4)"}
    written = {1: "One of the ten writes to column 4 is kept.", 2: "tanh' is flat there."}
    path = _filled(tmp_path, "ex12", short, written)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--submit", str(path), "--score", "out.json"]) == 0
    results = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    tests = {t["name"]: t for t in results["tests"]}
    inline = [name for name in tests if name.startswith("ex12.")]
    assert inline == ["ex12.inline_1 (short answer)", "ex12.inline_1 (written)", "ex12.inline_2 (short answer)",
                      "ex12.inline_2 (written)", "ex12.inline_3 (short answer)"]  # fmt: skip
    right, wrong, code = (tests[f"ex12.inline_{n} (short answer)"] for n in (1, 2, 3))
    assert (right["score"], right["max_score"], right["status"]) == (1.0, 1.0, "passed")
    assert (wrong["score"], wrong["status"]) == (0.0, "failed") and "is wrong (yours: 2e-06)" in wrong["output"]
    assert code["score"] == 0.0 and NOT_A_LITERAL in code["output"]  # np.zeros(4) is right, but not written out
    for n in (1, 2):
        manual = tests[f"ex12.inline_{n} (written)"]
        assert (manual["score"], manual["max_score"]) == (0.0, RUBRIC[f"ex12.inline_{n}"].points)
        assert "status" not in manual and manual["tags"] == [MANUAL_TAG] and manual["extra_data"]["manual"] is True
        assert manual["extra_data"]["answer"] == written[n] and written[n] in manual["output"]
        assert RUBRIC[f"ex12.inline_{n}"].full[0] in manual["output"] and manual["visibility"] == "after_published"
    assert results["score"] == sum(t["score"] for t in results["tests"])
    points = RUBRIC["ex12.inline_1"].points + RUBRIC["ex12.inline_2"].points
    assert f"{points:g} points of written answers await grading by hand" in results["output"]
    assert "warning" not in results["output"]  # the forms' import is no library import: the child has a stand-in
    capsys.readouterr()


def test_a_missing_or_broken_form_grades_as_not_answered_without_a_traceback(tmp_path):
    path = _filled(tmp_path, "ex14", {"ex14.inline_1": "['dq',", "ex14.inline_3": "(1, 2, 5, 3)"}, {},
                   drop="ex14.inline_2")  # fmt: skip
    tests = {t["name"]: t for t in written_tests(path)}
    assert tests["ex14.inline_1 (short answer)"]["status"] == "not answered"
    assert "does not parse" in tests["ex14.inline_1 (short answer)"]["detail"]
    assert tests["ex14.inline_2 (short answer)"]["detail"] == "the form's cell is missing"
    assert tests["ex14.inline_3 (short answer)"]["status"] == "PASS"
    grade = grade_file(path)  # the broken cell stops the child: the functions score 0, the inline answers still count
    assert "syntax error" in grade.error and grade.points == 1.0
    assert all(t["score"] == 0 for t in grade.tests if not t["name"].startswith("ex14.inline_3"))


def test_a_written_answer_is_the_text_after_your_answer_and_the_cells_added_under_it():
    cells = [
        {"cell_type": "markdown", "source": "**Inline question 1.** Why?\n\n*Your answer:* because"},
        {"cell_type": "markdown", "source": "of the shift."},
        {"cell_type": "code", "source": "x = 1"},
        {"cell_type": "markdown", "source": "not an answer"},
        {"cell_type": "markdown", "source": "**Inline question 2.** And?\n\n*Your answer:*"},
        {"cell_type": "markdown", "source": "## 3. The next section"},
    ]
    assert written_answers(cells) == {1: "because\n\nof the shift.", 2: ""}


def test_a_python_file_or_a_notebook_of_no_exercise_has_no_inline_tests(tmp_path):
    (tmp_path / "a.py").write_text("inline_1 = 3\n")
    (tmp_path / "b.ipynb").write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": "# Notes"}]}))
    (tmp_path / "c.ipynb").write_text("not json")
    for name in ("a.py", "b.ipynb", "c.ipynb"):
        assert written_tests(tmp_path / name) == [], name


def test_every_rubric_entry_has_facts_and_wrong_answers_within_its_points():
    for key, rubric in RUBRIC.items():
        assert rubric.asks and rubric.full and rubric.points > 0, key
        assert all(0 <= earns < rubric.points for _, earns in rubric.wrong), key


def test_the_rubric_page_of_the_docs_is_the_registry():
    """docs/rubric.md is generated: `python -m mha_numpy.checker.rubric > docs/rubric.md`."""
    assert (ROOT / "docs" / "rubric.md").read_text(encoding="utf-8") == markdown()
