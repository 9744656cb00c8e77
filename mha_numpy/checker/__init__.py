"""Check a student's forward/backward pairs, and say which classic mistake a wrong gradient matches.

    python -m mha_numpy check my_attention.py        # or the exercise notebook itself, ex05_softmax.ipynb

    from mha_numpy.checker import check_file, check_namespace
    print(check_file("my_attention.py"))       # a CheckReport: one line per function
    print(check_namespace(globals()))          # in a notebook: the functions defined so far

The student's file defines any of the pairs under their usual names (``softmax_forward``,
``softmax_backward``, ``linear_backward``, ``attention_scores_backward``, ``layer_norm_backward``,
``self_attention_backward``, ``online_softmax_update``, ...; see ``cases.PAIRS``). Each function found
is compared with the reference pairs of the registry (``mha_numpy.pairs``) on random float64 inputs of
several shapes (batch > 1, Lq != Lk, masks, a fully masked row), and every backward with central
differences against a random upstream gradient. A function that raises ``NotImplementedError`` is "not done
yet"; one that changes its arguments in place FAILs. The known bugs live in ``bugs``.

``check_file`` runs the file in a child process with a time limit (``checker.process``); ``check_namespace``
calls the functions in this process (a notebook), with the same copies and mutation checks and no time limit.
A file cannot use the library in its child process (``checker.guard``: what it imports of it raises when called,
but stand-ins for what the exercises' cells use); a notebook can, so ``grading.grade_namespace`` scores the
library's own functions 0 and warns.
Neither is a sandbox: the student's code can do anything the user running the checker can (docs/course.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import bugs, cases
from .gpt_stages import STAGES, TRAININGS, check_gpt
from .load import BadPath, CannotRun, StudentFileError, check_path, load_student
from .process import DEFAULT_TIMEOUT, ChildProcess
from .runner import CAPSTONES, NOT_DONE, Row, check_student, plan
from .student import InProcess
from .systems import SIZE as SYSTEMS_SIZE
from .systems import check_systems

SKIPPED = (
    "exercise 13's systems stage skipped (--no-systems): the pair's memory and time targets were not measured, "
    "not passed"
)
SKIPPED_LOSS = "exercise 15's stage 4 skipped (--training off): the GPT was not trained, its loss target not passed"


@dataclass
class CheckReport:
    """One Row per function found. ``passed``: at least one function, and every one PASS.

    ``output``: what the student's file printed while it was checked (a file only; never part of the report).
    """

    rows: list[Row] = field(default_factory=list)
    source: str = ""
    ignored: list[str] = field(default_factory=list)  # NAME_forward/_backward of no pair the checker knows
    planned: list[str] = field(default_factory=list)  # the functions to check, in order (sets the column width)
    output: str = ""
    refused: list[str] = field(default_factory=list)  # the library's modules a file imported (checker.guard)
    unit: str = "functions"  # what a row is: a function, or one of exercise 15's stages
    skipped: str = ""  # a stage asked for and not run (13's systems: --no-systems; 15's loss: --training off)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.status == "PASS" for r in self.rows)

    def __getitem__(self, function: str) -> Row:
        for r in self.rows:
            if r.function == function:
                return r
        raise KeyError(function)

    def row_text(self, r: Row) -> str:
        """The row's line, its relation line when the wrong gradient is the right one bent a known way
        (``checker.relations``), and its diagnosis line when a known bug matched."""
        width = max(len(f) for f in self.planned or [x.function for x in self.rows] or [r.function])
        line = f"{r.function:<{width}}  {r.status}{'  ' + r.detail if r.detail else ''}"
        line += f"\n{'':<{width}}  relation: {r.relation}" if r.relation else ""
        return line + (f"\n{'':<{width}}  diagnosis: {r.diagnosis}" if r.bug else "")

    def summary(self) -> str:
        """The lines after the rows (or the one line saying that no known function was found)."""
        if not self.rows:
            names = ", ".join(f"{p.name}_forward/_backward" for p in cases.PAIRS)
            return (
                f"{self.source or 'no functions'}: none of the known functions found ({names}, {cases.ONLINE_SOFTMAX})"
            )
        done = sum(r.status == "PASS" for r in self.rows)
        lines = [f"{done} of {len(self.rows)} {self.unit} pass"]
        if self.skipped:
            lines.append(self.skipped)
        if self.ignored:
            lines.append(f"not checked (no pair of that name is known): {', '.join(self.ignored)}")
        if self.refused:
            lines.append(f"the file imports {', '.join(self.refused)}: refused in the checker's process (the library's "
                         "pairs hold the answers), a function that uses it FAILs")  # fmt: skip
        return "\n".join(lines)

    def __str__(self) -> str:
        return "\n".join([*(self.row_text(r) for r in self.rows), self.summary()])


def _ignored(names, only) -> list[str]:
    known = {f"{p.name}_{side}" for p in cases.PAIRS for side in ("forward", "backward")}
    known |= {c.function for c in CAPSTONES}
    return [n for n in names if n.endswith(("_forward", "_backward")) and n not in known] if only is None else []


def _check(
    student,
    only,
    source: str,
    echo: Callable[[str], None] | None,
    systems_size: int | None = None,
    skipped: str = "",
    gpt=None,
) -> CheckReport:
    report = CheckReport(source=source, ignored=_ignored(student.names, only), planned=plan(student.names, only))
    if gpt is not None:  # exercise 15: its stages instead of one row per function (checker.gpt_stages)
        report.ignored, report.planned, report.unit = [], list(STAGES), "stages"

    def on_row(row: Row) -> None:
        report.rows.append(row)
        if echo is not None:
            echo(report.row_text(row))

    if gpt is not None:
        check_gpt(student, TRAININGS[gpt], on_row, echo)
        if TRAININGS[gpt] is None and all(r.status == "PASS" for r in report.rows):
            report.skipped = SKIPPED_LOSS
    else:
        check_student(student, only, on_row)
    flash = [r.status for r in report.rows if r.function.startswith("flash_attention_")]
    if systems_size and flash == ["PASS", "PASS"]:  # exercise 13's numbers right: now its memory and time
        on_row(check_systems(student, systems_size))
    elif flash == ["PASS", "PASS"]:
        report.skipped = skipped
    report.refused = list(getattr(student, "refused", []))  # a file's child process says what it asked for
    if echo is not None:
        echo(report.summary())
    return report


def check_namespace(namespace: dict, only=None, source: str = "", echo=None, gpt: str | None = None) -> CheckReport:
    """Check the functions a dict (``globals()``, a module's ``vars``) defines; ``only``: pair names to look at.
    ``gpt``: exercise 15's stages instead, with stage 4's training "full", "small" or "off" (``checker.gpt_stages``).

    The functions run in this process: every call on copies of its arguments, a FAIL for one that changes them;
    no time limit (interrupt the kernel to stop an endless loop). ``echo(line)`` gets each line as it is known.
    """
    return _check(InProcess(namespace), only, source, echo, gpt=gpt)


def check_file(
    path, only=None, timeout: float = DEFAULT_TIMEOUT, echo=None, systems_size=SYSTEMS_SIZE, gpt: str | None = None
) -> CheckReport:
    """Check every known function the file at ``path`` (.py, or a notebook's code cells) defines, run in a child
    process: ``timeout`` seconds for importing it and for each function's check. When exercise 13's pair passes,
    one more row: its peak memory and time at L = ``systems_size`` against the targets of ``checker.systems``
    (None: not measured, and the report's summary says the stage was skipped). ``gpt``: exercise 15's stages
    instead of one row per function (``checker.gpt_stages``), stage 4's training "full" (the stated target, at most
    600 s of CPU time), "small" (seconds) or "off".

    BadPath (a StudentFileError) when ``path`` is not a .py or .ipynb file; CannotRun (also one) when it cannot be
    imported (a syntax error, an error, sys.exit, a time-out while importing). ``echo(line)`` gets each line of the
    report as soon as it is known; ``report.output`` is what the file printed.
    """
    path = check_path(path)
    child = ChildProcess(path, timeout)
    try:
        report = _check(child, only, str(path), echo, systems_size, "" if systems_size else SKIPPED, gpt)
    finally:
        child.close()
    report.output = child.output
    return report


__all__ = [
    "NOT_DONE",
    "BadPath",
    "CannotRun",
    "CheckReport",
    "Row",
    "StudentFileError",
    "bugs",
    "cases",
    "check_file",
    "check_namespace",
    "load_student",
]
