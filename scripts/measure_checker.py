"""Measure the course checker on a folder of student files whose headers say what a good checker must report.

    python scripts/measure_checker.py tests/data/students/trial2
    python scripts/measure_checker.py tests/data/students/trial2 --out trial2.txt --jobs 2 --timeout 10

Each file starts with comment lines (decided from the bug's nature, never from what the checker prints):

    # expect: PASS | FAIL
    # where: FUNCTION [GRADIENT | F-LABEL NAME]      (FAIL only; "import" for a file that cannot be imported)
    # name: relation KIND [LABEL,LABEL...] | catalogue BUG-KEY | hostile   (" | " between accepted alternatives)

Every file is run through ``python -m mha_numpy check FILE --timeout T`` (the student's command: its stdout is the
report, its exit code the verdict), ``--jobs`` at a time, each within a wall-clock limit. Per file:

- verdict ok: exit code 0 and every row PASS for PASS; 1 with a FAIL row, or 3 (the file cannot be run), for FAIL
  (anything else, a traceback of the checker's own or no verdict in time, is right for neither).
- located ok (FAIL with a ``where``): the first FAIL row is FUNCTION's, and its detail or its relation line starts
  with the gradient (``dq``, ``dW_k``: "d" + GRADIENT) or its detail names the capstone's first wrong line
  (``first wrong: F10 d_kh``);
  ``where: import``: exit code 3.
- named ok (FAIL, not hostile): FUNCTION's row says one of the alternatives: ``catalogue KEY``, its diagnosis
  line is that bug's (``checker.bugs``, the capstones' catalogues); ``relation KIND``, its relation line (or, for
  ``cache`` and ``mutation``, its detail) reads as KIND says in ``KINDS``; a factor's LABELs (any one) must be
  the factor named (``... is LABEL (= ...`` or ``a factor LABEL is missing``, a label's own note after it).

The rates: verdicts right / files; bugs located / bugs and bugs named / bugs, a bug being a FAIL file that is not
hostile; and, for information, the bugs whose row also carries a catalogue diagnosis that the header does not
accept (a near-variant mistaken for the entry it is near). ``KINDS`` is this script's reading of the relation
sentences of ``mha_numpy.checker.relations``: a finder that says a new kind in new words needs a line here. A usage
mistake is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT_RUN = 0, 1, 2, 3

# KIND -> the words of the relation sentence (or the row's detail) that say it
KINDS = {
    "missing": r"is missing \(None was returned\)|is all zeros where",
    "zeros": r"array of zeros where the call gave no such input",
    "factor": r"times the right one|times its right value|the right one divided by|a factor [^.]+ is missing",
    "sign": r"has the wrong sign",
    "transpose": r"transpose of the right one|has its axes \(.*\) swapped|a reshape where a transpose belongs",
    "sum-missing": r"not summed over axes",
    "sum-extra": r"a sum too many",
    "path": r"lacks the contributions? of",
    "masked-rows": r"wrong only on the fully masked rows",
    "first-row": r"right except on the first row",
    "last-row": r"right except on the last row",
    "head": r"right except on head",
    "part": r"wrong only on the fully masked rows|right except (on|at)|wrong only on the rows of",
    "term-sign": r"(term|path)[^.]*(wrong|opposite) sign|(wrong|opposite) sign[^.]*(term|path)",
    "wrong-axis": r"wrong ax[ie]s|instead of (the last )?axis|over axis -?\d+, not|axis -?\d+ instead",
    "order": r"wrong order|in the order of|returned in place of|(is|are) swapped with|each other's",
    "cache": r"with the reference forward's cache it is right",
    "mutation": r"modified its (cache|argument)",
}
IN_DETAIL = ("cache", "mutation")  # kinds the row's detail says, not its relation line
ROW = re.compile(r"^(?P<function>\S+(?: \([^)]*\))?)\s{2,}(?P<status>PASS|FAIL|not done yet)(?:\s{2}(?P<detail>.*))?$")


class UsageError(Exception):
    """A command-line mistake: its one line goes to stderr, and the exit code is 2."""


@dataclass
class Header:
    expect: str
    where: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # the accepted alternatives

    @property
    def hostile(self) -> bool:
        return "hostile" in self.names

    @property
    def bug(self) -> bool:
        """A FAIL file that is not hostile: counted in the located and named rates."""
        return self.expect == "FAIL" and not self.hostile


@dataclass
class Row:
    function: str
    status: str
    detail: str = ""
    relation: str = ""
    diagnosis: str = ""


@dataclass
class Result:
    path: Path
    header: Header
    code: int | None  # the checker's exit code; None: it did not end within the wall-clock limit
    rows: list[Row]
    stderr: str = ""
    verdict_ok: bool = False
    located_ok: bool | None = None  # None: nothing to locate
    named_ok: bool | None = None  # None: not a bug
    misdiagnosed: bool = False  # a bug given a catalogue diagnosis its header does not accept

    @property
    def verdict(self) -> str:
        """PASS (exit 0, every row PASS), FAIL (exit 1 with a FAIL row, or 3: cannot run), else "error (...)": the
        checker itself crashed (a traceback exits 1 too, with no FAIL row), or gave no verdict in time."""
        statuses = [r.status for r in self.rows]
        if self.code == EXIT_PASSED and statuses and all(s == "PASS" for s in statuses):
            return "PASS"
        if (self.code == EXIT_FAILED and "FAIL" in statuses) or self.code == EXIT_CANNOT_RUN:
            return "FAIL"
        return f"error (exit code {self.code}, rows {statuses})"

    def judged_row(self) -> Row | None:
        """The row of the ``where`` function, else the first FAIL row (None: no such row)."""
        where = self.header.where
        if where and where[0] != "import":
            return next((r for r in self.rows if r.function == where[0]), None)
        return next((r for r in self.rows if r.status == "FAIL"), None)

    def sentence(self) -> str:
        """What the checker said of the row judged: its relation, else its diagnosis, else its detail."""
        row = self.judged_row()
        if row is None and self.rows:
            return f"{sum(r.status == 'PASS' for r in self.rows)} of {len(self.rows)} rows PASS"
        if row is None:  # no report: what the command said on stderr (the file cannot be run, a traceback)
            return (self.stderr.strip().splitlines() or ["(no report)"])[-1]
        said = row.relation or row.diagnosis or row.detail or row.status
        if row.relation and row.diagnosis:
            said += f" [diagnosis: {row.diagnosis.split('. You probably wrote')[0]}]"
        return said


def read_header(path: Path) -> Header:
    """The ``# expect:``, ``# where:`` and ``# name:`` lines of ``path``'s leading comments (UsageError without
    a valid ``expect``)."""
    fields: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        fields[key.strip()] = value.strip()
    expect = fields.get("expect", "")
    if expect not in ("PASS", "FAIL"):
        raise UsageError(f"{path}: no '# expect: PASS' or '# expect: FAIL' line at the top")
    names = [n.strip() for n in fields.get("name", "").split(" | ") if n.strip()]
    for name in names:
        what, _, rest = name.partition(" ")
        kind = rest.split(" ", 1)[0]
        if not (name == "hostile" or (what == "catalogue" and rest) or (what == "relation" and kind in KINDS)):
            raise UsageError(f"{path}: '# name: {name}' is not 'relation KIND' (KIND one of {', '.join(KINDS)}), "
                             "'catalogue BUG-KEY' or 'hostile'")  # fmt: skip
    return Header(expect, fields.get("where", "").split(), names)


def parse_report(stdout: str) -> list[Row]:
    """The rows of a ``check`` report: each row line, with its ``relation:`` and ``diagnosis:`` lines."""
    rows: list[Row] = []
    for line in stdout.splitlines():
        match = ROW.match(line)
        if match:
            rows.append(Row(match["function"], match["status"], match["detail"] or ""))
        elif rows and line.startswith(" "):
            text = line.strip()
            if text.startswith("relation: "):
                rows[-1].relation = text.removeprefix("relation: ")
            elif text.startswith("diagnosis: "):
                rows[-1].diagnosis = text.removeprefix("diagnosis: ")
    return rows


def catalogue_titles() -> dict[str, set[str]]:
    """{bug key: its titles} over the checker's catalogues (the pairs', the two capstones')."""
    sys.path.insert(0, str(ROOT))
    from mha_numpy.checker import bugs
    from mha_numpy.checker.capstone import MODEL_BUGS
    from mha_numpy.checker.capstone_block import BLOCK_BUGS

    titles: dict[str, set[str]] = {}
    for bug in (*bugs.BUGS, *MODEL_BUGS, *BLOCK_BUGS):
        titles.setdefault(bug.key, set()).add(bug.title)
    return titles


