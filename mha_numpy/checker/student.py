"""Calling a student's functions: always on copies, with a check that they left their arguments as they were.

``call_checked`` is the one way a student's function is called, in this process (``InProcess``, a notebook's
namespace) and in the child process that runs a file (``checker.child``): the function gets deep copies of its
arguments, which are compared with the originals afterwards; a difference raises ``Mutated`` naming the
function and the argument (a forward that writes into its input, a backward that overwrites its cache). So a
student's function never changes the arrays the checker compares with, and an in-place update is a FAIL of the
function that did it, not a wrong verdict on another one.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

# bound when this module is imported (in the child: before the student's file runs), so that a file that
# rebinds copy.deepcopy or numpy.array_equal does not switch the mutation check off
_deepcopy = copy.deepcopy
_array_equal = np.array_equal
_asarray = np.asarray


class Mutated(Exception):
    """A student's function changed one of its arguments in place; the message is the row's detail."""


class StudentFault(Exception):
    """A student's function misbehaved in a way the verdict reports as is (the message is the row's detail)."""


class Abort(StudentFault):
    """The check of this function cannot go on: the call did not return in time, or the process running it died."""


def first_difference(a, b, path: str = "") -> str | None:
    """Where ``a`` first differs from ``b`` (``b`` the original): "" for the object itself, "[0]", ".steps['x']"...;
    None when they are equal (arrays element by element with NaN equal to NaN, containers and objects recursively;
    an object of another kind, a function or a random generator, is not compared)."""
    if isinstance(b, np.ndarray):
        return None if isinstance(a, np.ndarray) and _same_array(a, b) else path
    if isinstance(b, tuple | list):
        if type(a) is not type(b) or len(a) != len(b):
            return path
        return _first(first_difference(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(b, dict):
        if not isinstance(a, dict) or a.keys() != b.keys():
            return path
        return _first(first_difference(a[k], b[k], f"{path}[{k!r}]") for k in b)
    if b is None or isinstance(b, bool | int | float | complex | str | bytes | np.generic):
        return None if type(a) is type(b) and _same_array(_asarray(a), _asarray(b)) else path
    fields = _fields(b)
    if fields is None:
        return None
    if type(a) is not type(b):
        return path
    return _first(first_difference(getattr(a, k), getattr(b, k), f"{path}.{k}") for k in fields)


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    try:
        return bool(_array_equal(a, b, equal_nan=True))
    except TypeError:  # a dtype without NaN (bool, int, str, object)
        return bool(_array_equal(a, b))


def _first(differences) -> str | None:
    return next((d for d in differences if d is not None), None)


def _fields(obj) -> list[str] | None:
    """The attributes that make up ``obj`` (a dataclass's fields, an object's __dict__), or None: not comparable."""
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    if hasattr(obj, "__dict__") and not callable(obj) and not isinstance(obj, type):
        return list(vars(obj))
    return None


def mutation_detail(function: str, name: str, where: str) -> str:
    """The row's detail for ``function`` having changed its argument ``name`` (at ``where`` inside it)."""
    at = f" (at {name}{where})" if where else ""
    if name == "cache":
        return f"{function} modified its cache in place{at}: a backward must leave the cache as the forward made it"
    return f"{function} modified its argument {name} in place{at}: a pair never writes into its inputs"


def call_checked(function: str, fn, args: list[tuple[str, object]]):
    """``fn(*values)`` on deep copies of ``args`` ((name, value) pairs); Mutated if it changed one of them.

    SystemExit (``sys.exit`` inside the function) becomes a StudentFault; KeyboardInterrupt is let through
    (in a notebook it is the user stopping the cell).
    """
    originals = [value for _, value in args]
    try:
        given = _deepcopy(originals)
    except Exception:  # noqa: BLE001 - an argument that cannot be copied (a student's odd cache): no check
        given = None
    try:
        result = fn(*(originals if given is None else given))
    except SystemExit as e:
        raise StudentFault(f"raised SystemExit: {e.code} (sys.exit inside the function)") from None
    if given is not None:
        for (name, original), value in zip(args, given):
            where = first_difference(value, original)
            if where is not None:
                raise Mutated(mutation_detail(function, name, where))
    return result


class InProcess:
    """The functions of a namespace (a notebook's ``globals()``), called in this process: no time limit (stop
    the cell to interrupt an endless loop), the same copies and mutation checks as in a child process."""

    def __init__(self, namespace: dict):
        self.namespace = namespace
        self.names = [name for name, value in namespace.items() if callable(value)]

    def start(self, function: str) -> None:
        """Called before each function's check (a child process starts its time budget here)."""

    def call(self, function: str, args: list[tuple[str, object]], keep_cache: bool = True):
        return call_checked(function, self.namespace[function], args)

    def call_many(self, function: str, arg_lists: list) -> list:
        """``call`` on each argument list, the caches dropped (finite differences need the outputs only)."""
        return [self.call(function, args, keep_cache=False) for args in arg_lists]
