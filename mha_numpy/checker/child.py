"""The child process that runs a student's file: started by ``process`` (its ``BOOT`` lines), not as mha_numpy.

Its modules (this one, ``guard``, ``load``, ``protocol``, ``student``) are loaded from their files under another
package name, so the library is never imported here; ``guard`` is installed before the student's file runs and
refuses it to the student's code. Everything this process uses against the student's code (``call_checked``,
the copies, the comparison of arguments) is bound before that code runs: patching a module's name afterwards
(``sys.modules["__main__"].call_checked``, ``copy.deepcopy``, ``numpy.array_equal``) changes nothing here.

It takes the checker's requests on its stdin and answers on its stdout, which it moves out of the student's
reach first: the student's code reads an empty stdin, and what it prints goes to the output file the checker
gave as stderr. Requests: ``("load", path, shown)`` -> the names the file defines; ``("call", function, args,
keep_cache)`` -> the result, with a forward's cache kept here and replaced by a ``CacheRef``; ``("map",
function, list of args)`` -> the results of one call on each (caches dropped: finite differences);
``("stage", args, d_out)`` -> None, the inputs of exercise 13's systems stage kept here (``checker.systems``);
``("trim",)`` -> None, the caches dropped and the freed memory given back to the system; ``("measure", forward,
backward)`` -> ``forward`` then ``backward`` once on the staged inputs (dropped), the results kept here, and the
seconds this process counted (the checker measures the memory and the time itself, from outside); ``("measured",)``
-> those results, dropped here; ``("train", params, train_ids, sizes, settings)`` -> exercise 15's stage 4
(``checker.gpt_stages``): the parameters after ``gpt_child.train`` with the student's block backward, and the
training losses; ``("quit",)``.
Every call goes through ``student.call_checked`` (copies, mutation check) and any BaseException of the
student's code (SystemExit, KeyboardInterrupt included) is a reply, never this process's end. The verdicts are
not made here: the checker compares what comes back with its own reference, in its own process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
import threading
import time
import types

import numpy as np

from . import guard as _guard
from .load import StudentFileError, load_student
from .protocol import CacheRef, Unsendable, read_request, send_reply
from .student import Mutated, StudentFault, call_checked


def _streams() -> tuple[int, int]:
    """Keep stdin and stdout for the checker's messages; give the student /dev/null and the output file."""
    requests, replies = os.dup(0), os.dup(1)  # new descriptors, not inherited by the student's subprocesses
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # print() goes where stderr goes: the checker's output file
    return requests, replies


