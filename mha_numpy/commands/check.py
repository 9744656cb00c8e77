"""``python -m mha_numpy check FILE.py``: check a student's pairs and diagnose the classic backward bugs."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check",
        help="check the forward/backward pairs a file defines; name the classic bug a wrong gradient matches",
        description="Import FILE.py, find the pairs it defines under their usual names (softmax_forward, "
        "softmax_backward, linear_backward, attention_scores_backward, ...), compare each with the reference pairs "
        "on random float64 inputs and with finite differences against a random upstream gradient, and print one "
        "line per function: PASS, not done yet (NotImplementedError), or FAIL with the worst element and a "
        "diagnosis when the error matches a known bug. Exit 0 when all pass, 1 otherwise, 2 if FILE cannot be "
        "loaded.",
    )
    p.add_argument("file", help="the student's Python file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..checker import StudentFileError, check_file

    try:
        report = check_file(args.file)
    except StudentFileError as e:
        print(f"check: {e}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.passed else 1
