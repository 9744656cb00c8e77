"""The teacher's mode: grade a submission on hidden cases and write a score file otter-grader/Gradescope or nbgrader
can read.

    python -m mha_numpy check --submit hand_in.ipynb --cases cases.json --score results.json

The cases file is the teacher's and is not in the students' copy (``docs/course.md``, "For teachers"):

    {"seed": 8091,                                    # other random inputs, of the same shapes as the students'
     "points": {"softmax_backward": 2, "capstone_model_backward": 10},   # what is graded, and its worth
     "visibility": "after_due_date"}                  # optional: Gradescope's visibility of each test

The seed changes every case the checker builds (the values of every pair's inputs and upstream gradients, the
capstones' tokens, weights and upstream gradients), so an answer that reproduces the students' visible cases and
not the maths fails. Each function in ``points`` is a test: its points when it PASSes, 0 otherwise (not done, FAIL,
missing, or the library's own function imported under the exercise's name). Without a cases file, every known
function the file defines is worth 1 point, on the cases students see.

Exercise 13's systems stage (``checker.systems``: the flash pair's peak memory and time at L = 4096, measured from
outside the file's process against the library's chunked kernel, ~10 s) is the test ``flash_attention_systems``,
run when the file's flash pair passes its numbers, worth ``points["flash_attention_systems"]`` or, when the pair is
graded and the cases file names no points for it, ``SYSTEMS_POINTS``. A pair that does not pass, a stage "not
measured" (no /proc) or a memory target "not confirmed" score 0; ``check --submit --no-systems`` lists it as skipped
at 0 points.

An exercise notebook's inline questions are tests too (``checker.written``, read from the notebook without running
it): each short answer worth its form's points, each written answer at 0 of its rubric's points, ``manual``, for the
teacher to grade with the rubric shown beside the student's text.

``Grade.results()`` is Gradescope's results.json, the format otter-grader writes for Gradescope ("score", and one
entry per test with "name", "score", "max_score", "status", "output", "visibility"). For nbgrader, an autograder
test cell ends with ``grade_namespace(globals(), cases).points``: nbgrader reads a number in a test cell's output as
its partial credit (0 ... the cell's points).
"""

from __future__ import annotations

import ast
import functools
import json
import types
from dataclasses import dataclass, field
from pathlib import Path

from . import cases
from .load import BadPath, CannotRun, StudentFileError, check_path, code_cells
from .process import DEFAULT_TIMEOUT, ChildProcess
from .runner import CAPSTONES, Row, check_student, plan
from .student import InProcess
from .systems import NOT_MEASURED, check_systems
from .systems import SIZE as SYSTEMS_SIZE
from .written import written_tests

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's
LIBRARY = "mha_numpy"
LIBRARY_DIR = Path(__file__).resolve().parents[1]
# what the exercises' own cells import from the library: the checker, and train (exercise 9 trains with it). In a
# file's child process these are stand-ins that hold no answer (checker.guard); everything else is refused there.
ALLOWED = ("mha_numpy.checker", "mha_numpy.train", "mha_numpy.optim")
SYSTEMS = "flash_attention_systems"  # exercise 13's systems stage: its test's name and its key in a cases file
SYSTEMS_POINTS = 1.0  # its worth when the flash pair is graded and the cases file names none (1, as a function's)
FLASH = ("flash_attention_forward", "flash_attention_backward")  # the pair whose numbers must pass first
SYSTEMS_SKIPPED = "skipped (--no-systems): the flash pair's memory and time were not measured, 0 points, not a pass"


class BadCases(BadPath):
    """The teacher's cases file cannot be read: a usage error (one line)."""


@dataclass(frozen=True)
class GradeCases:
    """What is graded and how: ``seed`` None (the students' cases) or an int; ``points`` None (1 point for every
    known function found) or {function: points}; ``visibility`` of each test in Gradescope."""

    seed: int | None = None
    points: dict[str, float] | None = None
    visibility: str = "visible"


def known_functions() -> set[str]:
    """Every function name the checker grades."""

    names = {f"{p.name}_{side}" for p in cases.PAIRS for side in ("forward", "backward")}
    return names | {cases.ONLINE_SOFTMAX} | {c.function for c in CAPSTONES} | {SYSTEMS}


