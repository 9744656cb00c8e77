"""``--html FILE``: write an explorer page (``mha_numpy.viz.explorer``) for a CLI command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_html_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--html",
        metavar="FILE",
        default=None,
        help=f"also write the interactive explorer of {what} (head, model and neuron views; one offline HTML file)",
    )


def html_path_error(path: str | None) -> str | None:
    """Why ``path`` cannot be written (checked before any work), or None."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        return f"--html {path}: is a directory, give a file name such as explorer.html"
    if not p.parent.is_dir():
        return f"--html {path}: the directory {str(p.parent)!r} does not exist"
    return None


def write_page(path: str, page) -> int:
    """Write ``page`` (an ExplorerPage); -> 0, or one line on stderr and 2 when it cannot be written."""
    try:
        written = page.save(path)
    except ValueError as e:
        print(f"error: --html: {e}", file=sys.stderr)
        return 2
    print(f"wrote {written} (open it in a browser; it needs no network)")
    return 0
