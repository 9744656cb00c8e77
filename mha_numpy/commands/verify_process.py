"""``verify``'s cases in a child process, each with a time limit: the function's exit, crash or hang is its case's
failure, and the report is still printed by this process.

One child runs the whole matrix (``python -c "...verify import child; child()"``: imports the target, adapts it,
then ``run_case`` on each case), so the default run starts Python, NumPy and the target's libraries once. It
tells us, over a pipe of its own (not its stdout, which goes to our stderr with what the function prints):

    ("ready", implementation name, notes)      the target imported and adapted
    ("usage", message) / ("import", message)   a usage mistake (exit 2) / the module raised on import (exit 3)
    ("start", i)   ("result", i, CaseResult, CPU seconds)   around each case

A case whose result does not come within ``timeout`` seconds of its start is an ERROR naming the limit, the child
is killed (its process group: what the function started too), and the cases after it are not run (ERROR "not
run": each could hang as long; a function hanging on every case would take the limit times the matrix). A child
that ends during a case (``os._exit`` from C, a crash, a signal) makes that case an ERROR with its exit code, and a
new child runs the cases after it. Frames: a 4-byte big-endian length, then a pickle. POSIX only (process groups,
``select`` on a pipe), as the course checker (``checker/process.py``), which this follows.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..testing import CaseResult
from ._args import UsageError

DEFAULT_TIMEOUT = 60.0  # seconds a case may take (--timeout)
STARTUP = 120.0  # seconds for the child to import NumPy, mha_numpy, the target and its libraries (torch, JAX)
POLL = 0.5  # seconds between checks that the child still lives, while waiting for it
STOPPED = "stopped after"  # a case's message when it ran past the time limit
CHILD = "from mha_numpy.commands.verify import child; child()"


class CannotImport(Exception):
    """The target's module raised (or exited, or hung) while being imported: exit 3 with this message."""


def send(fd: int, message) -> None:
    """One frame on ``fd``: 4-byte big-endian length, then the pickle."""
    data = pickle.dumps(message)
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


class Child:
    """A child process running ``job`` (a dict: the target, its options, the cases and the first to run)."""

    def __init__(self, job: dict):
        read, write = os.pipe()
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[2])  # the directory holding this mha_numpy: the child's too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", CHILD],
                stdin=subprocess.PIPE,
                stdout=2,  # what the function prints: our stderr, never the report's stdout
                pass_fds=(write,),
                env=env,
                start_new_session=True,  # its own process group: killing it ends what the function started
            )
        finally:
            os.close(write)  # ours closed: the pipe ends (EOF) when the child does
        self.fd, self.buffer = read, b""
        try:
            self.proc.stdin.write(pickle.dumps({**job, "fd": write, "path": sys.path}))
        except OSError:  # it died at once: read() says so
            pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def read(self, deadline: float, *expected: tuple[str, int]) -> tuple:
        """The next message, one of the ``expected`` (kind, length); TimeoutError past ``deadline``, EOFError when
        the child ended (or closed the pipe), ValueError for anything else on the pipe."""
        while True:
            if len(self.buffer) >= 4:
                n = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + n:
                    frame, self.buffer = self.buffer[4 : 4 + n], self.buffer[4 + n :]
                    try:
                        message = pickle.loads(frame)
                    except Exception as e:  # noqa: BLE001 - not a frame of ours: something wrote into the pipe
                        raise ValueError(f"something that is not a message ({type(e).__name__})") from None
                    if not (isinstance(message, tuple) and message and (message[0], len(message)) in expected):
                        raise ValueError(f"{message!r:.80}, not a message verify expected here")
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], min(left, POLL))
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    raise EOFError(self.ended())
                self.buffer += chunk
            elif self.proc.poll() is not None:  # dead, the pipe held open by a process it started
                raise EOFError(self.ended())

    def ended(self) -> str:
        """How the child ended: its exit code or signal (waiting 2 s for it)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "it closed verify's pipe"
        return f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"

    def kill(self) -> None:
        """Kill the child's process group (what the function started with it) and close the pipe."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run_cases(job: dict, cases: list, timeout: float = DEFAULT_TIMEOUT, progress=None):
    """Run ``cases`` in child processes -> (implementation name, notes, results, CPU seconds of the cases).
    UsageError or CannotImport when the target cannot be run at all."""
    results: list[CaseResult] = []
    name, notes, cpu = job["target"], [], 0.0
    while len(results) < len(cases):
        first = len(results)
        child = Child({**job, "cases": cases, "start": first})
        try:
            message = _ready(child, job["module"], timeout, restart=first > 0)
            if message[0] == "lost":  # a second child that cannot start: the remaining cases are its failures
                results += [CaseResult(c, "ERROR", message=message[1]) for c in cases[first:]]
                break
            name, notes = message[1], message[2]
            while len(results) < len(cases):
                result, seconds = next_result(child, cases, len(results), timeout)
                results.append(result)
                cpu += max(seconds, 0.0)
                if progress is not None:
                    progress(len(results), len(cases), result)
                if seconds < 0:  # the child was killed or ended: a new one runs the rest
                    break
        finally:
            child.kill()
        if results and results[-1].message.startswith(STOPPED):  # a hang: the rest not run (each could take as long)
            hung = results[-1].case.id
            for case in cases[len(results) :]:
                results.append(CaseResult(case, "ERROR", message=f"not run: {hung} ran past the time limit before it "
                                          "(--only to run the rest)"))  # fmt: skip
                if progress is not None:
                    progress(len(results), len(cases), results[-1])
    return name, notes, results, cpu


def _ready(child: Child, module: str, timeout: float, restart: bool) -> tuple:
    """The child's first message: ("ready", name, notes), or ("lost", why) for a restarted child that failed;
    UsageError or CannotImport for the first child that cannot run the target."""
    limit = max(STARTUP, timeout)
    try:
        message = child.read(time.monotonic() + limit, ("ready", 3), ("usage", 2), ("import", 2))
        if message[0] == "ready":
            return message
        error = (UsageError if message[0] == "usage" else CannotImport)(message[1])
    except TimeoutError:
        error = CannotImport(f"importing {module} did not finish in {limit:g} s")
    except EOFError as e:
        error = CannotImport(f"importing {module} ended the process ({e})")
    except ValueError as e:
        error = CannotImport(f"while importing {module}, the process sent {e}")
    if restart:
        return ("lost", f"a new process could not run it: {error}")
    raise error


def next_result(child: Child, cases: list, i: int, timeout: float) -> tuple[CaseResult, float]:
    """Case i's result and its CPU seconds; an ERROR and -1 when the child hung or ended on it."""
    try:
        message = child.read(time.monotonic() + STARTUP, ("start", 2))  # sent at once
        if message[1] != i:
            raise ValueError(f"the start of case {message[1]!r:.20} instead of case {i + 1}")
        message = child.read(time.monotonic() + timeout, ("result", 4))
        if message[1] != i or not isinstance(message[2], CaseResult):
            raise ValueError(f"a result that is not case {i + 1}'s")
        return message[2], float(message[3])
    except TimeoutError:
        why = f"{STOPPED} {timeout:g} s: the function did not return (an endless loop? --timeout to change it)"
    except EOFError as e:
        why = f"the process running it ended ({e}: os._exit, a crash or a signal): a function under test must return"
    except (ValueError, TypeError) as e:  # run_cases kills this child
        why = f"the process running it sent {e} (something wrote into verify's pipe)"
    return CaseResult(cases[i], "ERROR", message=why), -1.0
