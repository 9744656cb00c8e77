"""The inline questions of a handed-in exercise notebook, read for the teacher's grade without running any of it.

    tests = written_tests("hand_in.ipynb")   # one test per short answer and per written answer

The notebook's JSON is read, nothing of it runs: a short answer is the value written on its form's line
(``inline_1 = (5, 3)  # ...`` above ``short_answers.check("ex01.inline_1", inline_1)``), read by
``ast.literal_eval`` or, for arithmetic on numbers (``4 * 16384**2 * 4``), by ``value`` below, which knows numbers,
strings, tuples, lists and + − × / // % ** and nothing else. A name, a call or anything else is "not a literal"
and grades as not answered, as a missing form or ``None`` does. A written answer is the text after "*Your
answer:*" in the question's markdown cell (and any markdown cell the student added right under it).

Each short answer is a test worth its form's points (``checker.short_answers``), its verdict's message as the
output; each written answer a test at 0 of its rubric's points (``checker.rubric``), the student's text and the
rubric as its output, ``manual`` set: the teacher grades it (``Grade.results`` marks it so in results.json).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from pathlib import Path

from . import short_answers
from .answers import CORRECT, NOT_ANSWERED
from .load import CannotRun, code_cells
from .rubric import RUBRIC
from .short_answers import NOT_A_LITERAL

QUESTION = re.compile(r"\*\*Inline question (\d+)\.\*\*")
YOUR_ANSWER = "*Your answer:*"
TITLE = re.compile(r"^# Exercise (\d+)\b", re.MULTILINE)
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}  # fmt: skip
MANUAL = "to grade by hand"  # a written answer's status in the grade
MAX_EXPONENT = 64  # 16384**2 is an answer; 10**10**10 or ((2**64)**64)**64 is not one to compute


class NotALiteral(ValueError):
    """The form's line holds something other than a value written out."""


def value(node: ast.expr):
    """The value of a form's right-hand side: a literal, or arithmetic on numbers; NotALiteral otherwise."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Tuple | ast.List):
        items = [value(item) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _number(value(node.operand))
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _number(value(node.left)), _number(value(node.right))
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or abs(left) > 2**MAX_EXPONENT):
            raise NotALiteral(f"{left} ** {right} is not an answer to compute: write the value")
        try:
            return _ARITHMETIC[type(node.op)](left, right)
        except (ArithmeticError, ValueError) as e:
            raise NotALiteral(f"the arithmetic fails: {e}") from None
    raise NotALiteral(NOT_A_LITERAL)


def _number(x):
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise NotALiteral(NOT_A_LITERAL)
    return x


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(map(str, source)) if isinstance(source, list) else str(source)


def _is_check(node: ast.AST) -> tuple[str, str] | None:
    """(key, name) when ``node`` is the form's ``short_answers.check("key", name)``."""
    call = node.value if isinstance(node, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "check"):
        return None
    args = call.args
    if len(args) == 2 and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        if isinstance(args[1], ast.Name) and args[0].value in short_answers.FORMS:
            return args[0].value, args[1].id
    return None


def form_answers(sources: list[str]) -> dict[str, object]:
    """{key: the value on its form's line, or a NotALiteral} for every form found in the code cells' ``sources``
    (``load.code_cells``: IPython's lines made ``pass``): the last top-level assignment to the form's name before
    its check, in the check's cell."""
    found: dict[str, object] = {}
    for source in sources:
        if "short_answers" not in source:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError as e:
            keys = re.findall(r"check\(\s*[\"'](ex\d+\.inline_\d+)[\"']", source)
            found.update({k: NotALiteral(f"the form's cell does not parse: {e.msg}") for k in keys})
            continue
        assigned: dict[str, ast.expr] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned[target.id] = node.value
            elif (check := _is_check(node)) is not None:
                key, name = check
                if name not in assigned:
                    found[key] = NotALiteral(f"no line `{name} = ...` above the check")
                    continue
                try:
                    found[key] = value(assigned[name])
                except NotALiteral as e:
                    found[key] = e
    return found


