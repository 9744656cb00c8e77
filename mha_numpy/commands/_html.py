"""``--html FILE``: write an explorer page (``mha_numpy.viz.explorer``) for a CLI command.

Its mistakes read as every other flag's: a path that cannot be a file is refused while parsing
(``prog: error: argument --html: ... (see prog --help)``), a write that fails is a ``UsageError``
naming ``--html``; both are one line and exit 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import UsageError


def html_file(s: str) -> Path:
    """An argparse type: an HTML file to write; its directory must exist and it must not be a directory."""
    path = Path(s)
    try:
        is_dir, parent_is_dir = path.is_dir(), path.parent.is_dir()
    except OSError as e:  # e.g. a name too long for the file system
        raise argparse.ArgumentTypeError(f"cannot write {s[:80]!r}...: {e.strerror or e}") from None
    if is_dir:
        raise argparse.ArgumentTypeError(
            f"{s!r} is a directory; give a file name such as {str(path / 'explorer.html')!r}"
        )
    if not parent_is_dir:
        raise argparse.ArgumentTypeError(f"the directory of {s!r} does not exist")
    return path


def add_html_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--html",
        metavar="FILE",
        type=html_file,
        default=None,
        help=f"also write the interactive explorer of {what} (head, model, neuron and gradient views; one offline "
        "HTML file)",
    )


def write_page(path, page) -> int:
    """Write ``page`` (an ExplorerPage) -> 0; a write that fails is a UsageError naming --html (exit 2)."""
    try:
        written = page.save(path)
    except ValueError as e:
        raise UsageError(f"argument --html: {e}") from None
    print(f"wrote {written} (open it in a browser; it needs no network)")
    return 0