CAP_SYS_PTRACE, PR_CAPBSET_DROP, CAPABILITY_VERSION_3 = 19, 24, 0x20080522  # linux/capability.h, prctl.h


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_ptrace() -> bool:
    """Give up CAP_SYS_PTRACE for good (its bounding set too: nothing this process starts gets it back), so that
    the checker's /proc/<pid>/fd stays closed to the student's code even when the grader runs as root (the checker
    is not dumpable while a child lives). Linux only; False where it could not be done (not root: nothing to drop).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0)  # fails without CAP_SETPCAP: then it is not ours
        header, data = _CapHeader(CAPABILITY_VERSION_3, 0), (_CapData * 2)()
        if libc.capget(ctypes.byref(header), data) != 0:
            return False
        bit = ~(1 << CAP_SYS_PTRACE)
        data[0].effective, data[0].permitted, data[0].inheritable = (
            data[0].effective & bit,
            data[0].permitted & bit,
            data[0].inheritable & bit,
        )
        return libc.capset(ctypes.byref(header), data) == 0
    except (OSError, AttributeError):
        return False


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - the student may have replaced or closed it
            pass


def _raised(e: BaseException) -> dict:
    try:
        message = (str(e).splitlines() or [""])[0][:200]
    except Exception:  # noqa: BLE001 - an exception whose str() fails
        message = ""
    not_done = isinstance(e, NotImplementedError)
    return {"kind": "raised", "type": type(e).__name__, "message": message, "not_done": not_done}


class Server:
    """The student's namespace and the caches of the forward calls made so far."""

    def __init__(self, guard: _guard.LibraryGuard | None = None):
        self.namespace: dict = {}
        self.caches: dict[int, object] = {}
        self.guard = guard
        self.staged = None  # the next ``measure``'s inputs
        self.results = None  # the last ``measure``'s
        self.call_checked = call_checked  # bound now, before the student's file can rebind the module's name
        self.breach = _guard.breach

    def load(self, path: str, shown: str, listings: dict | None = None) -> dict:
        if self.guard is not None:
            self.guard.listings.update(listings or {})
        try:
            self.namespace = load_student(path, shown)
        except StudentFileError as e:
            return {"kind": "error", "message": str(e)}
        broken = self.breach(self.guard) if self.guard is not None else ""
        if broken:
            return {"kind": "error", "message": broken}
        names = [n for n, v in self.namespace.items() if callable(v) and n[:1] != "_"]
        modules = {n: str(getattr(self.namespace[n], "__module__", "") or "") for n in names}  # the file's, or not
        refused = list(self.guard.refused) if self.guard is not None else []
        return {"kind": "loaded", "names": names, "modules": modules, "refused": refused}

    def serve(self, namespace: dict) -> dict:
        """``load``'s reply for functions given, not a file's (the library's side of the systems stage)."""
        self.namespace = dict(namespace)
        return {"kind": "loaded", "names": list(namespace), "modules": {n: "" for n in namespace}, "refused": []}

    def call(self, function: str, args: list, keep_cache: bool) -> dict:
        fn = self.namespace.get(function)
        if not callable(fn):
            return {"kind": "raised", "type": "NameError", "message": f"{function} is not defined", "not_done": False}
        try:
            args = [(name, self.caches[v.id] if isinstance(v, CacheRef) else v) for name, v in args]
        except KeyError:
            return {
                "kind": "raised",
                "type": "LookupError",
                "message": "the forward's cache is gone",
                "not_done": False,
            }
        try:
            with np.errstate(all="ignore"):  # a NaN is reported in the row, not as a warning (as in-process)
                result = self.call_checked(function, fn, args)
        except Mutated as e:
            return {"kind": "mutated", "detail": str(e)}
        except StudentFault as e:  # sys.exit inside the function
            return {"kind": "fault", "detail": str(e)}
        except BaseException as e:  # noqa: BLE001 - whatever the student's code raises is a verdict, not our end
            return _raised(e)
        broken = self.breach(self.guard) if self.guard is not None else ""
        if broken:  # the call itself took the fence down: its result may be the library's
            return {"kind": "fault", "detail": broken}
        if function.endswith("_forward") and isinstance(result, tuple) and len(result) == 2:
            cache = None
            if keep_cache:
                cache = CacheRef(len(self.caches))
                self.caches[cache.id] = result[1]
            result = (result[0], cache)
        return {"kind": "ok", "result": result}

    def stage(self, args: list, d_out) -> dict:
        """Keep the inputs of the next ``measure`` (its request then carries none: the checker times the call)."""
        self.staged = ([v for _, v in args], d_out)
        return {"kind": "ok", "result": None}

    def measure(self, forward: str, backward: str) -> dict:
        """Exercise 13's systems stage: ``forward(*args)`` then ``backward(d_out, cache)`` once on the staged inputs,
        no copies (the checker watches this process's memory and times the request from outside); the results kept
        for ``measured``, the seconds this process counted as the reply (a cross-check, nothing more)."""
        fwd, bwd = self.namespace.get(forward), self.namespace.get(backward)
        if not (callable(fwd) and callable(bwd)):
            return {"kind": "raised", "type": "NameError", "message": f"{forward} or {backward} is not defined",
                    "not_done": False}  # fmt: skip
        if self.staged is None:
            return {"kind": "raised", "type": "LookupError", "message": "no inputs staged", "not_done": False}
        (values, d_out), self.staged, self.results = self.staged, None, None
        try:
            with np.errstate(all="ignore"):
                began = _clock()
                out, cache = fwd(*values)
                grads = bwd(d_out, cache)
                seconds = _clock() - began
        except BaseException as e:  # noqa: BLE001 - whatever the student's code raises is a verdict, not our end
            return _raised(e)
        self.results = (out, grads)
        return {"kind": "ok", "result": float(seconds)}

    def measured(self) -> dict:
        """The results of the last ``measure``, dropped here."""
        results, self.results = self.results, None
        return {"kind": "ok", "result": results}

    def trim(self) -> dict:
        """The forward caches and the last results dropped, the heap's free memory given back to the system
        (glibc's malloc_trim): a measured call then starts from what the process holds, not from what it freed."""
        self.caches.clear()
        self.results = None
        _collect()
        if _malloc_trim is not None:
            _malloc_trim(0)
        return {"kind": "ok", "result": None}

    def train(self, params: dict, train_ids, sizes: dict, settings: dict) -> dict:
        """Exercise 15's stage 4: ``gpt_child.train`` (loaded from its file now, after optim.py) with the file's
        ``capstone_block_backward`` and its pairs of ``gpt_child.GPT_PAIRS`` named in ``settings["pairs"]`` -> the
        trained parameters and the training losses (the checker computes the validation loss itself)."""
        trainer = types.ModuleType("gpt_child")
        _exec_source(trainer, _guard.LIBRARY_DIR / "optim.py")
        _exec_source(trainer, _guard.LIBRARY_DIR / "checker" / "gpt_child.py")
        space = self.namespace
        pairs = {n: (space[f"{n}_forward"], space[f"{n}_backward"]) for n in settings.get("pairs", ())}
        try:
            with np.errstate(all="ignore"):
                P, losses, _ = trainer.train(params, train_ids, sizes, space["capstone_block_backward"], pairs,
                                             **{k: settings[k] for k in ("steps", "batch", "lr", "seed")})  # fmt: skip
        except BaseException as e:  # noqa: BLE001 - whatever the student's code raises is a verdict, not our end
            return _raised(e)
        return {"kind": "ok", "result": (P, [float(x) for x in losses])}

    def call_many(self, function: str, arg_lists: list) -> dict:
        """``call`` on each argument list (caches dropped); the first reply that is not a result ends it."""
        results = []
        for args in arg_lists:
            reply = self.call(function, args, keep_cache=False)
            if reply["kind"] != "ok":
                return reply
            results.append(reply["result"])
        return {"kind": "ok", "result": results}


