"""The exercises at the end of the notebooks (mha_numpy.checker.answers): each check accepts the model answer,
rejects a typical wrong one, says "not answered yet" for None; every notebook ends with exercises whose keys exist,
committed unanswered, and its saved output says so.

The model answers are in exercises/solutions/notebooks.py (derived by hand, not taken from the checks).
"""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.checker import answers

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = runpy.run_path(str(ROOT / "exercises" / "solutions" / "notebooks.py"))
NOTEBOOKS = [ROOT / "notebooks" / f"{n}" for n in sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))]
GIVEN = NOTEBOOKS  # every notebook carries exercises
CHECK_CALL = re.compile(r"answers\.check\(\"([0-9]{2}\.\w+)\",\s*(\w+)\)")


def _code_cells(path: Path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_every_question_has_a_solution_and_a_mistake():
    assert set(SOLUTIONS["SOLUTIONS"]) == set(answers.QUESTIONS) == set(SOLUTIONS["MISTAKES"])


@pytest.mark.parametrize("key", sorted(answers.QUESTIONS))
def test_the_check_accepts_the_solution_and_rejects_a_mistake(key):
    assert answers.check(key, None).status == answers.NOT_ANSWERED
    right = answers.check(key, SOLUTIONS["SOLUTIONS"][key])
    assert right.correct, right
    wrong = answers.check(key, SOLUTIONS["MISTAKES"][key])
    assert wrong.status == answers.WRONG and wrong.message, wrong


def _four_digits(answer):
    return np.vectorize(lambda x: float(f"{x:.4g}"))(np.asarray(answer, dtype=np.float64))


FLOAT_KEYS = [k for k, v in sorted(SOLUTIONS["SOLUTIONS"].items()) if np.asarray(v).dtype.kind == "f"]


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_a_hand_answer_written_with_four_significant_digits_is_right(key):
    """A student works these out on paper: an honest 4-digit answer must not be rejected by a 1e-6 tolerance."""
    four = answers.check(key, _four_digits(SOLUTIONS["SOLUTIONS"][key]))
    assert four.correct, four


def test_gelu_slope_built_from_the_notebooks_own_phi_is_right_and_a_three_digit_or_wrong_one_is_not():
    phi1 = 0.241971  # the normal density at 1, to the 6 digits the notebook gives Φ(1) ≈ 0.841345
    assert answers.check("08.gelu_slope", [0.5, 0.841345 + 1.0 * phi1]).correct
    assert answers.check("08.gelu_slope", [0.5, 1.083]).correct
    assert not answers.check("08.gelu_slope", [0.5, 1.08]).correct  # 3 digits: off by 3e-3
    assert not answers.check("08.gelu_slope", [0.5, 0.8413]).correct  # Φ(1) alone: the x φ(x) term forgotten
    assert not answers.check("08.gelu_slope", [0.5, 1.085]).correct  # off in the 4th digit


def test_a_wrong_answer_says_what_is_wrong_without_the_expected_value():
    shape = answers.check("03.softmax_jacobian", [0.1, 0.2, 0.7])
    assert "shape (3,)" in shape.message and "(3, 3)" in shape.message
    diagonal = answers.check("03.softmax_jacobian", SOLUTIONS["MISTAKES"]["03.softmax_jacobian"])
    assert "entry [0, 1]" in diagonal.message and "off-diagonal" in diagonal.message
    assert f"{SOLUTIONS['SOLUTIONS']['03.softmax_jacobian'][0, 1]:.6g}" not in diagonal.message
    assert "not a number" not in answers.check("05.score_bytes", "a lot").message  # exact: compared, not parsed
    assert "got str" in answers.check("01.scores", "a lot").message
    future = answers.check("02.causal_mask", SOLUTIONS["MISTAKES"]["02.causal_mask"])
    assert "entry [0, 1] is wrong (yours: True)" in future.message
    assert "one of" in answers.check("10.blind_check", [1, 2]).message


def test_a_nan_is_never_right():
    nan = SOLUTIONS["SOLUTIONS"]["02.masked_rows"].copy()
    nan[1] = float("nan")
    assert answers.check("02.masked_rows", nan).status == answers.WRONG


def test_the_function_exercise_is_checked_by_the_checker():
    wrong = answers.check("10.dropout_backward", SOLUTIONS["MISTAKES"]["10.dropout_backward"])
    assert "Dropout backward without the 1/(1-p)" in wrong.message  # the checker's diagnosis, by name


def test_an_unknown_key_is_an_error_that_lists_the_keys():
    with pytest.raises(KeyError, match="03.softmax_jacobian"):
        answers.check("03.no_such_question", 1)


@pytest.mark.parametrize("path", GIVEN, ids=lambda p: p.name[:2])
def test_each_notebook_ends_with_unanswered_exercises(path: Path):
    """2-4 checked exercises after the last section, each `name = None` then answers.check(key, name), whose saved
    output says "not answered yet"."""
    calls = [(cell, m) for cell in _code_cells(path) for m in CHECK_CALL.finditer(_text(cell))]
    keys = [m.group(1) for _, m in calls]
    assert 2 <= len(keys) <= 4, f"{path.name}: {len(keys)} exercises"
    assert all(k.startswith(path.name[:2] + ".") and k in answers.QUESTIONS for k in keys), keys
    for cell, m in calls:
        assert re.search(rf"^{m.group(2)} = None\b", _text(cell), re.M), f"{path.name}: {m.group(1)} is answered"
        shown = "".join(
            "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in cell["outputs"]
        )
        assert f"{m.group(1)}: {answers.NOT_ANSWERED}" in shown, f"{path.name}: {m.group(1)} saved without its verdict"


def test_the_fine_tuning_figure_counts_layers_and_heads_from_0():
    """Notebook 08's figure said "layer 3, head 5" for layers[2] and head 4, where every other view counts from 0."""
    import numpy as np

    from mha_numpy.viz.finetune import plot_attention_before_after

    before = np.full((3, 6, 4, 4), 0.25)
    after = before.copy()
    after[2, 4, :, 1] = 1.0  # layer 2, head 4 moves its weight onto token 1
    fig = plot_attention_before_after(before, after, ["a", "b", "c", "d"], "b")
    assert fig._suptitle.get_text().startswith("layer 2, head 4:")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_no_notebook_reads_the_solutions(path: Path):
    """A student's copy has no exercises/solutions/ (issue 24: notebook 10 cell 15 read two solution files)."""
    for cell in _code_cells(path):
        code = "\n".join(line.split("#")[0] for line in _text(cell).splitlines())  # comments may name it
        assert "solutions" not in code and "run_path" not in code, f"{path.name} reads a file of the solutions"


@pytest.mark.parametrize("path", GIVEN, ids=lambda p: p.name[:2])
def test_each_exercise_cell_filled_with_its_solution_says_correct(path: Path):
    """The cells as written, in order in one namespace, with each `name = None` line replaced by the model answer:
    the verdict each then shows."""
    namespace = {}
    for cell in _code_cells(path):
        for m in CHECK_CALL.finditer(_text(cell)):
            key, name = m.group(1), m.group(2)
            *body, last = _text(cell).rstrip().splitlines()
            filled = [f"{name} = __solution__" if re.match(rf"{name} = None\b", line) else line for line in body]
            namespace["__solution__"] = SOLUTIONS["SOLUTIONS"][key]
            exec("\n".join(filled), namespace)  # the notebook's own cell, answered
            verdict = eval(last, namespace)
            assert verdict.correct, f"{path.name}: {verdict}"


def _assigned(cells) -> set[str]:
    """The names the code cells bind at top level (assignments, imports, defs), IPython's %/! lines left out."""
    import ast

    names: set[str] = set()
    for cell in cells:
        code = "\n".join(line for line in _text(cell).splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return names


@pytest.mark.parametrize("path", GIVEN, ids=lambda p: p.name[:2])
def test_the_exercise_cells_do_not_rebind_the_notebooks_names(path: Path):
    """An exercise's `name = None` must not overwrite what a section made (notebook 01's `scores = None` did: a
    section cell run again after it read None)."""
    cells = json.loads(path.read_text())["cells"]
    start = next(i for i, c in enumerate(cells) if c["cell_type"] == "code" and CHECK_CALL.search(_text(c)))
    before = _assigned([c for c in cells[:start] if c["cell_type"] == "code"])
    after = _assigned([c for c in cells[start:] if c["cell_type"] == "code"]) - {"answers"}
    assert not before & after, f"{path.name}: the exercises rebind {sorted(before & after)}"


@pytest.mark.parametrize("number", [9, 10, 11, 12, 13, 14])
def test_the_exercises_beyond_bert_are_linked_from_a_notebook(number: int):
    """A reader of the notebook that teaches the topic finds the exercise that asks for it."""
    (exercise,) = (ROOT / "exercises").glob(f"ex{number:02d}_*.ipynb")
    linking = [p.name for p in NOTEBOOKS if f"exercises/{exercise.name}" in p.read_text()]
    assert linking, f"no notebook links {exercise.name}"
