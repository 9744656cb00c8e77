"""``python -m mha_numpy check FILE``: check a student's pairs and diagnose the classic backward bugs."""

from __future__ import annotations

import argparse
import sys

from ..checker.process import DEFAULT_TIMEOUT
from ._args import positive_float

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT_RUN = 0, 1, 2, 3
EXIT_CODES = (
    "exit codes: 0 = every function found was checked and passed, exercise 13's systems stage too unless --no-systems "
    "skipped it (with --submit: the score file was written); 1 = a function failed or is not done yet (or the systems "
    "stage failed or was not measured), or none was found; 2 = usage error (no such file, a directory, not a .py or "
    ".ipynb file, a bad option or cases file); 3 = the file could not be run (a syntax error, or an error, sys.exit, "
    "os._exit or the time limit while importing it; with --submit the score file is written, every test at 0)."
)
OUTPUT_LINES = 10  # at most this many lines of what the student's file printed are shown (on stderr)


def add_parser(sub) -> None:
    """Add the ``check`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "check",
        help="check the forward/backward pairs a file defines; name the classic bug a wrong gradient matches",
        description="Run FILE (a .py file, or an exercise notebook's code cells in order) in a child process with a "
        "clean environment and a time limit, find the pairs it defines under their usual names (softmax_forward, "
        "softmax_backward, linear_backward, attention_scores_backward, ...), compare each with the reference pairs on "
        "random float64 inputs and with finite differences against a random upstream gradient, and print one line per "
        "function as soon as it is checked: PASS, not done yet (NotImplementedError), or FAIL with the worst element "
        "and a diagnosis when the error matches a known bug. A function that changes its arguments or its cache in "
        "place, does not return within the time limit, or ends the process, FAILs. What FILE prints goes to stderr, "
        "apart from the report. FILE cannot use mha_numpy there (what it imports of it raises when called; "
        "mha_numpy.train's tasks and optimizers excepted). Not a sandbox: run files you do not trust in a container. "
        "With --submit FILE: grade it "
        "on the teacher's cases (--cases) and write a score file (--score) for Gradescope / otter-grader.",
        epilog=EXIT_CODES,
    )
    p.add_argument("file", nargs="?", help="the student's Python file or exercise notebook (.py or .ipynb)")
    teacher = p.add_argument_group("the teacher's mode (docs/course.md, For teachers)")
    teacher.add_argument("--submit", metavar="FILE", help="grade FILE (instead of checking it) and write a score file")
    teacher.add_argument("--cases", metavar="CASES.json", help="the teacher's hidden cases: seed, points per function, "
                         "visibility (default: 1 point per function found, on the students' cases)")  # fmt: skip
    teacher.add_argument("--score", metavar="OUT.json", default="results.json",
                         help="where --submit writes Gradescope's results.json, as otter-grader does (default "
                         "%(default)s)")  # fmt: skip
    gpt = p.add_argument_group("exercise 15, the final project (docs/course.md)")
    gpt.add_argument("--gpt", action="store_true", help="grade FILE as exercise 15, stage by stage: 0 your pairs, "
                     "1 the block, 2 the causal block, 3 one training step, 4 the loss after training the GPT with "
                     "your backward (at most 600 s of CPU time); the first stage that fails ends it")  # fmt: skip
    gpt.add_argument("--training", choices=("full", "small", "off"), default=None,
                     help="with --gpt, stage 4: full (default, the stated target), small (a one-block model on "
                     "a slice of the text, seconds, its own target) or off (stages 0-3 only, while you "
                     "iterate)")  # fmt: skip
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT,
        help="seconds allowed for importing FILE, and for checking each function (default %(default)g)",
    )
    p.add_argument(
        "--no-systems",
        action="store_true",
        help="skip exercise 13's systems stage (its pair's peak memory and time at L = 4096, measured in about 10 s "
        "when the pair passes): the report says it was skipped, and it is not a pass (with --submit: the test "
        "flash_attention_systems is listed as skipped, at 0 points)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check ``args.file`` in a child process and print the report, or grade ``args.submit`` into a score file; an exit
    code of ``EXIT_CODES``.
    """
    from ..checker import BadPath, StudentFileError, check_file

    if (args.file is None) == (args.submit is None):
        print("check: give one FILE to check, or --submit FILE to grade it", file=sys.stderr)
        return EXIT_USAGE
    if args.submit is None and args.cases is not None:
        print("check: --cases goes with --submit FILE (the teacher's mode)", file=sys.stderr)
        return EXIT_USAGE
    if args.training is not None and not args.gpt:
        print("check: --training goes with --gpt (exercise 15's stage 4)", file=sys.stderr)
        return EXIT_USAGE
    if args.gpt and args.submit is not None:
        print("check: --gpt checks a FILE; --submit grades the pairs (not exercise 15's stages)", file=sys.stderr)
        return EXIT_USAGE
    if args.submit is not None:
        return _submit(args)
    gpt = (args.training or "full") if args.gpt else None
    try:
        systems = {"systems_size": None} if args.no_systems else {}
        report = check_file(
            args.file, timeout=args.timeout, echo=lambda line: print(line, flush=True), gpt=gpt, **systems
        )
    except BadPath as e:
        print(f"check: {e}", file=sys.stderr)
        return EXIT_USAGE
    except StudentFileError as e:
        print(f"check: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    _show_output(args.file, report.output)
    return EXIT_PASSED if report.passed else EXIT_FAILED


def _show_output(path: str, output: str) -> None:
    """What the file printed, on stderr after the report, each line marked as the file's (never as a verdict)."""
    lines = output.splitlines()
    if not lines:
        return
    more = f", the first {OUTPUT_LINES}" if len(lines) > OUTPUT_LINES else ""
    print(f"{path} printed {len(lines)} line{'s' * (len(lines) != 1)} (not part of the report{more}):", file=sys.stderr)
    for line in lines[:OUTPUT_LINES]:
        print(f"  | {line}", file=sys.stderr)


def _submit(args: argparse.Namespace) -> int:
    """Grade ``args.submit`` on the cases of ``args.cases`` and write the score file ``args.score``."""
    import json
    from pathlib import Path

    from ..checker.grading import BadPath, failed_grade, grade_file, read_cases

    try:
        cases = read_cases(args.cases) if args.cases is not None else None
        score = Path(args.score)
        if score.is_dir() or not score.parent.is_dir():
            raise BadPath(f"--score {score}: not a file in an existing directory")
        systems = {"systems_size": None} if args.no_systems else {}
        grade = grade_file(args.submit, cases, timeout=args.timeout, **systems)
    except BadPath as e:
        print(f"check: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - whatever stopped the grading, a score file is written: every test 0
        grade = failed_grade(args.submit, cases, f"the grading stopped: {type(e).__name__}: {str(e)[:200]}")
    # written here, by this process, after the child and everything it started are gone (ChildProcess.close)
    score.write_text(json.dumps(grade.results(), indent=2) + "\n", encoding="utf-8")
    print(grade)
    print(f"score file: {score}")
    return EXIT_CANNOT_RUN if grade.error else EXIT_PASSED
