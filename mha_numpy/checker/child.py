"""The child process that runs a student's file: ``python -m mha_numpy.checker.child``, started by ``process``.

It takes the checker's requests on its stdin and answers on its stdout, which it moves out of the student's
reach first: the student's code reads an empty stdin, and what it prints goes to the output file the checker
gave as stderr. Requests: ``("load", path, shown)`` -> the names the file defines; ``("call", function, args,
keep_cache)`` -> the result, with a forward's cache kept here and replaced by a ``CacheRef``; ``("map",
function, list of args)`` -> the results of one call on each (caches dropped: finite differences); ``("quit",)``.
Every call goes through ``student.call_checked`` (copies, mutation check) and any BaseException of the
student's code (SystemExit, KeyboardInterrupt included) is a reply, never this process's end. The verdicts are
not made here: the checker compares what comes back with its own reference, in its own process.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from .load import StudentFileError, load_student
from .protocol import CacheRef, Unsendable, read_request, send_reply
from .student import Mutated, StudentFault, call_checked


def _streams() -> tuple[int, int]:
    """Keep stdin and stdout for the checker's messages; give the student /dev/null and the output file."""
    requests, replies = os.dup(0), os.dup(1)  # new descriptors, not inherited by the student's subprocesses
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # print() goes where stderr goes: the checker's output file
    return requests, replies


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

    def __init__(self):
        self.namespace: dict = {}
        self.caches: dict[int, object] = {}

    def load(self, path: str, shown: str) -> dict:
        try:
            self.namespace = load_student(path, shown)
        except StudentFileError as e:
            return {"kind": "error", "message": str(e)}
        names = [n for n, v in self.namespace.items() if callable(v) and n[:1] != "_"]
        modules = {n: str(getattr(self.namespace[n], "__module__", "") or "") for n in names}  # the file's, or not
        return {"kind": "loaded", "names": names, "modules": modules}

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
                result = call_checked(function, fn, args)
        except Mutated as e:
            return {"kind": "mutated", "detail": str(e)}
        except StudentFault as e:  # sys.exit inside the function
            return {"kind": "fault", "detail": str(e)}
        except BaseException as e:  # noqa: BLE001 - whatever the student's code raises is a verdict, not our end
            return _raised(e)
        if function.endswith("_forward") and isinstance(result, tuple) and len(result) == 2:
            cache = None
            if keep_cache:
                cache = CacheRef(len(self.caches))
                self.caches[cache.id] = result[1]
            result = (result[0], cache)
        return {"kind": "ok", "result": result}

    def call_many(self, function: str, arg_lists: list) -> dict:
        """``call`` on each argument list (caches dropped); the first reply that is not a result ends it."""
        results = []
        for args in arg_lists:
            reply = self.call(function, args, keep_cache=False)
            if reply["kind"] != "ok":
                return reply
            results.append(reply["result"])
        return {"kind": "ok", "result": results}


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


def main() -> None:
    _watch_parent()
    requests, replies = _streams()
    server = Server()
    send_reply(replies, {"kind": "ready"})
    while True:
        request = read_request(requests)
        if request[0] == "quit":
            break
        handle = {"load": server.load, "call": server.call, "map": server.call_many}[request[0]]
        reply = handle(*request[1:])
        _flush()
        try:
            send_reply(replies, reply)
        except Unsendable as e:
            send_reply(replies, {"kind": "unsendable", "detail": str(e)})
    _flush()
    os._exit(0)  # the student's threads, daemon or not, end with the process


if __name__ == "__main__":
    main()
