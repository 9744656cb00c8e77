"""The exercise notebooks run in both modes: blank (every function "not done yet", no crash) and filled
with the solutions (every function PASS). Executed like the notebooks, through scripts/run_notebooks.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
BUDGET_SECONDS = 60.0

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed: pip install -r requirements-dev.txt")
pytest.importorskip("nbclient", reason="nbclient is not installed: pip install -r requirements-dev.txt")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checker_output(nb) -> str:
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert "check_namespace" in last.source, "an exercise notebook ends with the checker's cell"
    return "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith(" ") and "functions pass" not in line]


def test_every_exercise_has_a_solutions_file():
    assert len(EXERCISES) >= 8
    for path in EXERCISES:
        assert (ROOT / "exercises" / "solutions" / f"{path.stem}.py").is_file(), path.name


def _blanks(nb) -> set[str]:
    """The functions the notebook leaves to the student: those defined in a cell that raises NotImplementedError."""
    cells = [c.source for c in nb.cells if c.cell_type == "code" and "raise NotImplementedError" in c.source]
    return {name for source in cells for name in re.findall(r"^def (\w+)\(", source, flags=re.M)}


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_blank_notebook_reports_not_done_yet(path: Path, tmp_path: Path):
    """Every blank is "not done yet"; a function the notebook gives (exercise 14's forward) passes."""
    nb = nbformat.read(path, as_version=4)
    blanks = _blanks(nb)
    assert blanks, "no blanks"
    _script("run_notebooks").execute_notebook(nb, tmp_path, timeout=BUDGET_SECONDS)
    rows = _rows(_checker_output(nb))
    assert rows and any(row.split()[0] in blanks for row in rows), rows
    for row in rows:
        assert row.rstrip().endswith("not done yet" if row.split()[0] in blanks else "PASS"), rows


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_solved_notebook_passes(path: Path, tmp_path: Path):
    nb = _script("fill_exercises").fill(
        nbformat.read(path, as_version=4), ROOT / "exercises" / "solutions" / f"{path.stem}.py"
    )
    assert not any("raise NotImplementedError" in c.source for c in nb.cells if c.cell_type == "code")
    _script("run_notebooks").execute_notebook(nb, tmp_path, timeout=BUDGET_SECONDS)
    rows = _rows(_checker_output(nb))
    assert rows and all(row.split()[1] == "PASS" for row in rows), rows