def located(result: Result) -> bool | None:
    where = result.header.where
    if result.header.expect != "FAIL" or not where:
        return None
    if where == ["import"]:
        return result.code == EXIT_CANNOT_RUN
    first = next((r for r in result.rows if r.status == "FAIL"), None)
    if first is None or first.function != where[0]:
        return False
    if len(where) == 2:  # a pair's gradient (or a forward's "out"), first in the detail or in the relation
        said = {text.split(" ", 1)[0].rstrip(":") for text in (first.detail, first.relation)}
        return bool(said & {f"d{where[1]}", f"d_{where[1]}", where[1]})
    if len(where) == 3:  # a capstone: F-label and the gradient's name
        return f"first wrong: {where[1]} d_{where[2]} " in first.detail
    return True


def says(row: Row | None, name: str, titles: dict[str, set[str]]) -> bool:
    """True when ``row`` says ``name`` ("catalogue KEY" or "relation KIND [LABELS]")."""
    if row is None or row.status != "FAIL":
        return False
    what, _, rest = name.partition(" ")
    if what == "catalogue":
        return any(row.diagnosis.startswith(title) for title in titles.get(rest.strip(), ()))
    if what != "relation":
        return False
    kind, _, labels = rest.strip().partition(" ")
    text = row.detail if kind in IN_DETAIL else row.relation
    if not re.search(KINDS[kind], text):
        return False
    wanted = [label.strip() for label in labels.split(",") if label.strip()]
    return not wanted or any(f"is {x} " in text or f"a factor {x} " in text for x in wanted)


