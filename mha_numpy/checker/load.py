"""Which files the checker takes, and running one: a Python file, or a notebook's code cells in order.

``check_path`` refuses what is not a checkable file (missing, a directory, not .py or .ipynb) with ``BadPath``,
before anything runs; ``load_student`` runs the file in a fresh module (in the child process of
``checker.process``) and returns its namespace, or raises ``CannotRun`` (a syntax error, an error, ``sys.exit``
or ``KeyboardInterrupt`` while importing it). In a notebook, IPython's ``%magic`` and ``!shell`` lines are
skipped, and so is the checker's own cell (one that calls ``check_namespace`` or ``check_file``): the whole
file is checked.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

SUFFIXES = (".py", ".ipynb")
_MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)
_CHECKER_CELL = re.compile(r"\bcheck_(namespace|file)\s*\(")


class StudentFileError(Exception):
    """The file cannot be checked at all; the message is one line for the user."""


class BadPath(StudentFileError):
    """Not a file the checker takes (missing, a directory, not .py or .ipynb): a usage error."""


class CannotRun(StudentFileError):
    """The file could not be run: a syntax error, an error or an exit while importing it, a time-out."""


def check_path(path) -> Path:
    """``path`` as a Path if it is a .py or .ipynb file; BadPath with one line otherwise."""
    path = Path(path)
    if path.is_dir():
        raise BadPath(f"{path} is a directory: give one student file (.py, or an exercise notebook .ipynb)")
    if not path.exists():
        raise BadPath(f"no such file: {path}")
    if path.suffix not in SUFFIXES:
        raise BadPath(f"{path}: not a Python file or a notebook (the checker takes .py and .ipynb files)")
    return path


def code_cells(path: Path, shown: str | None = None) -> list[tuple[str, str]]:
    """(filename for error messages, source) of each piece of code to run, in order; CannotRun if unreadable.
    ``shown``: how messages name the file (default: ``path``)."""
    shown = shown or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CannotRun(f"cannot read {shown}: {e}") from None
    if path.suffix != ".ipynb":
        return [(shown, text)]
    try:
        cells = json.loads(text)["cells"]
    except (ValueError, KeyError, TypeError) as e:
        raise CannotRun(f"{shown} is not a notebook (no cells in its JSON: {e})") from None
    if not isinstance(cells, list) or not all(isinstance(cell, dict) for cell in cells):
        raise CannotRun(f"{shown} is not a notebook (its cells are not a list of cell objects)")
    out = []
    for i, cell in enumerate(cells, start=1):
        source = cell.get("source", "")
        source = "".join(map(str, source)) if isinstance(source, list) else str(source)
        if cell.get("cell_type") != "code" or _CHECKER_CELL.search(source):
            continue
        out.append((f"{shown} (cell {i})", _MAGIC.sub(r"\1pass  # an IPython line, skipped", source)))
    return out


def load_student(path, shown: str | None = None) -> dict:
    """Run the file at ``path`` in a fresh module and return its namespace (CannotRun when it cannot).
    ``shown``: how messages name the file (default: ``path``)."""
    path = check_path(path).resolve()
    compiled = []
    for filename, source in code_cells(path, shown):
        try:
            compiled.append((filename, compile(source, filename, "exec")))
        except SyntaxError as e:
            raise CannotRun(f"{filename}, line {e.lineno}: syntax error: {e.msg}") from None
    name = "_student_" + re.sub(r"\W", "_", path.stem)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=str(path)))
    module.__file__ = str(path)
    sys.modules[name] = module  # a dataclass in the file looks its module up there
    sys.path.insert(0, str(path.parent))  # the student's own helper modules next to the file
    try:
        for filename, code in compiled:
            try:
                exec(code, vars(module))  # noqa: S102 - running the student's file is the point
            except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: one line each
                raise CannotRun(f"{filename} failed on import: {_describe(e)}") from None
    finally:
        sys.path.remove(str(path.parent))
    return vars(module)


def _describe(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r})"
    message = (str(e).splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {message}" if message else type(e).__name__
