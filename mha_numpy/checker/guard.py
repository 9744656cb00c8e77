"""The child process's import guard: a checked file cannot use the library, whose pairs hold the answers.

Installed first in ``sys.meta_path`` by ``checker.child`` before the student's file runs (the child itself
never imports ``mha_numpy``: its own modules are loaded from their files under another name). Every import
of ``mha_numpy`` or a submodule, however it is spelled (``import``, ``from ... import``, ``__import__``,
``importlib.import_module``), goes through ``LibraryGuard.find_spec``. What an exercise's own cells use
(``EXERCISE_MODULES``) is served by stand-ins that hold no answer:

- ``mha_numpy.optim``: the optimizers and clipping (the real file: it needs NumPy only).
- ``mha_numpy.train``: the toy tasks (``TASKS``, ``make_batch``, ``ideal_attention``, ``attention_share``,
  copied from the real file) and the optimizers; not ``train`` nor the model, whose backward is exercise 9's.
- ``mha_numpy.checker`` with ``capstone`` and ``capstone_block``: ``forward_listing()`` (the forward the
  exercise gives); ``compare`` and ``train`` say that they run in the notebook, not in the checker's process.
- ``mha_numpy.checker.short_answers``: ``check`` of the inline questions' forms says that it runs in the notebook
  (the teacher's grade reads the forms from the notebook's text, ``checker.written``).

Everything else is refused: the import itself succeeds (a leftover debugging import does not stop the file),
but every name it gives is a ``Refused`` placeholder that raises ``LibraryRefused`` when called, so a function
that is, or calls, the library's FAILs with a message naming it, and the student's other functions are checked.
``refused`` lists what was asked for (the grade's warning). ``sys.modules`` holds nothing else of the library, so no
attribute path (``reference.F``, a capstone's ``reference_grads``) leads to it. The guard is a fence, not a
sandbox: code that sets out to remove it and load the library's files by hand runs on the grading machine
(docs/course.md, For teachers).
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

LIBRARY = "mha_numpy"
LIBRARY_DIR = Path(__file__).resolve().parents[1]  # the mha_numpy directory: the files the stand-ins copy from
TRAIN_NAMES = ("TASKS", "make_batch", "ideal_attention", "attention_share")  # train.py's tasks: NumPy only
OPTIM_NAMES = ("SGD", "Adam", "AdamW", "clip_grad_norm", "global_norm", "warmup_linear")
EXERCISE_MODULES = (
    "mha_numpy",
    "mha_numpy.optim",
    "mha_numpy.train",
    "mha_numpy.checker",
    "mha_numpy.checker.capstone",
    "mha_numpy.checker.capstone_block",
    "mha_numpy.checker.short_answers",
)
NOT_HERE = "runs in the exercise notebook, not in the checker's process (the checker compares in its own)"
ASKED: list[str] = []  # what the file asked for of the library that it did not get (LibraryGuard.refused)


def _asked(name: str) -> None:
    if name not in ASKED:
        ASKED.append(name)


class LibraryRefused(ImportError):
    """An import of the library refused in the child: the message says why and what is importable."""


def refusal(name: str) -> str:
    """The message of a refused import of ``name``."""
    return (
        f"{name} is refused: the checker runs files without the mha_numpy library, whose pairs hold the answers "
        "(allowed: numpy, mha_numpy.train's tasks and optimizers)"
    )


def _module(name: str, doc: str, package: bool = False) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__file__ = None
    if package:
        module.__path__ = []  # a package with no directory: nothing below it is found but the guard's stand-ins
    return module


def _exec_source(module: types.ModuleType, path: Path, names: tuple[str, ...] | None = None) -> None:
    """Run the file at ``path`` (or only its top-level definitions of ``names``) in ``module``: a file that
    imports NumPy and the standard library only (its ``from .x import`` lines are never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    keep = []
    for node in tree.body:
        defined = {getattr(node, "name", None)} | {
            t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)
        }
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            keep.append(node)
        elif isinstance(node, ast.Import) and all(a.name == "numpy" or a.name in sys.stdlib_module_names
                                                      for a in node.names):  # fmt: skip
            keep.append(node)
        elif names is None or defined & set(names):
            if isinstance(node, ast.Import | ast.ImportFrom):
                continue  # the library's own imports: not here
            keep.append(node)
    tree.body = keep
    exec(compile(tree, str(path), "exec"), vars(module))  # noqa: S102 - the library's own file


def _capstone(name: str, listing: str, capstone: str) -> types.ModuleType:
    module = _module(name, f"A stand-in for {name} in the checker's process: forward_listing() only.")

    def forward_listing() -> str:
        return listing

    def compare(*args, **kwargs) -> str:
        return f"capstone.compare {NOT_HERE}"

    def train(*args, **kwargs):
        raise NotImplementedError(f"capstone.train {NOT_HERE}")

    module.forward_listing, module.compare, module.train = forward_listing, compare, train
    setattr(module, capstone, f"{capstone} (a stand-in: the capstone is graded in the checker's process)")
    module.__getattr__ = _missing(name)
    return module


def _checker(name: str) -> types.ModuleType:
    module = _module(name, "A stand-in for mha_numpy.checker in the checker's process.", package=True)

    def check_namespace(*args, **kwargs) -> str:
        return f"check_namespace {NOT_HERE}"

    module.check_namespace = module.check_file = check_namespace
    module.__getattr__ = _missing(name)
    return module