def written_answers(cells: list[dict]) -> dict[int, str]:
    """{question number: the student's text after "*Your answer:*"} of every inline question in the markdown cells,
    with any markdown cells the student added right under the question (up to a code cell, a heading or the next
    question)."""
    found: dict[int, str] = {}
    last = None
    for cell in cells:
        text = _source(cell)
        if cell.get("cell_type") != "markdown":
            last = None
            continue
        parts = QUESTION.split(text)  # [before, n1, text1, n2, text2, ...]
        if len(parts) == 1:
            if last is not None and not text.lstrip().startswith("#"):
                found[last] = (found[last] + "\n\n" + text.strip()).strip()
            else:
                last = None
            continue
        for number, body in zip(parts[1::2], parts[2::2], strict=True):
            _, _, answer = body.partition(YOUR_ANSWER)
            found[int(number)] = answer.strip()
            last = int(number)
    return found


def exercise_number(cells: list[dict], forms: dict[str, object], path: Path) -> int | None:
    """The exercise a notebook is: its title "# Exercise N", else its forms' keys, else its file name (exNN_...)."""
    for cell in cells:
        if cell.get("cell_type") == "markdown" and (m := TITLE.search(_source(cell))):
            return int(m.group(1))
    keys = list(forms)
    if keys:
        return int(next(iter(keys))[2:4])
    m = re.match(r"ex(\d+)_", path.name)
    return int(m.group(1)) if m else None


def _order(key: str) -> int:
    return int(key.rsplit("_", 1)[1])


def written_tests(path) -> list[dict]:
    """The tests of the inline questions of the exercise notebook at ``path`` (none for a .py file or a notebook
    of no exercise): for each question of the exercise, its short answer (graded) and its written answer (at 0,
    ``manual``), in the order of the questions. An unreadable notebook: no tests (the grade says why elsewhere)."""
    path = Path(path)
    if path.suffix != ".ipynb":
        return []
    try:
        cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if isinstance(c, dict)]
        forms = form_answers([source for _, source in code_cells(path)])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, CannotRun):
        return []
    number = exercise_number(cells, forms, path)
    if number is None:
        return []
    prefix = f"ex{number:02d}."
    keys = sorted({k for k in [*short_answers.FORMS, *RUBRIC] if k.startswith(prefix)}, key=_order)
    texts = written_answers(cells)
    tests = []
    for key in keys:
        if key in short_answers.FORMS:
            tests.append(_short_test(key, forms.get(key, NotALiteral("the form's cell is missing"))))
        if key in RUBRIC:
            rubric = RUBRIC[key]
            answer = texts.get(_order(key), "")
            detail = f"the student's answer:\n{answer or '(no answer)'}\n\n{rubric.text()}"
            tests.append({"name": f"{key} (written)", "score": 0.0, "max_score": rubric.points, "status": MANUAL,
                          "detail": detail, "manual": True, "answer": answer, "rubric": rubric.text()})  # fmt: skip
    return tests


def _short_test(key: str, answer) -> dict:
    worth = short_answers.FORMS[key].points
    if isinstance(answer, NotALiteral):
        status, detail = "not answered", str(answer)
    else:
        try:
            verdict = short_answers.check(key, answer)
        except Exception as e:  # noqa: BLE001 - a value no judge foresaw: wrong, and the grading goes on
            status, detail = "FAIL", f"the answer cannot be judged ({type(e).__name__}: {e})"
        else:
            status = {CORRECT: "PASS", NOT_ANSWERED: "not answered"}.get(verdict.status, "FAIL")
            detail = verdict.message
    score = worth if status == "PASS" else 0.0
    return {"name": f"{key} (short answer)", "score": score, "max_score": worth, "status": status, "detail": detail}
