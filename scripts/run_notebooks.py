"""Re-execute the notebooks top to bottom and save them in place, with their outputs.

    python scripts/run_notebooks.py                      # every notebooks/*.ipynb
    python scripts/run_notebooks.py notebooks/01_*.ipynb  # only these
    python scripts/run_notebooks.py --check              # re-execute, write nothing: exit 1 on a real change

All notebooks are executed first, in memory; only when every one succeeded are they written, so a failure
never leaves the tree half-rewritten. A notebook that declares packages it needs in its metadata
(``"mha_numpy": {"needs": ["torch"]}``: 04, 05 and 07, the comparisons with PyTorch) is skipped, with a
message, when one of them is not installed (a runtime-only install); the dev install
(``pip install -r requirements-dev.txt``) runs them all.

Each notebook runs in a fresh kernel (the ``python3`` kernel of the running interpreter), in its
own directory, with PYTHONHASHSEED=0 and matplotlib's inline backend, and must finish within the
time budget (``--timeout``, default 60 s for the whole notebook; the kernel is interrupted when it
runs out). No timing metadata is recorded, so re-running a seeded notebook changes no numbers.
``tests/test_notebooks.py`` uses ``execute_notebook`` from here, so CI runs them the same way.

Noise is not a change. Numbers that differ by rounding (another CPU's BLAS, AVX2 against AVX-512) printed in the
same format, PNGs whose bytes differ but whose pixels do not (each within ``PIXEL_TOLERANCE``) and a stream split
into other chunks (``meaningful``) are the same output (``same_output``); nothing else is noise: another printed
format (``1.67e-16`` then ``1.7e-16``), a changed title or tick label in a figure, a timing. A cell is kept or
replaced whole: when every one of its new outputs is the same as its committed one it keeps the committed ones,
otherwise it takes all of the new run's (never a committed figure beside a new table). A notebook with no cell
changed is not written at all, so a re-run leaves the tree as it was unless something really changed. ``--check``
writes nothing and lists each changed cell (exit 1), for a contributor to tell a real change from noise.
"""

from __future__ import annotations

import argparse
import base64
import copy
import difflib
import importlib.util
import io
import math
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
DEFAULT_TIMEOUT = 60.0
# two numbers are the same output when they agree to REL_TOLERANCE relative, or are both rounding-level small
REL_TOLERANCE, NOISE_FLOOR = 1e-9, 1e-12
# the largest |difference| of any channel of any pixel, in 0..1, for two PNGs of one size: one step of a 256-entry
# colormap (at most 4.6/255 among matplotlib's, coolwarm's) is what a value on a bin edge moves by; a glyph, a tick
# label or a line that moved changes pixels by up to 1, but by only ~0.001 on average (a mean lets it through)
PIXEL_TOLERANCE = 5 / 255
# a float printed in full (repr/str: the shortest string that reads back as it, 15 to 17 significant digits, or 0.0)
# changes its length and notation with its value, not with its format
FULL_DIGITS = 15
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def kernel_env() -> dict[str, str]:
    """The kernel's environment: ours, seeded hashing, and no MPLBACKEND (so the inline backend is used)."""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["PYTHONHASHSEED"] = "0"
    return env


def execute_notebook(nb: nbformat.NotebookNode, cwd: Path, timeout: float = DEFAULT_TIMEOUT) -> nbformat.NotebookNode:
    """Execute ``nb`` (in memory, modified in place and returned) in a fresh kernel working in ``cwd``.

    ``timeout`` bounds the whole notebook: every cell gets the time left of the budget, counted from
    the start of the first cell, and a cell that exceeds it is interrupted (nbclient raises
    ``CellTimeoutError``). An error in a cell raises ``CellExecutionError``.
    """
    deadline: list[float] = []

    def time_left(cell) -> int:
        if not deadline:
            deadline.append(time.monotonic() + timeout)
        left = deadline[0] - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the notebook used up its {timeout:g} s budget before this cell:\n{cell.source[:200]}")
        return max(1, math.ceil(left))

    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout_func=time_left,
        startup_timeout=120,
        record_timing=False,
        allow_errors=False,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute(env=kernel_env())
    return nb


def printed_format(number: str) -> tuple[bool, int | None]:
    """How ``number`` is printed: in e-notation or not, and its digits after the point (None without a point)."""
    mantissa = number.lower().partition("e")[0]
    return "e" in number.lower(), len(mantissa.partition(".")[2]) if "." in mantissa else None


def printed_in_full(number: str) -> bool:
    """``number`` is a float's repr (``str(x)``, ``f"{x}"``) carrying every digit (FULL_DIGITS), or zero."""
    digits = number.lower().partition("e")[0].replace(".", "").lstrip("+-0")
    return repr(float(number)) == number and (float(number) == 0 or len(digits) >= FULL_DIGITS)


def same_number(x: str, y: str) -> bool:
    """Two printed numbers that differ by rounding only: in one format (or both floats printed in full), and equal to
    REL_TOLERANCE relative or both below NOISE_FLOOR. Another format is a change even for two tiny numbers."""
    if x == y:
        return True
    if printed_format(x) != printed_format(y) and not (printed_in_full(x) and printed_in_full(y)):
        return False
    u, v = float(x), float(y)
    return abs(u - v) <= REL_TOLERANCE * max(abs(u), abs(v)) or max(abs(u), abs(v)) < NOISE_FLOOR


def same_text(a: str, b: str) -> bool:
    """The same text but for numbers that differ by rounding (``same_number``)."""
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        return False
    return all(map(same_number, NUMBER.findall(a), NUMBER.findall(b)))


