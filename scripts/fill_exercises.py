"""Fill an exercise notebook's blanks with the solutions (for teachers, and for the tests).

    python scripts/fill_exercises.py exercises/ex05_softmax.ipynb -o solved.ipynb

Every code cell that contains ``raise NotImplementedError`` is replaced by the functions it defines
(``def NAME(``), taken from ``exercises/solutions/<notebook name>.py`` together with that file's imports; every
inline question's form (``inline_N = None`` above ``short_answers.check("exNN.inline_N", inline_N)``) gets its
model answer from ``exercises/solutions/inline.py``, written out as a value.
"""

from __future__ import annotations

import argparse
import ast
import re
import runpy
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "exercises" / "solutions"


def solution_sources(path: Path) -> tuple[str, dict[str, str]]:
    """(the file's import lines, {function name: its source}) of a solutions file."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    imports = [ast.get_source_segment(text, n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    funcs = {n.name: ast.get_source_segment(text, n) for n in tree.body if isinstance(n, ast.FunctionDef)}
    return "\n".join(i for i in imports if not i.startswith("from __future__")), funcs


def fill(nb: nbformat.NotebookNode, solutions: Path) -> nbformat.NotebookNode:
    """Replace, in place, every blank cell of ``nb`` by the solutions of the functions it defines; return nb."""
    imports, funcs = solution_sources(solutions)
    for cell in nb.cells:
        if cell.cell_type != "code" or "raise NotImplementedError" not in cell.source:
            continue
        names = re.findall(r"^def (\w+)\(", cell.source, flags=re.M)
        missing = [n for n in names if n not in funcs]
        if missing:
            raise KeyError(f"{solutions.name} has no solution for {missing}")
        cell.source = imports + "\n\n\n" + "\n\n\n".join(funcs[n] for n in names)
    inline = solutions.parent / "inline.py"
    answers = runpy.run_path(str(inline))["SOLUTIONS"] if inline.is_file() else {}
    for cell in nb.cells:
        for key, name in re.findall(r'short_answers\.check\("([^"]+)", (\w+)\)', cell.source):
            if cell.cell_type == "code" and key in answers:
                cell.source = re.sub(rf"^{name} = None$", f"{name} = {answers[key]!r}", cell.source, flags=re.M)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True, help="where to write the solved notebook")
    args = parser.parse_args(argv)
    nb = nbformat.read(args.notebook, as_version=4)
    nbformat.write(fill(nb, SOLUTIONS / f"{args.notebook.stem}.py"), args.output)
    print(f"{args.output}: the blanks of {args.notebook.name} filled with the solutions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
