"""A student's file run in a child process, with a time limit: the checker's side of ``checker.child``.

``ChildProcess(path, timeout)`` starts a Python in isolated mode (``-I``: no PYTHONPATH, no user site) with a
clean environment (only PATH, HOME and the locale are passed on), in a fresh temporary working directory, in
its own session, and has it import the file. The child never imports ``mha_numpy``: ``BOOT`` loads its own
modules (``child``, ``guard``, ``load``, ``protocol``, ``student``) from their files under another package name,
and ``checker.guard`` refuses the library to the student's code. Then it offers what ``InProcess`` offers
(``names``, ``start``, ``call``), so the runner checks a file and a notebook's namespace alike; and ``stage``,
``trim``, ``measure``, ``measured`` for exercise 13's systems stage (``checker.systems``, which also starts the
library's kernel in a process of its own with ``boot``).

Reports and score files come from this process only. While a child lives, this process is not dumpable (Linux;
with the child giving up CAP_SYS_PTRACE, its ``/proc/<pid>/fd`` cannot be opened by the student's code, so nothing
is written into its stdout) and is the subreaper of the child's descendants (Linux): ``close`` kills the child's
process group, then every orphan that came here (``_sweep``: one that started a session of its own too), and waits
for them all, so nothing the file started runs on when the report's last line or the score file is written. The
orphans swept are the children of this process that were not there when the first child started and are no live
ChildProcess's: a subprocess another thread of this process starts while a file is checked would be swept too.

Time: importing the file, and each function's check (``start`` begins it), may take ``timeout`` seconds; a
call still running then is stopped by killing the process. A process that dies (``os._exit``, a crash) or is
killed is started again, and the file imported again, at the next call; the function being checked is a FAIL.
What the file printed is kept apart (``output``): it never mixes with the report. POSIX only (Linux, macOS):
process groups, ``select`` on pipes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import capstone, capstone_block, resident
from .load import CannotRun
from .protocol import read_reply, send_request
from .student import Abort, Mutated, StudentFault

DEFAULT_TIMEOUT = 60.0  # seconds for importing the file, and for checking each function
STARTUP = 60.0  # seconds for the child's own imports (numpy), before the student's file runs
ENV_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "SYSTEMROOT")
CHILD_PACKAGE = "_mha_numpy_child"  # the name the child's own modules are loaded under: not mha_numpy
# the child's first lines: its modules from this directory under CHILD_PACKAGE, then nothing more found there
BOOT = (
    "import sys, types\n"
    f"package = types.ModuleType({CHILD_PACKAGE!r})\n"
    "package.__path__ = [sys.argv.pop(1)]\n"
    f"sys.modules[{CHILD_PACKAGE!r}] = package\n"
    f"from {CHILD_PACKAGE} import child, guard, load, protocol, student\n"
    "package.__path__ = []\n"
    "child.main()\n"
)
REPLY_KINDS = ("ready", "loaded", "error", "ok", "mutated", "fault", "unsendable", "raised")


def child_env() -> dict[str, str]:
    """The child's environment: nothing of ours but the PATH, HOME and the locale (no PYTHONPATH)."""
    env = {k: os.environ[k] for k in ENV_KEPT if k in os.environ}
    env.update(
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONIOENCODING="utf-8",
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 3, 4, 36, 37  # linux/prctl.h
_libc = None
_lock = threading.Lock()
_live: set[int] = set()  # the pids of the children of the ChildProcesses alive in this process
_held = 0  # how many ChildProcesses hold the guard (not dumpable, subreaper) now
_exempt: set[int] = set()  # this process's children when the guard was taken: never swept
_before = (1, 0)  # (dumpable, subreaper) when the guard was taken: what _release_guard puts back


def _prctl(option: int, value=0) -> int:
    """Linux's prctl(option, value): its result, -1 where there is none (macOS) or it failed."""
    global _libc
    if not sys.platform.startswith("linux"):
        return -1
    try:
        _libc = _libc or ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(_libc.prctl(option, value, 0, 0, 0))
    except (OSError, AttributeError):
        return -1


def children(pid: int | None = None) -> list[int]:
    """The pids whose parent is ``pid`` (default: this process), read from /proc ([] where there is none)."""
    pid = os.getpid() if pid is None else pid
    return [child for child, parent, _ in resident.processes() or [] if parent == pid]


def _take_guard() -> None:
    """Not dumpable (no /proc/<pid>/fd for the student), subreaper (orphans come here), while children live."""
    global _held, _exempt, _before
    with _lock:
        if _held == 0:
            _exempt = set(children())
            subreaper = ctypes.c_int(0)
            if _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(subreaper)) != 0:
                subreaper.value = 0
            _before = (max(_prctl(PR_GET_DUMPABLE), 0), subreaper.value)
            _prctl(PR_SET_DUMPABLE, 0)
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _held += 1


