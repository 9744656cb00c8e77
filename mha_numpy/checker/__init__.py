"""Check a student's forward/backward pairs, and say which classic mistake a wrong gradient matches.

    python -m mha_numpy check my_attention.py

    from mha_numpy.checker import check_file, check_namespace
    print(check_file("my_attention.py"))       # a CheckReport: one line per function
    print(check_namespace(globals()))          # in a notebook: the functions defined so far

The student's file defines any of the pairs under their usual names (``softmax_forward``,
``softmax_backward``, ``linear_backward``, ``attention_scores_backward``, ``layer_norm_backward``,
``self_attention_backward``, ``online_softmax_update``, ...; see ``cases.PAIRS``). Each function found
is compared with the reference pairs of ``mha_numpy.functional`` / ``mha_numpy.models.layers`` on
random float64 inputs of several shapes (batch > 1, Lq != Lk, masks, a fully masked row), and every
backward with central differences against a random upstream gradient. A function that raises
``NotImplementedError`` is "not done yet". The known bugs live in ``bugs``.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import bugs, cases
from .runner import NOT_DONE, Row
from .runner import check_namespace as _check_rows


class StudentFileError(Exception):
    """The file cannot be checked at all (missing, a syntax error, fails on import): one line for the user."""


@dataclass
class CheckReport:
    """One Row per function found. ``passed``: at least one function, and every one PASS."""

    rows: list[Row] = field(default_factory=list)
    source: str = ""
    ignored: list[str] = field(default_factory=list)  # NAME_forward/_backward of no pair the checker knows

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.status == "PASS" for r in self.rows)

    def __getitem__(self, function: str) -> Row:
        for r in self.rows:
            if r.function == function:
                return r
        raise KeyError(function)

    def __str__(self) -> str:
        if not self.rows:
            names = ", ".join(f"{p.name}_forward/_backward" for p in cases.PAIRS)
            return (
                f"{self.source or 'no functions'}: none of the known functions found ({names}, online_softmax_update)"
            )
        width = max(len(r.function) for r in self.rows)
        lines = []
        for r in self.rows:
            lines.append(f"{r.function:<{width}}  {r.status}{'  ' + r.detail if r.detail else ''}")
            if r.bug:
                lines.append(f"{'':<{width}}  diagnosis: {r.diagnosis}")
        done = sum(r.status == "PASS" for r in self.rows)
        lines.append(f"{done} of {len(self.rows)} functions pass")
        if self.ignored:
            lines.append(f"not checked (no pair of that name is known): {', '.join(self.ignored)}")
        return "\n".join(lines)


def check_namespace(namespace: dict, only=None, source: str = "") -> CheckReport:
    """Check the functions a dict (``globals()``, a module's ``vars``) defines; ``only``: pair names to look at."""
    known = {f"{p.name}_{side}" for p in cases.PAIRS for side in ("forward", "backward")}
    ignored = [
        name
        for name, value in namespace.items()
        if callable(value) and name.endswith(("_forward", "_backward")) and name not in known and only is None
    ]
    return CheckReport(_check_rows(namespace, only), source, ignored)


def load_student(path) -> dict:
    """Execute the student's file in a fresh module and return its namespace; StudentFileError when it cannot."""
    path = Path(path)
    if not path.is_file():
        raise StudentFileError(f"no such file: {path}")
    try:
        source = path.read_text(encoding="utf-8")
        compile(source, str(path), "exec")
    except SyntaxError as e:
        raise StudentFileError(f"{path}, line {e.lineno}: syntax error: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise StudentFileError(f"cannot read {path}: {e}") from None
    spec = importlib.util.spec_from_file_location(f"_student_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))  # the student's own helper modules next to the file
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any error while importing the student's file is one line
        raise StudentFileError(f"{path} failed on import: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return vars(module)


def check_file(path, only=None) -> CheckReport:
    """Check every known function the file at ``path`` defines (StudentFileError if it cannot be loaded)."""
    return check_namespace(load_student(path), only, source=str(path))


__all__ = ["NOT_DONE", "CheckReport", "Row", "StudentFileError", "bugs", "cases", "check_file", "check_namespace"]
