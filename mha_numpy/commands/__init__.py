"""One module per CLI command; each has ``add_parser(subparsers)`` that sets ``run``.

Commands import their heavy dependencies (matplotlib, torch, ...) inside ``run`` so that
``python -m mha_numpy --help`` stays fast and works without them.
"""

from . import bert, check, crosscheck, finetune, gpt, gradcheck, ring, tour, train, verify
from ._args import Parser, UsageError

COMMANDS = [tour, gradcheck, bert, crosscheck, train, gpt, finetune, check, verify, ring]

__all__ = ["COMMANDS", "Parser", "UsageError"]