class Refused:
    """A name of the library in the child: calling it raises LibraryRefused naming it; its attributes are more of
    the same (``F.softmax_forward``), its ``__module__`` the module it would come from (the grade reads it)."""

    def __init__(self, name: str):
        vars(self)["name"] = name
        vars(self)["__module__"] = name.rpartition(".")[0]

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return Refused(f"{vars(self)['name']}.{attribute}")

    def __call__(self, *args, **kwargs):
        raise LibraryRefused(refusal(vars(self)["name"]))

    def __repr__(self) -> str:
        return f"<{vars(self)['name']}: refused in the checker's process>"


def _missing(name: str):
    def __getattr__(attribute: str):
        if attribute.startswith("__") or f"{name}.{attribute}" in EXERCISE_MODULES:
            raise AttributeError(attribute)  # a stand-in submodule: the import system loads it
        if name in EXERCISE_MODULES:
            _asked(f"{name}.{attribute}")  # a name a stand-in does not have (a refused module is asked for as such)
        return Refused(f"{name}.{attribute}")

    return __getattr__


def refused_module(name: str) -> types.ModuleType:
    """What the child gives for a module of the library that is refused: every name of it a ``Refused``."""
    module = _module(name, f"{name} is refused in the checker's process: its names raise LibraryRefused.", True)
    module.__getattr__ = _missing(name)
    return module


def standin(name: str, listings: dict[str, str]) -> types.ModuleType:
    """The module the child gives for ``name`` of ``EXERCISE_MODULES`` (``listings``: each capstone's forward)."""
    if name == LIBRARY:
        module = _module(name, "A stand-in for mha_numpy in the checker's process.", package=True)
        module.__getattr__ = _missing(name)
    elif name == "mha_numpy.optim":
        module = _module(name, "mha_numpy.optim (the real file: NumPy only).")
        _exec_source(module, LIBRARY_DIR / "optim.py")
    elif name == "mha_numpy.train":
        module = _module(name, "mha_numpy.train's tasks and the optimizers, in the checker's process.")
        _exec_source(module, LIBRARY_DIR / "_checks.py")  # the argument checks the tasks call (NumPy only)
        _exec_source(module, LIBRARY_DIR / "train.py", TRAIN_NAMES)
        optim = importlib.import_module("mha_numpy.optim")  # the same classes as ``from mha_numpy.optim import``
        for n in OPTIM_NAMES:
            setattr(module, n, getattr(optim, n))
        module.__getattr__ = _missing(name)
    elif name == "mha_numpy.checker":
        module = _checker(name)
    elif name == "mha_numpy.checker.short_answers":
        module = _module(name, "A stand-in for the inline questions' forms in the checker's process.")
        module.check = lambda *args, **kwargs: f"short_answers.check {NOT_HERE}"
        module.__getattr__ = _missing(name)
    else:
        short = name.rsplit(".", 1)[1]
        module = _capstone(name, listings.get(short, ""), "MODEL" if short == "capstone" else "BLOCK")
    return module


class _StandinLoader(importlib.abc.Loader):
    def __init__(self, guard: LibraryGuard):
        self.guard = guard

    def create_module(self, spec):
        if spec.name not in EXERCISE_MODULES:
            return refused_module(spec.name)
        return standin(spec.name, self.guard.listings)

    def exec_module(self, module) -> None:
        pass


class LibraryGuard(importlib.abc.MetaPathFinder):
    """Gives the stand-ins of ``EXERCISE_MODULES`` and refused modules for the rest of ``mha_numpy``; ``refused``:
    the modules of the library the file asked for that are not stand-ins."""

    def __init__(self, listings: dict[str, str] | None = None):
        self.listings = dict(listings or {})
        self.refused = ASKED

    def find_spec(self, fullname, path=None, target=None):
        if fullname != LIBRARY and not fullname.startswith(LIBRARY + "."):
            return None
        standin = fullname in EXERCISE_MODULES
        if not standin:
            _asked(fullname)
        package = not standin or fullname in (LIBRARY, "mha_numpy.checker")
        return importlib.machinery.ModuleSpec(fullname, _StandinLoader(self), is_package=package)


def breach(guard: LibraryGuard) -> str:
    """What the student's code did to the fence, or "": ``guard`` gone from ``sys.meta_path``, or a module of the
    library loaded from its file (a stand-in and a refused module have no ``__file__``). The child asks after
    loading the file and after every call, and fails the file (or the call) with this sentence."""
    if not any(finder is guard for finder in sys.meta_path):
        return "the file removed the checker's import guard from sys.meta_path: the library's answers are not allowed"
    for name, module in list(sys.modules.items()):
        if not isinstance(name, str) or not (name == LIBRARY or name.startswith(LIBRARY + ".")):
            continue
        try:
            loaded = getattr(module, "__file__", None) is not None
        except Exception:  # noqa: BLE001 - an object of the student's whose __file__ raises: not a stand-in
            loaded = True
        if loaded:
            return f"the file loaded {name} past the checker's import guard: the library's answers are not allowed"
    return ""


def install(listings: dict[str, str] | None = None) -> LibraryGuard:
    """Put a LibraryGuard first in ``sys.meta_path`` and forget any library module already imported."""
    for name in [n for n in sys.modules if n == LIBRARY or n.startswith(LIBRARY + ".")]:
        del sys.modules[name]
    guard = LibraryGuard(listings)
    sys.meta_path.insert(0, guard)
    return guard