def parse_cases(data, source: str = "cases") -> GradeCases:
    """A GradeCases from the JSON object of a cases file; BadCases with one line naming what is wrong."""
    if not isinstance(data, dict):
        raise BadCases(f"{source}: a cases file holds a JSON object, got {type(data).__name__}")
    unknown = set(data) - {"seed", "points", "visibility"}
    if unknown:
        raise BadCases(f"{source}: unknown keys {sorted(unknown)} (a cases file has seed, points, visibility)")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise BadCases(f"{source}: seed must be a non-negative integer, got {seed!r}")
    points = data.get("points")
    if points is not None:
        if not isinstance(points, dict) or not points:
            raise BadCases(f"{source}: points must be an object {{function: points}} with at least one entry")
        unknown = sorted(set(points) - known_functions())
        if unknown:
            raise BadCases(f"{source}: points names functions the checker does not know: {unknown}")
        for name, value in points.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise BadCases(f"{source}: points[{name!r}] must be a number >= 0, got {value!r}")
        points = {name: float(value) for name, value in points.items()}
    visibility = data.get("visibility", "visible")
    if visibility not in VISIBILITIES:
        raise BadCases(f"{source}: visibility must be one of {VISIBILITIES}, got {visibility!r}")
    return GradeCases(seed, points, visibility)


def read_cases(path) -> GradeCases:
    """The teacher's cases file at ``path`` (JSON); BadCases with one line if it cannot be read."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadCases(f"no such cases file: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BadCases(f"{path}: not a JSON cases file ({e})") from None
    return parse_cases(data, str(path))


@dataclass
class Grade:
    """The graded tests of one submission: ``tests`` (name, points earned, max points, PASS/FAIL/..., detail)."""

    source: str
    tests: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str = ""  # the file could not be run at all: every test scores 0
    visibility: str = "visible"

    @property
    def systems_skipped(self) -> bool:
        """Exercise 13's systems stage was graded and skipped (``--no-systems``)."""
        return any(t["name"] == SYSTEMS and t["status"] == "skipped" for t in self.tests)

    @property
    def points(self) -> float:
        return float(sum(t["score"] for t in self.tests))

    @property
    def max_points(self) -> float:
        return float(sum(t["max_score"] for t in self.tests))

    def results(self) -> dict:
        """Gradescope's results.json (as otter-grader writes it for Gradescope)."""
        output = [f"{self.source}: {self.points:g} of {self.max_points:g} points"]
        output += [f"cannot be run: {self.error}"] if self.error else []
        output += [f"warning: {w}" for w in self.warnings]
        output += [f"{SYSTEMS}: {SYSTEMS_SKIPPED}"] if self.systems_skipped else []
        manual = [t for t in self.tests if t.get("manual")]
        if manual:
            output.append(f"{sum(t['max_score'] for t in manual):g} points of written answers await grading by hand "
                          f"(the {len(manual)} tests tagged {MANUAL_TAG!r}, at 0 until then)")  # fmt: skip
        tests = [
            manual_result(t) if t.get("manual") else
            {"name": t["name"], "score": t["score"], "max_score": t["max_score"],
             "status": "passed" if t["status"] == "PASS" else "failed",
             "output": f"{t['status']}{': ' + t['detail'] if t['detail'] else ''}", "visibility": self.visibility}
            for t in self.tests
        ]  # fmt: skip
        return {"score": self.points, "output": "\n".join(output), "tests": tests,
                "extra_data": {"mha_numpy": {"warnings": self.warnings, "error": self.error}}}  # fmt: skip

    def __str__(self) -> str:
        width = max([len(t["name"]) for t in self.tests] or [0])
        lines = [f"{t['name']:<{width}}  {t['score']:g}/{t['max_score']:g}  {t['status']}" for t in self.tests]
        lines += [f"cannot be run: {self.error}"] if self.error else []
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"{SYSTEMS}: {SYSTEMS_SKIPPED}"] if self.systems_skipped else []
        return "\n".join([*lines, f"{self.points:g} of {self.max_points:g} points"])


MANUAL_TAG = "manual grading"


def manual_result(test: dict) -> dict:
    """A written answer's entry in results.json. Gradescope's format has no "graded by hand" status (a test's status
    is passed or failed) and otter-grader leaves manually graded questions out of results.json (it exports them to a
    PDF for an assignment graded by hand): here such a test is listed at 0 of its points with no status, tagged
    ``MANUAL_TAG``, the student's text and the rubric as its output, and shown to students only when the teacher
    publishes the grades (the rubric holds the answer)."""
    return {"name": test["name"], "score": 0.0, "max_score": test["max_score"], "output": test["detail"],
            "tags": [MANUAL_TAG], "visibility": "after_published",
            "extra_data": {"manual": True, "answer": test["answer"], "rubric": test["rubric"]}}  # fmt: skip