def _libc_malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


_clock, _collect, _malloc_trim = time.perf_counter, gc.collect, _libc_malloc_trim()  # bound before the file runs
_exec_source = _guard._exec_source  # bound before the student's file runs


def _watch_parent(interval: float = 0.5) -> None:
    """End this process as soon as the checker that started it is gone (killed, say, while the student's code runs
    an endless loop, when no one is left to enforce the time limit): an orphan would run that loop forever. A daemon
    thread, so it runs beside the student's code (which gives up the GIL every few milliseconds)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:  # re-parented: the checker died
                os._exit(1)

    threading.Thread(target=watch, name="mha_numpy-watch-parent", daemon=True).start()


def main(namespace: dict | None = None) -> None:
    """Serve the checker's requests. ``namespace``: the library's side of exercise 13's systems stage
    (``checker.systems``), these functions instead of a student's file; no guard then (nothing unread runs)."""
    _drop_ptrace()
    _watch_parent()
    guard = _guard.install() if namespace is None else None  # before anything of the student's runs
    requests, replies = _streams()
    sys.argv[:] = [""]  # the student's file learns nothing of how the checker started this process
    server = Server(guard)
    handlers = {
        "load": server.load if namespace is None else lambda *_: server.serve(namespace),
        "call": server.call,
        "map": server.call_many,
        "stage": server.stage,
        "measure": server.measure,
        "measured": server.measured,
        "trim": server.trim,
        "train": server.train,
    }  # bound before the file runs
    send_reply(replies, {"kind": "ready"})
    while True:
        request = read_request(requests)
        if request[0] == "quit":
            break
        reply = handlers[request[0]](*request[1:])
        reply["refused"] = (
            list(guard.refused) if guard is not None else []
        )  # the imports of the library refused so far, for the grade's warning
        _flush()
        try:
            send_reply(replies, reply)
        except Unsendable as e:
            send_reply(replies, {"kind": "unsendable", "detail": str(e)})
    _flush()
    os._exit(0)  # the student's threads, daemon or not, end with the process


if __name__ == "__main__":
    main()
