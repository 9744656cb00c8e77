"""Measure the code figures of issue 34 and print them as a table (``--json``: the same figures, for tests).

    python scripts/code_figures.py              # the table
    python scripts/code_figures.py --list       # + every public function, method and class without a docstring
    python scripts/code_figures.py --json       # one JSON object
    python scripts/code_figures.py --package DIR   # another package directory (default: mha_numpy/)

The figures, read from the source with ``ast`` (nothing is imported):

1. **Long functions in the module wing.** The wing is the package's ``attention.py``, ``steps.py``, ``flow.py``,
   ``latent*.py`` and ``kv_cache.py`` (top level of the package). A function's length is its lines from the ``def``
   line to its last line, both included (decorators not counted, docstring and comments counted): ``end_lineno -
   lineno + 1``. Every function and method counts, nested ones too; over 40 lines is listed with its length.
2. **Long files.** Every ``*.py`` file under the package, any depth; its length is its number of lines
   (``len(text.splitlines())``); over 300 lines is counted and listed.
3. **Public names without a docstring.** Public means no leading underscore in the module path (each directory
   below the package and the file name; ``__init__.py`` stands for its package, so it is public when its package
   is) nor in the name. The names are the module's functions and classes and the methods of its classes, at any
   depth of class nesting, where every enclosing class is public too (a method of ``_Tiles`` is not public;
   ``__init__`` and ``__call__`` are not, having a leading underscore); functions defined inside a function are
   not reachable, so not counted. A ``def`` or ``class`` under a module-level ``if``/``try``/``with`` counts as the
   module's. A docstring is what ``ast.get_docstring`` finds (a string literal as the first statement), non-empty.
   The share is undocumented / public, over the whole package.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WING = ("attention.py", "steps.py", "flow.py", "latent*.py", "kv_cache.py")  # file names at the package's top
MAX_FUNCTION_LINES = 40  # the limit in the wing
MAX_FILE_LINES = 300


def module_is_public(relative: Path) -> bool:
    """relative: a file's path below the package; no leading underscore in a directory or in the module's name."""
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]  # the package itself
    return not any(part.startswith("_") for part in parts)


def functions(tree: ast.AST, prefix: str = ""):
    """Every function and method under ``tree`` (nested ones too) as (qualified name, node)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def public_definitions(tree: ast.AST, prefix: str = ""):
    """The public functions, classes and methods of a module as (qualified name, node); see the module docstring."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name.startswith("_"):
                continue
            yield prefix + node.name, node
            if isinstance(node, ast.ClassDef):
                yield from public_definitions(node, f"{prefix}{node.name}.")
        elif not isinstance(node, ast.expr):  # if / try / with / for blocks at module or class level
            yield from public_definitions(node, prefix)


def measure(package: Path) -> dict:
    """The three figures for the package directory ``package``."""
    long_functions, long_files, public, undocumented = [], [], 0, []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        name = (package.name / relative).as_posix()
        if lines > MAX_FILE_LINES:
            long_files.append({"file": name, "lines": lines})
        tree = ast.parse(text, filename=str(path))
        if len(relative.parts) == 1 and any(fnmatch(relative.name, pattern) for pattern in WING):
            for qualname, node in functions(tree):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append({"file": name, "function": qualname, "lines": length})
        if module_is_public(relative):
            for qualname, node in public_definitions(tree):
                public += 1
                if not ast.get_docstring(node):
                    undocumented.append(f"{name}:{node.lineno} {qualname}")
    return {
        "package": package.name,
        "wing_functions_over_40": long_functions,
        "files_over_300": long_files,
        "public": public,
        "public_undocumented": len(undocumented),
        "undocumented_share": len(undocumented) / public if public else 0.0,
        "undocumented": undocumented,
    }


def table(figures: dict, listing: bool) -> str:
    """The figures as a Markdown table, then the lists."""
    f = figures
    rows = [
        "| figure | value | issue 34's target |",
        "|---|---|---|",
        f"| functions over {MAX_FUNCTION_LINES} lines in the module wing | {len(f['wing_functions_over_40'])} | 0 |",
        f"| files over {MAX_FILE_LINES} lines in {f['package']}/ | {len(f['files_over_300'])} | ≤ 20 |",
        f"| public functions/methods/classes without a docstring | {f['public_undocumented']} of {f['public']} "
        f"({100 * f['undocumented_share']:.1f} %) | ≤ 15 % |",
        "",
        f"Functions over {MAX_FUNCTION_LINES} lines in the module wing ({', '.join(WING)}):",
        *(f"  {x['lines']:4d}  {x['file']}  {x['function']}" for x in f["wing_functions_over_40"]),
        "",
        f"Files over {MAX_FILE_LINES} lines:",
        *(f"  {x['lines']:4d}  {x['file']}" for x in sorted(f["files_over_300"], key=lambda x: -x["lines"])),
    ]
    if listing:
        rows += ["", "Public names without a docstring:", *(f"  {x}" for x in f["undocumented"])]
    return "\n".join(rows)


def main(argv=None) -> int:
    """Parse the arguments, measure, print; 0, or 2 for a package directory that does not exist."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, default=ROOT / "mha_numpy", help="the package directory to measure")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--list", action="store_true", help="list the public names without a docstring")
    args = parser.parse_args(argv)
    if not args.package.is_dir():
        parser.error(f"argument --package: {args.package} is not a directory")
    figures = measure(args.package)
    print(json.dumps(figures, indent=1) if args.json else table(figures, args.list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
