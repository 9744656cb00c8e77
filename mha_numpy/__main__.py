"""Command line: ``python -m mha_numpy COMMAND --help``."""

from __future__ import annotations

import sys

from . import __version__
from ._optional import MissingDependency
from .allocator import keep_freed_memory
from .commands import COMMANDS, Parser, UsageError


def main(argv: list[str] | None = None, prog: str = "python -m mha_numpy") -> int:
    """Run a command; a usage mistake or a missing optional package is one line on stderr and exit 2."""
    parser = Parser(
        prog=prog,
        description="Multi-head attention in pure NumPy, forward and hand-written backward, checked.",
    )
    parser.add_argument("--version", action="version", version=f"mha_numpy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)  # a bad value: argparse's one-line error, exit 2
    try:
        return int(args.run(args) or 0)
    except (UsageError, MissingDependency) as e:
        message = " ".join(str(e).split())  # one line, whatever the message
        print(f"{parser.prog} {args.command}: error: {message}", file=sys.stderr)
        return 2


def console() -> int:
    """The ``mha-numpy`` console command (pyproject.toml ``[project.scripts]``): ``main`` under its own name, in a
    process of its own, so freed arrays' memory is kept for the next ones (``allocator.keep_freed_memory``)."""
    keep_freed_memory()
    return main(prog="mha-numpy")


if __name__ == "__main__":
    keep_freed_memory()  # a process of its own (not main() itself: tests call it in theirs)
    sys.exit(main())