def _release_guard() -> None:
    global _held
    with _lock:
        _held -= 1
        if _held == 0:
            _prctl(PR_SET_CHILD_SUBREAPER, _before[1])
            _prctl(PR_SET_DUMPABLE, _before[0])


def _sweep(rounds: int = 200) -> int:
    """Kill and reap every orphan this process adopted as subreaper (what a student's process left running, in
    its own session or not), until none is left; -> how many. The children that were here before, and those of
    live ChildProcesses, are left alone."""
    killed = 0
    for _ in range(rounds):
        with _lock:
            orphans = [p for p in children() if p not in _exempt and p not in _live]
        if not orphans:
            return killed
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in orphans:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            killed += 1
    return killed


def _listings() -> dict[str, str]:
    """What the child's stand-ins of the capstone modules give (``checker.guard``): each forward's listing."""
    return {"capstone": capstone.forward_listing(), "capstone_block": capstone_block.forward_listing()}


class ChildProcess:
    """The functions of the file at ``path``, called in a child process (CannotRun if it cannot be imported)."""

    def __init__(self, path: Path, timeout: float = DEFAULT_TIMEOUT, boot: tuple[str, str] | None = None):
        """``boot``: the child's first lines and their argument, instead of ``BOOT`` and this directory (the
        library's side of exercise 13's systems stage, ``checker.systems``)."""
        self.shown, self.path, self.timeout = str(path), Path(path).resolve(), float(timeout)
        self.boot = boot or (BOOT, str(Path(__file__).resolve().parent))
        self.workdir = Path(tempfile.mkdtemp(prefix="mha_numpy_check_"))
        self.output_path = self.workdir / "output.txt"
        self.proc: subprocess.Popen | None = None
        self.deadline: float | None = None
        self.output = ""
        self.refused: list[str] = []  # the library modules the file tried to import (as the child says)
        self.guarded = False
        try:
            _take_guard()
            self.guarded = True
            self.names = self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> list[str]:
        with open(self.output_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-u", "-c", *self.boot],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
                cwd=self.workdir,
                env=child_env(),
                start_new_session=True,  # its own session and process group: close() ends everything it started
            )
        with _lock:
            _live.add(self.proc.pid)
        self._reply(time.monotonic() + max(STARTUP, self.timeout), "starting the checker's process", CannotRun)
        self._send(("load", str(self.path), self.shown, _listings()), CannotRun)
        reply = self._reply(time.monotonic() + self.timeout, f"importing {self.shown}", CannotRun)
        try:
            if reply["kind"] != "loaded":
                raise CannotRun(str(reply.get("message", f"{self.shown} could not be imported"))[:300])
            names, modules = reply["names"], reply.get("modules", {})
            if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and isinstance(modules, dict)):
                raise TypeError("names")
        except (KeyError, TypeError, AttributeError):
            self._kill()
            raise CannotRun(f"the process running {self.shown} sent garbage during importing it") from None
        except CannotRun:
            self._kill()
            raise
        self.modules = {str(k): str(v) for k, v in modules.items()}  # function name -> the module that defined it
        return names

    def start(self, function: str) -> None:
        """Begin ``function``'s time budget: its calls until the next start may take ``timeout`` in all."""
        self.deadline = time.monotonic() + self.timeout

    def call(self, function: str, args: list[tuple[str, object]], keep_cache: bool = True):
        """The student's ``function`` on ``args``: its result, or the exception the runner reports."""
        return self._request(("call", function, args, keep_cache), function)

    def call_many(self, function: str, arg_lists: list) -> list:
        """``call`` on each argument list in one message, the caches dropped: the list of results."""
        return self._request(("map", function, arg_lists), function)

    @property
    def pid(self) -> int | None:
        """The child's process id (None between a death and the next call)."""
        return None if self.proc is None else self.proc.pid

    def stage(self, function: str, args: list, d_out) -> None:
        """Send the inputs of the next ``measure`` ahead: its request then carries none."""
        self._request(("stage", args, d_out), function)

    def measure(self, forward: str, backward: str) -> float:
        """``forward`` then ``backward`` once in the child on the staged inputs, their results kept there: the
        seconds the child counted (the checker's own measurements are made from outside, ``checker.systems``)."""
        return self._request(("measure", forward, backward), backward)

    def measured(self, function: str):
        """The results ``measure`` kept, (forward's output, backward's result), dropped in the child."""
        return self._request(("measured",), function)

    def trim(self, function: str) -> None:
        """The child drops its caches and gives its free heap back to the system (before a measured call)."""
        self._request(("trim",), function)

    def train(self, params: dict, train_ids, sizes: dict, settings: dict, seconds: float) -> tuple[dict, list]:
        """Exercise 15's stage 4 in the child (``Server.train``), stopped after ``seconds``: (parameters, losses)."""
        self.deadline = time.monotonic() + seconds
        return self._request(("train", params, train_ids, sizes, settings), "the training")

    def cpu_seconds(self) -> float | None:
        """The CPU time the child has used so far (user + system, read from /proc: the kernel's count, not the
        student's), or None where there is no /proc or no child."""
        if self.proc is None:
            return None
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state (field 3), ... utime (14), stime
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _request(self, request: tuple, function: str):
        if self.proc is None:
            self._start()  # the last one died or was stopped: a fresh process, the file imported again
        deadline = self.deadline or time.monotonic() + self.timeout
        self._send(request, Abort, function)
        reply = self._reply(deadline, function, Abort)
        try:
            return _answer(reply)
        except (KeyError, TypeError, AttributeError):  # a reply of ours has every key: the student's code wrote it
            self._kill()
            raise Abort(f"the process running {self.shown} sent garbage during {function}") from None

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
        if not isinstance(reply, dict) or reply.get("kind") not in REPLY_KINDS:
            self._kill()
            raise error(f"the process running {self.shown} sent garbage during {during}")
        refused = reply.get("refused", [])
        if isinstance(refused, list):
            self.refused = sorted(set(self.refused) | {str(n)[:100] for n in refused})
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
        with _lock:
            _live.discard(self.proc.pid)
        self.proc = None
        if self.guarded:
            _sweep()  # what it left running in other sessions, adopted by this process: killed and reaped

    def close(self) -> None:
        """Ask the process to quit, kill its group, keep what the file printed in ``output``, remove the workdir."""
        if self.proc is not None:
            try:
                send_request(self.proc.stdin.fileno(), ("quit",))
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill()
        if self.guarded:
            _sweep()
            self.guarded = False
            _release_guard()
        try:
            self.output = self.output_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            self.output = ""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _answer(reply: dict):
    """The result a reply carries, or the exception it stands for (KeyError, TypeError: not a reply of ours)."""
    kind = reply["kind"]
    if kind == "ok":
        return reply["result"]
    if kind == "mutated":
        raise Mutated(str(reply["detail"])[:300])
    if kind == "fault":
        raise StudentFault(str(reply["detail"])[:300])
    if kind == "unsendable":
        what = str(reply["detail"])[:100]
        raise StudentFault(f"returned {what}: the checker reads arrays, numbers, tuples, lists, dicts")
    if kind != "raised":
        raise TypeError(kind)
    if reply.get("not_done"):
        raise NotImplementedError(str(reply["message"])[:100])
    message = str(reply["message"])[:100]
    raise StudentFault(f"raised {str(reply['type'])[:40]}{': ' + message if message else ''}")
