"""``verify``'s loading and writing, shared by its two modes (``verify`` and ``verify_flex``): a target's module
(a module name or a .py file) and its attributes, with one-line errors naming the option (``UsageError``) or the
import that raised (``CannotImport``, exit 3); the report's --json and --html files; the exit codes."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

from ..testing.verify import Exited
from ._args import UsageError, writing
from .verify_process import CannotImport

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT_IMPORT = 0, 1, 2, 3


def is_file(module_part: str) -> bool:
    """Whether a target's module part names a .py file (or a path) rather than a module."""
    return module_part.endswith(".py") or "/" in module_part


def import_target(module_part: str, option: str = "MODULE:FUNCTION"):
    """The module of a target (a module name or a .py file); UsageError, or CannotImport when it raises."""
    path = Path(module_part)
    if is_file(module_part):
        name = "_verify_target_" + "".join(c if c.isalnum() else "_" for c in path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))  # its own helper modules next to it
        runner = lambda: spec.loader.exec_module(module)  # noqa: E731
    else:
        runner, module = None, None
    try:
        if runner is not None:
            runner()
            return module
        return importlib.import_module(module_part)
    except ModuleNotFoundError as e:
        if runner is None and e.name and module_part.startswith(e.name):
            raise UsageError(f"argument {option}: no module named {e.name!r}") from None
        _cannot_import(module_part, e)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - whatever it raises (SystemExit too) while importing: one line, exit 3
        _cannot_import(module_part, e)


def _cannot_import(module_part: str, e: BaseException):
    if isinstance(e, (SystemExit, Exited)):
        how = "os._exit" if isinstance(e, Exited) else "sys.exit"
        raise CannotImport(f"importing {module_part} called {how}({e.code!r})")
    message = " ".join(str(e).split())[:200]
    raise CannotImport(f"importing {module_part} raised {type(e).__name__}: {message}")


def attribute(module, module_part: str, attr: str, option: str = "MODULE:FUNCTION"):
    """module.attr (dotted); UsageError naming ``option`` when it has none."""
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"argument {option}: {module_part} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def check_output(option: str, path: str | None) -> None:
    """A file to write must be writable before the run: not a directory, its directory existing."""
    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"argument {option}: {path!r} is a directory, give a file name")
    if not p.parent.is_dir():
        raise UsageError(f"argument {option}: the directory of {path!r} does not exist")


def write_report(args, report) -> None:
    """--json (a file, or - for stdout instead of the table) and --html."""
    if args.json == "-":
        print(json.dumps(report.to_dict(), indent=1))
    elif args.json:
        with writing("--json", args.json):
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=1))
        print(f"wrote {args.json}")
    if args.html:
        with writing("--html", args.html):
            Path(args.html).write_text(report.to_html(), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr if args.json == "-" else sys.stdout)