def library_origin(fn) -> str:
    """The library function ``fn`` is, however it is dressed (``functools.partial``, a wrapper's ``__wrapped__``, a
    bound method, ``__module__`` rewritten: its code is read, not its name); "" for a function of the student's."""
    for _ in range(10):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        elif getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        else:
            break
    code = getattr(fn, "__code__", None)
    if code is None and callable(fn) and not isinstance(fn, type):
        code = getattr(vars(type(fn)).get("__call__"), "__code__", None)  # an object of a class with a __call__
    try:
        inside = code is not None and Path(code.co_filename).resolve().is_relative_to(LIBRARY_DIR)
    except (OSError, ValueError):
        inside = False
    if not inside:
        return ""
    module = Path(code.co_filename).resolve().relative_to(LIBRARY_DIR.parent).with_suffix("")
    return ".".join(module.parts) + "." + code.co_name


def _status(name: str, row: Row | None, module: str) -> tuple[str, str]:
    """A graded function's status and detail: its row's, "missing", or FAIL for the library's own function."""
    if row is None:
        return "missing", f"{name} is not defined in the submission"
    if module.startswith(LIBRARY + ".") or module == LIBRARY:
        return "FAIL", f"{name} is {module}'s own function, imported: not the submission's work"
    detail = row.detail + (f" (relation: {row.relation})" if row.relation else "")
    return row.status, detail + (f" (diagnosis: {row.diagnosis})" if row.bug else "")


def flash_passes(rows: list[Row], modules: dict[str, str]) -> bool:
    """Exercise 13's pair passes its numbers, as the submission's own work: the systems stage may be run."""
    by_name = {r.function: r for r in rows}
    return all(_status(name, by_name.get(name), modules.get(name, ""))[0] == "PASS" for name in FLASH)


def systems_points(cases: GradeCases, found: list[str], measurable: bool = True) -> float | None:
    """The systems stage's worth when it is graded, else None: named in ``points``; or, for a file (``measurable``),
    the flash pair graded (both in ``points``, or without points both defined) at ``SYSTEMS_POINTS``."""
    if cases.points is not None and SYSTEMS in cases.points:
        return cases.points[SYSTEMS]
    graded = set(cases.points) if cases.points is not None else set(plan(found))
    return SYSTEMS_POINTS if measurable and set(FLASH) <= graded else None


def _systems_status(rows: list[Row], modules: dict[str, str], systems: Row | None) -> tuple[str, str]:
    """The systems test's status and detail: skipped, not run (the pair fails), or the stage's row."""
    if systems is not None and systems.status == "skipped":
        return "skipped", systems.detail
    if not flash_passes(rows, modules):
        return "not run", f"{' and '.join(FLASH)} do not both pass their numbers: the stage needs them (0 points)"
    if systems is None:
        return "not run", "the stage was not run (0 points)"
    return systems.status, systems.detail


def _tests(
    rows: list[Row], modules: dict[str, str], cases: GradeCases, found: list[str], systems: Row | None = None,
    measurable: bool = True,
) -> list[dict]:  # fmt: skip
    by_name = {r.function: r for r in rows}
    points = dict(cases.points) if cases.points is not None else {name: 1.0 for name in plan(found)}
    worth = systems_points(cases, found, measurable)
    if worth is not None:
        points.setdefault(SYSTEMS, worth)  # after the functions when the cases file does not place it
    tests = []
    for name, worth in points.items():
        if name == SYSTEMS:
            status, detail = _systems_status(rows, modules, systems)
        else:
            status, detail = _status(name, by_name.get(name), modules.get(name, ""))
        score = worth if status == "PASS" else 0.0  # "not measured", "not confirmed" (a FAIL), skipped: 0
        tests.append({"name": name, "score": score, "max_score": worth, "status": status, "detail": detail})
    return tests


def _only(cases: GradeCases) -> set[str] | None:
    """The checker's ``only`` (pair names: softmax, online_softmax, capstone_model) for the graded functions."""
    return None if cases.points is None else {name.rsplit("_", 1)[0] for name in cases.points}


def library_imports(sources: list[str]) -> list[str]:
    """The ``mha_numpy`` modules (outside the checker) the code imports: its reference pairs hold the answers."""
    found = []
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" if node.module == LIBRARY else node.module for a in node.names]
            found += [n for n in names if n.split(".")[0] == LIBRARY and not n.startswith(ALLOWED)]
    return sorted(set(found))


def _warnings(imports: list[str], in_child: bool = True) -> list[str]:
    if not imports:
        return []
    if in_child:
        return [f"the submission imports {', '.join(imports)}: refused in the checker's process (the library's "
                "pairs hold the answers), so nothing of it was graded as the student's"]  # fmt: skip
    return [f"the submission imports {', '.join(imports)}: the library's reference pairs are importable there, "
            "check by hand that the graded functions are the student's own"]  # fmt: skip


