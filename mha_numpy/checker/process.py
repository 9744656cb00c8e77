"""A student's file run in a child process, with a time limit: the checker's side of ``checker.child``.

``ChildProcess(path, timeout)`` starts ``python -m mha_numpy.checker.child`` with a clean environment (only
PATH, HOME and the locale are passed on; PYTHONPATH is the directory of this mha_numpy), in a fresh temporary
working directory, in its own process group, and has it import the file. Then it offers what ``InProcess``
offers (``names``, ``start``, ``call``), so the runner checks a file and a notebook's namespace alike.

Time: importing the file, and each function's check (``start`` begins it), may take ``timeout`` seconds; a
call still running then is stopped by killing the process. A process that dies (``os._exit``, a crash) or is
killed is started again, and the file imported again, at the next call; the function being checked is a FAIL.
At the end (``close``) the process group is killed, so threads and subprocesses the file left running end too.
What the file printed is kept apart (``output``): it never mixes with the report. POSIX only (Linux, macOS):
process groups, ``select`` on pipes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .load import CannotRun
from .protocol import read_reply, send_request
from .student import Abort, Mutated, StudentFault

DEFAULT_TIMEOUT = 60.0  # seconds for importing the file, and for checking each function
STARTUP = 60.0  # seconds for the child's own imports (numpy, mha_numpy), before the student's file runs
ENV_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "SYSTEMROOT")


def child_env() -> dict[str, str]:
    """The child's environment: nothing of ours but the PATH, HOME and the locale, and this mha_numpy."""
    env = {k: os.environ[k] for k in ENV_KEPT if k in os.environ}
    env.update(
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),  # the directory that holds this mha_numpy
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONIOENCODING="utf-8",
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


class ChildProcess:
    """The functions of the file at ``path``, called in a child process (CannotRun if it cannot be imported)."""

    def __init__(self, path: Path, timeout: float = DEFAULT_TIMEOUT):
        self.shown, self.path, self.timeout = str(path), Path(path).resolve(), float(timeout)
        self.workdir = Path(tempfile.mkdtemp(prefix="mha_numpy_check_"))
        self.output_path = self.workdir / "output.txt"
        self.proc: subprocess.Popen | None = None
        self.deadline: float | None = None
        self.output = ""
        try:
            self.names = self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> list[str]:
        with open(self.output_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "mha_numpy.checker.child"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
                cwd=self.workdir,
                env=child_env(),
                start_new_session=True,  # its own process group: close() ends everything it started
            )
        self._reply(time.monotonic() + max(STARTUP, self.timeout), "starting the checker's process", CannotRun)
        self._send(("load", str(self.path), self.shown), CannotRun)
        reply = self._reply(time.monotonic() + self.timeout, f"importing {self.shown}", CannotRun)
        if reply["kind"] != "loaded":
            self._kill()
            raise CannotRun(reply.get("message", f"{self.shown} could not be imported"))
        self.modules = dict(reply.get("modules", {}))  # function name -> the module that defined it
        return list(reply["names"])

    def start(self, function: str) -> None:
        """Begin ``function``'s time budget: its calls until the next start may take ``timeout`` in all."""
        self.deadline = time.monotonic() + self.timeout

    def call(self, function: str, args: list[tuple[str, object]], keep_cache: bool = True):
        """The student's ``function`` on ``args``: its result, or the exception the runner reports."""
        return self._request(("call", function, args, keep_cache), function)

    def call_many(self, function: str, arg_lists: list) -> list:
        """``call`` on each argument list in one message, the caches dropped: the list of results."""
        return self._request(("map", function, arg_lists), function)

    def _request(self, request: tuple, function: str):
        if self.proc is None:
            self._start()  # the last one died or was stopped: a fresh process, the file imported again
        deadline = self.deadline or time.monotonic() + self.timeout
        self._send(request, Abort, function)
        reply = self._reply(deadline, function, Abort)
        kind = reply["kind"]
        if kind == "ok":
            return reply["result"]
        if kind == "mutated":
            raise Mutated(reply["detail"])
        if kind == "fault":
            raise StudentFault(reply["detail"])
        if kind == "unsendable":
            raise StudentFault(f"returned {reply['detail']}: the checker reads arrays, numbers, tuples, lists, dicts")
        if reply.get("not_done"):
            raise NotImplementedError(reply["message"])
        message = reply["message"][:100]
        raise StudentFault(f"raised {reply['type']}{': ' + message if message else ''}")

    def _send(self, request, error: type[Exception], function: str = "") -> None:
        try:
            send_request(self.proc.stdin.fileno(), request)
        except OSError:  # a broken pipe: the process is gone
            raise self._died(function or "the start", error) from None

    def _reply(self, deadline: float, during: str, error: type[Exception]) -> dict:
        try:
            reply = read_reply(self.proc.stdout.fileno(), deadline)
        except TimeoutError:
            self._kill()
            raise error(f"stopped after {self.timeout:g} s: {during} did not finish (an endless loop?)") from None
        except EOFError:
            raise self._died(during, error) from None
        except ValueError as e:  # not a reply of ours: the student's code wrote into the checker's pipe
            self._kill()
            raise error(f"the process running {self.shown} sent garbage during {during} ({e})") from None
        if not isinstance(reply, dict) or "kind" not in reply:
            self._kill()
            raise error(f"the process running {self.shown} sent garbage during {during}")
        return reply

    def _died(self, during: str, error: type[Exception]) -> Exception:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None  # it closed the checker's pipe and runs on
        self._kill()
        if code is None:
            return error(f"the process running {self.shown} closed the checker's pipe during {during}")
        how = f"exit code {code}" if code >= 0 else f"signal {-code}"
        return error(f"the process running {self.shown} ended during {during} ({how}: os._exit or a crash)")

    def _kill(self) -> None:
        """Kill the process group (the student's threads and subprocesses with it)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        self.proc = None

    def close(self) -> None:
        """Ask the process to quit, kill its group, keep what the file printed in ``output``, remove the workdir."""
        if self.proc is not None:
            try:
                send_request(self.proc.stdin.fileno(), ("quit",))
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill()
        try:
            self.output = self.output_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            self.output = ""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