def named(result: Result, titles) -> bool | None:
    if not result.header.bug:
        return None
    return any(says(result.judged_row(), name, titles) for name in result.header.names)


def misdiagnosed(result: Result, titles) -> bool:
    """A bug whose row carries a catalogue diagnosis that none of its header's ``catalogue`` alternatives is."""
    row = result.judged_row()
    if not result.header.bug or row is None or not row.diagnosis:
        return False
    accepted = [n.partition(" ")[2] for n in result.header.names if n.startswith("catalogue ")]
    return not any(row.diagnosis.startswith(title) for key in accepted for title in titles.get(key, ()))


def run_one(path: Path, timeout: float, wall: float) -> tuple[int | None, str, str]:
    """(exit code or None, stdout, stderr) of the checker on ``path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "mha_numpy", "check", str(path), "--timeout", f"{timeout:g}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=wall, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        return None, out, f"no verdict within {wall:g} s"
    return done.returncode, done.stdout, done.stderr


def measure(folder: Path, jobs: int = 2, timeout: float = 10.0, wall: float = 600.0) -> list[Result]:
    """Run the checker on every ``*.py`` file of ``folder`` and judge each against its header."""
    paths = sorted(folder.glob("*.py"))
    if not paths:
        raise UsageError(f"{folder}: no .py files")
    headers = [read_header(p) for p in paths]
    titles = catalogue_titles()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(lambda p: run_one(p, timeout, wall), paths))
    results = []
    for path, header, (code, out, err) in zip(paths, headers, runs):
        result = Result(path, header, code, parse_report(out), err)
        result.verdict_ok = result.verdict == header.expect
        result.located_ok = located(result)
        result.named_ok = named(result, titles)
        result.misdiagnosed = misdiagnosed(result, titles)
        results.append(result)
    return results


def rates(results: list[Result]) -> dict[str, tuple[int, int]]:
    """{what: (right, out of)}: verdicts over every file, located and named over the bugs."""
    bugs = [r for r in results if r.header.bug]
    return {
        "verdicts right": (sum(r.verdict_ok for r in results), len(results)),
        "bugs located": (sum(bool(r.located_ok) for r in bugs), len(bugs)),
        "bugs named": (sum(bool(r.named_ok) for r in bugs), len(bugs)),
        "bugs with a diagnosis their header does not accept": (sum(r.misdiagnosed for r in bugs), len(bugs)),
    }


def table(results: list[Result]) -> str:
    """One line per file (file, expected, verdict ok, located ok, named ok, the checker's sentence), then the rates."""

    def mark(ok: bool | None) -> str:
        return "-" if ok is None else ("yes" if ok else "NO")

    def expected(r: Result) -> str:
        return r.header.expect + (" hostile" if r.header.hostile else "")

    width, wide = max(len(r.path.name) for r in results), max(8, *(len(expected(r)) for r in results))
    lines = [f"{'file':<{width}}  {'expected':<{wide}}  verdict  located  named  the checker's sentence"]
    for r in results:
        lines.append(f"{r.path.name:<{width}}  {expected(r):<{wide}}  {mark(r.verdict_ok):<7}  "
                     f"{mark(r.located_ok):<7}  {mark(r.named_ok):<5}  {r.sentence()[:160]}")  # fmt: skip
    lines.append("")
    for what, (right, total) in rates(results).items():
        lines.append(f"{what}: {right} / {total}" + (f" = {right / total:.2f}" if total else ""))
    return "\n".join(lines)


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2: never argparse's usage block
        raise UsageError(message)


def main(argv=None) -> int:
    parser = _Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the folder of student files with headers")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--jobs", type=_positive(int), default=2, help="files checked at once (default 2)")
    parser.add_argument("--timeout", type=_positive(float), default=10.0, help="the checker's --timeout (default 10)")
    parser.add_argument("--wall", type=_positive(float), default=600.0, help="seconds per file in all (default 600)")
    try:
        args = parser.parse_args(argv)
        if not args.folder.is_dir():
            raise UsageError(f"{args.folder}: not a directory")
        if args.out is not None and (args.out.is_dir() or not args.out.resolve().parent.is_dir()):
            raise UsageError(f"--out {args.out}: not a file in an existing directory")
        text = table(measure(args.folder, args.jobs, args.timeout, args.wall))
    except UsageError as e:
        print(f"measure_checker: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
