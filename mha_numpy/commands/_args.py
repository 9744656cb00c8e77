"""The command line's argument checks, in one place: every user mistake is one line and exit code 2.

- argparse ``type=`` functions (``positive_int``, ``probability``, ``output_dir``, ``image_file``, ...) refuse
  a bad single value while parsing; ``Parser`` prints argparse's errors as one line, without the usage block.
- ``UsageError`` is for rules across arguments (``check_heads``) and for files that cannot be written
  (``writing``); ``mha_numpy.__main__`` prints it, and a ``MissingDependency``, as one line and exits 2.
Nothing a user types should end in a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from pathlib import Path

IMAGE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg")  # what matplotlib's savefig writes without extra packages


class UsageError(Exception):
    """A command-line mistake found after parsing; its message names the argument."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``prog: error: message (see --help)``, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind, s: str):
    try:
        x = kind(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {s!r}") from None
    if kind is float and not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be finite, got {s!r}")
    return x


def _bounded(kind, ok, what: str):
    """An argparse type: ``kind(s)`` (int or float) that satisfies ``ok``, else an error saying ``what`` it must be."""

    def convert(s: str):
        x = _number(kind, s)
        if not ok(x):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return x

    convert.__name__ = what.replace(" ", "_")
    return convert


positive_int = _bounded(int, lambda x: x > 0, "a positive integer")
nonnegative_int = _bounded(int, lambda x: x >= 0, "a non-negative integer")
positive_float = _bounded(float, lambda x: x > 0, "a positive number")
nonnegative_float = _bounded(float, lambda x: x >= 0, "a non-negative number")
probability = _bounded(float, lambda x: 0.0 <= x < 1.0, "in [0, 1) (a dropout probability)")


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def output_dir(s: str) -> Path:
    """A directory to write into: an existing directory, or a new one whose nearest existing parent is one."""
    path = Path(s)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{s!r} is an existing file, not a directory")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create the directory {s!r}: {str(base)!r} is a file")
    return path


def image_file(s: str) -> Path:
    """An image to write: the extension picks the format (PNG without one); its directory must exist."""
    path = Path(s)
    ext = path.suffix.lower().lstrip(".")
    if ext and ext not in IMAGE_FORMATS:
        raise argparse.ArgumentTypeError(f"unknown image extension '.{ext}' in {s!r}: use one of {IMAGE_FORMATS}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{s!r} is a directory; give a file name such as {str(path / 'attn.png')!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the directory of {s!r} does not exist")
    return path


def image_format(path: Path) -> str:
    """The savefig format of ``path`` (see ``image_file``): its extension, or png when it has none."""
    return path.suffix.lower().lstrip(".") or "png"


def check_heads(embed_dim: int, heads: int) -> None:
    if embed_dim % heads:
        raise UsageError(f"argument --heads: {heads} does not divide --embed-dim {embed_dim}")


@contextlib.contextmanager
def writing(option: str, path):
    """Turn an OSError while writing ``path`` into a one-line UsageError naming ``option``."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"argument {option}: cannot write {str(path)!r}: {e.strerror or e}") from None


def make_dir(option: str, path: Path) -> Path:
    """Create the output directory ``path`` now, before the work, or raise a UsageError naming ``option``."""
    with writing(option, path):
        path.mkdir(parents=True, exist_ok=True)
        with open(path / ".mha_numpy_write_test", "w"):  # creatable is not enough: it must take files
            pass
        (path / ".mha_numpy_write_test").unlink()
    return path