def namespace_imports(namespace: dict) -> list[str]:
    """The ``mha_numpy`` modules (outside ``ALLOWED``) a notebook's namespace holds or its cells imported: modules
    bound to a name, the library's functions under any name (``library_origin``), and the import lines of the cells
    run so far (IPython's ``In``)."""
    found = []
    for value in list(namespace.values()):
        if isinstance(value, types.ModuleType):
            module = value.__name__
        elif isinstance(value, type):
            module = str(getattr(value, "__module__", ""))
        elif callable(value):
            module = library_origin(value).rpartition(".")[0]
        else:
            continue
        if module.split(".")[0] == LIBRARY and not module.startswith(ALLOWED):
            found.append(module)
    cells = namespace.get("In")
    if isinstance(cells, list):
        found += library_imports([c for c in cells if isinstance(c, str)])
    return sorted(set(found))


def _run_systems(child: ChildProcess, size: int) -> Row:
    """The systems stage's row for ``child``, measured from here before it is closed; a stage that stops is 0 points,
    and the functions already graded keep their rows."""
    try:
        return check_systems(child, size)
    except StudentFileError as e:  # the file's process could not be restarted for the stage
        return Row(SYSTEMS, "FAIL", f"the stage could not run the file: {e}")
    except Exception as e:  # noqa: BLE001 - the library's process, the machine: said, never a pass
        return Row(SYSTEMS, NOT_MEASURED, f"the stage stopped: {type(e).__name__}: {str(e)[:200]}")


def grade_file(
    path, cases: GradeCases | None = None, timeout: float = DEFAULT_TIMEOUT, systems_size: int | None = SYSTEMS_SIZE
) -> Grade:
    """Grade the .py file or notebook at ``path`` in a child process (``check_file``'s isolation and time limit).

    When the systems stage is graded (``systems_points``) and the flash pair passes, the stage runs at
    L = ``systems_size`` (None: skipped, ``check --submit --no-systems``: the test says so, at 0 points).

    BadPath when ``path`` is not a checkable file; a file that cannot be run gets a Grade with ``error`` set and
    every test at 0 (so an autograder still writes a score file).
    """
    cases = cases or GradeCases()
    path = check_path(path)
    grade = Grade(str(path), visibility=cases.visibility)
    imports: list[str] = []
    try:
        imports = library_imports([source for _, source in code_cells(path)])
        grade.warnings = _warnings(imports)
        child = ChildProcess(path, timeout)
    except CannotRun as e:
        grade.error = str(e)
        grade.tests = _tests([], {}, cases, []) + written_tests(path)  # the written answers need nothing to run
        return grade
    systems = None
    try:
        rows = check_student(child, _only(cases), seed=cases.seed)
        if systems_points(cases, child.names) is not None and systems_size is None:
            systems = Row(SYSTEMS, "skipped", "not measured (--no-systems): 0 points, not a pass")
        elif systems_points(cases, child.names) is not None and flash_passes(rows, child.modules):
            systems = _run_systems(child, systems_size)
    except StudentFileError as e:
        grade.error, rows = str(e), []
    finally:
        child.close()
    refused = sorted(set(child.refused) - set(imports))  # imports the source does not spell (importlib, __import__)
    grade.warnings = _warnings(sorted(set(imports) | set(refused)))
    grade.tests = _tests(rows, child.modules, cases, child.names, systems) + written_tests(path)
    return grade


def failed_grade(path, cases: GradeCases | None, error: str) -> Grade:
    """A Grade with every test at 0 and ``error`` said: what is written when the grading could not finish."""
    cases = cases or GradeCases()
    return Grade(str(path), _tests([], {}, cases, []), error=error, visibility=cases.visibility)


def grade_namespace(namespace: dict, cases: GradeCases | dict | None = None) -> Grade:
    """Grade the functions of a notebook's namespace (``globals()``), in this process: an nbgrader test cell ends
    with ``grade_namespace(globals(), {"seed": ..., "points": {...}}).points``, its partial credit. Exercise 13's
    systems stage cannot be measured here: graded only when ``points`` names it, and then "not measured", 0."""
    cases = parse_cases(cases) if isinstance(cases, dict) else (cases or GradeCases())
    student = InProcess(namespace)
    rows = check_student(student, _only(cases), seed=cases.seed)
    modules = {}
    for name in student.names:
        origin = library_origin(namespace[name]).rpartition(".")[0]  # the library's function, however dressed
        modules[name] = origin or str(getattr(namespace[name], "__module__", "") or "")
    in_process = Row(SYSTEMS, NOT_MEASURED, "the stage measures a file's process from outside, not a notebook's "
                     "namespace: grade the notebook with check --submit (0 points)")  # fmt: skip
    tests = _tests(rows, modules, cases, student.names, in_process, measurable=False)
    grade = Grade("the notebook", tests, visibility=cases.visibility)
    grade.warnings = _warnings(namespace_imports(namespace), in_child=False)
    return grade
