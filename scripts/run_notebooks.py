"""Re-execute the notebooks top to bottom and save them in place, with their outputs.

    python scripts/run_notebooks.py                      # every notebooks/*.ipynb
    python scripts/run_notebooks.py notebooks/01_*.ipynb  # only these

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
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
DEFAULT_TIMEOUT = 60.0


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


def missing_packages(nb: nbformat.NotebookNode) -> list[str]:
    """The packages ``nb`` declares in its metadata (``mha_numpy.needs``) that are not installed."""
    needs = nb.metadata.get("mha_numpy", {}).get("needs", [])
    return [name for name in needs if importlib.util.find_spec(name) is None]


def run_all(paths: list[Path], timeout: float) -> int:
    """Execute every notebook in memory, then write them all; on any failure write none and return 1."""
    done = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        missing = missing_packages(nb)
        if missing:
            print(f"{path}: skipped, it needs {', '.join(missing)}: pip install -r requirements-dev.txt")
            continue
        start = time.monotonic()
        try:
            execute_notebook(nb, path.parent, timeout)
        except Exception as e:  # CellExecutionError, CellTimeoutError, TimeoutError, a dead kernel
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            print(f"{path}: FAILED ({first}); no notebook was written", file=sys.stderr)
            return 1
        done.append((path, nb, time.monotonic() - start))
    for path, nb, seconds in done:
        tmp = path.with_name(path.name + ".tmp")
        nbformat.write(nb, tmp)
        os.replace(tmp, path)  # each file is replaced whole
        print(f"{path}: executed and saved ({seconds:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per notebook (default 60)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if not paths:
        print(f"no notebooks found in {NOTEBOOK_DIR}", file=sys.stderr)
        return 1
    return run_all(paths, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