def same_png(a: str, b: str) -> bool:
    """Two base64 PNGs with the same size and every pixel within PIXEL_TOLERANCE (their bytes may differ)."""
    if a == b:
        return True
    import numpy as np
    from matplotlib import image

    x, y = (image.imread(io.BytesIO(base64.b64decode(s)), format="png") for s in (a, b))
    return x.shape == y.shape and float(np.abs(x.astype(float) - y.astype(float)).max()) <= PIXEL_TOLERANCE


def same_output(a, b) -> bool:
    """Two outputs of a code cell that differ by noise only (numbers by rounding, PNGs by their bytes)."""
    if a.get("output_type") != b.get("output_type") or a.get("name") != b.get("name"):
        return False
    if "text" in a or "text" in b:  # a stream
        return same_text("".join(a.get("text", "")), "".join(b.get("text", "")))
    da, db = a.get("data", {}), b.get("data", {})
    if set(da) != set(db):
        return False
    for mime in da:
        x, y = ("".join(v) if isinstance(v, list) else v for v in (da[mime], db[mime]))
        if not (same_png(x, y) if mime == "image/png" else same_text(str(x), str(y))):
            return False
    return True


def meaningful(outputs) -> list:
    """A cell's outputs as a reader sees them: consecutive chunks of one stream joined (how a kernel splits a
    stream depends on timing), whitespace-only stream chunks dropped."""
    out = []
    for o in outputs:
        if o.get("output_type") == "stream":
            if out and out[-1].get("output_type") == "stream" and out[-1].get("name") == o.get("name"):
                out[-1] = {**out[-1], "text": "".join(out[-1]["text"]) + "".join(o.get("text", ""))}
                continue
            o = {**o, "text": "".join(o.get("text", ""))}
        out.append(o)
    return [o for o in out if not (o.get("output_type") == "stream" and not o["text"].strip())]


def keep_committed(new: nbformat.NotebookNode, old: nbformat.NotebookNode) -> list[int]:
    """Give each cell of ``new`` whose outputs are all ``old``'s but for noise ``old``'s outputs, all of them; a cell
    with one output changed keeps all of the new run's. The indices of the code cells that really changed (all of
    them when the cells themselves differ; a cell ``old`` never ran too)."""
    changed = []
    cells = zip(new.cells, old.cells, strict=False) if len(new.cells) == len(old.cells) else []
    if not cells:
        return [i for i, c in enumerate(new.cells) if c.cell_type == "code"]
    for i, (c, o) in enumerate(cells):
        if c.cell_type != "code":
            continue
        x, y = meaningful(c.outputs), meaningful(o.outputs)
        first_run = o.execution_count is None and c.execution_count is not None  # a new notebook's silent cell
        if not first_run and c.source == o.source and len(x) == len(y) and all(map(same_output, x, y)):
            c.outputs = copy.deepcopy(o.outputs)  # the count stays the new run's: cells added above shift it
            if c.execution_count != o.execution_count:
                changed.append(i)
        else:
            changed.append(i)
    return changed


def describe_change(new_cell, old_cell, lines: int = 12) -> str:
    """The first lines of a diff of a changed cell's text outputs (a figure shows as its mime type)."""

    def text(cell) -> list[str]:
        out = [cell.source, "---"]
        for o in cell.outputs:
            data = o.get("data", {})
            out.append(f"[{o.output_type} {o.get('name', '')}]".replace(" ]", "]"))
            out.append("".join(o.get("text", "")) or "".join(data.get("text/plain", "")))
            out += [f"[{mime}]" for mime in data if mime.startswith("image/")]
        return "\n".join(out).splitlines()

    diff = difflib.unified_diff(text(old_cell), text(new_cell), "committed", "re-executed", lineterm="", n=0)
    return "\n".join(list(diff)[:lines])


def missing_packages(nb: nbformat.NotebookNode) -> list[str]:
    """The packages ``nb`` declares in its metadata (``mha_numpy.needs``) that are not installed."""
    needs = nb.metadata.get("mha_numpy", {}).get("needs", [])
    return [name for name in needs if importlib.util.find_spec(name) is None]


def run_all(paths: list[Path], timeout: float, check: bool = False) -> int:
    """Execute every notebook in memory, then write those that really changed (none on any failure; none with
    ``check``, which returns 1 when one changed)."""
    done = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        missing = missing_packages(nb)
        if missing:
            print(f"{path}: skipped, it needs {', '.join(missing)}: pip install -r requirements-dev.txt")
            continue
        committed = copy.deepcopy(nb)
        start = time.monotonic()
        try:
            execute_notebook(nb, path.parent, timeout)
        except Exception as e:  # CellExecutionError, CellTimeoutError, TimeoutError, a dead kernel
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            print(f"{path}: FAILED ({first}); no notebook was written", file=sys.stderr)
            return 1
        done.append((path, nb, committed, keep_committed(nb, committed), time.monotonic() - start))
    changed = 0
    for path, nb, committed, cells, seconds in done:
        if not cells:
            print(f"{path}: executed, outputs as committed but for noise ({seconds:.1f} s)")
            continue
        changed += 1
        if check:
            print(f"{path}: CHANGED in code cells {', '.join(map(str, cells))} ({seconds:.1f} s)")
            if len(nb.cells) == len(committed.cells):
                for i in cells:
                    print(describe_change(nb.cells[i], committed.cells[i]))
            continue
        tmp = path.with_name(path.name + ".tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, path)  # each file is replaced whole
        print(f"{path}: executed and saved, code cells {', '.join(map(str, cells))} changed ({seconds:.1f} s)")
    return 1 if check and changed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per notebook (default 60)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if an output really changed")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if not paths:
        print(f"no notebooks found in {NOTEBOOK_DIR}", file=sys.stderr)
        return 1
    return run_all(paths, args.timeout, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
