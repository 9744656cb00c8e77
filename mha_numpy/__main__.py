"""Command line: ``python -m mha_numpy COMMAND --help``."""

from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mha_numpy",
        description="Multi-head attention in pure NumPy, forward and hand-written backward, checked.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
