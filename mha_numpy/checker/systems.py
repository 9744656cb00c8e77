"""Exercise 13's systems stage: the student's flash forward + backward graded on memory and time, not only numbers.

The student's child process runs ``flash_attention_forward`` then ``flash_attention_backward`` at L = 4096 (d = 64,
one head, float64, no mask, key blocks of 128), and a child process of the library's own, started the same way
(``ChildProcess``, the same environment: one BLAS thread), runs ``kernels.ChunkedKernel`` (one thread) on the same
inputs. Both are measured the same way, by this process, from outside (``checker.resident``): each child gets the
inputs in a request of their own, then drops its caches and gives its free heap back; then the peak of its resident
memory during the call's request above what it held just before (the high-water mark reset before the call and read
after it, and sampled during it), and the wall time from sending that request (which carries no data) to its reply.
What the student's process says of itself (tracemalloc, its own clock) is not used: its code could stop, patch or
fake it, or allocate where tracemalloc does not look (a bytearray, ctypes, an mmap). ``MEASURE_REPEATS`` rounds, each
on other inputs (a result kept from an earlier round is no use), the library first in each: the largest peak and
the fastest time of each side kept, so a moment of load on a shared machine cannot fail a solution's time target.
Each round's results are compared with the library's (a kernel that answers only small inputs right fails here).
Memory reserved and touched before the call (at import, say) does not grow during it: the resident memory the
student's process holds before the call beyond the library's (more than ``resident.SLACK``) is added to the bound
above its peak, so a file that holds an (L, L) array's worth ahead cannot pass the memory target (import only NumPy).

Targets (stated in exercises/ex13_flash_backward.ipynb and docs/course.md):

- memory: peak < ``MEMORY_FRACTION`` of one (L, L) array of the inputs' dtype (a kernel that builds the scores,
  the weights or dS whole needs at least one);
- time: at most ``TIME_RATIO`` × the library's time on the same machine, measured in the same rounds.

Where the peak cannot be measured exactly (``resident``: no writable clear_refs, and the call did not raise the
high-water mark) the row gives the bounds, and a bound above the target fails it ("not confirmed"); without
``/proc`` (macOS) the row is "not measured", never a PASS. ``python -m mha_numpy check --no-systems`` skips the stage
(the report says so).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..kernels import ChunkedKernel
from . import child, resident
from .process import ChildProcess
from .runner import Row

SIZE, HEAD_DIM, BLOCK = 4096, 64, 128
MEMORY_FRACTION, TIME_RATIO = 0.5, 3.0
MEASURE_REPEATS = 3  # rounds: the largest peak and the fastest time of each side kept
TOLERANCE = 1e-8  # a result's largest error against the library's, relative to the library's largest element
FUNCTION = "flash_attention (memory, time)"
FORWARD, BACKWARD = "flash_attention_forward", "flash_attention_backward"
NOT_MEASURED = "not measured"  # a status: never a PASS
LIBRARY_TIMEOUT = 120.0  # seconds for the library's process to start and run each round
LIBRARY_FILE = Path(__file__).resolve().parents[1] / "kernels" / "chunked.py"  # what the library's process runs
LIBRARY_BOOT = (  # the library's process: this package on its path, then checker.child's loop on the library's pair
    "import sys\nsys.path.insert(0, sys.argv.pop(1))\nfrom mha_numpy.checker.systems import serve_library\n"
    "serve_library()\n",
    str(Path(__file__).resolve().parents[2]),
)


def inputs(size: int, head_dim: int = HEAD_DIM, seed: int = 0):
    """q, k, v (1, 1, size, head_dim) and d_o (1, 1, size, head_dim), float64."""
    rng = np.random.default_rng(seed)
    q, k, v, d_o = (rng.standard_normal((1, 1, size, head_dim)) for _ in range(4))
    return q, k, v, d_o


def serve_library() -> None:
    """The library's process: ``checker.child``'s loop serving the chunked kernel (one thread) as the exercise's
    pair, so that it is measured exactly as the student's is."""
    kernel = ChunkedKernel(num_threads=1)

    def forward(q, k, v, mask, block):
        return kernel.forward(q, k, v, mask)

    def backward(d_o, cache):
        return tuple(kernel.backward(d_o, cache)[:3])  # dq, dk, dv

    child.main({FORWARD: forward, BACKWARD: backward})


def library_process(timeout: float = LIBRARY_TIMEOUT) -> ChildProcess:
    """A child process serving the library's chunked kernel as exercise 13's pair (``serve_library``)."""
    return ChildProcess(LIBRARY_FILE, timeout, boot=LIBRARY_BOOT)


def measured_call(process: ChildProcess, args: list, d_o, reset: bool = True):
    """One forward + backward in ``process``, measured from here -> (resident.Peak, wall seconds, the child's own
    seconds, the results (out, grads), the bytes resident before the call). The inputs are staged first, then the
    process trimmed (so the bytes that carried them are not reused unseen); the request's exceptions (the student's
    error, a time-out) propagate."""
    process.stage(BACKWARD, args, d_o)  # (re)starts a process that died, so there is a pid to watch
    process.trim(BACKWARD)
    with resident.Watch(process.pid, reset=reset) as watch:
        began = time.perf_counter()
        own = process.measure(FORWARD, BACKWARD)
        seconds = time.perf_counter() - began
    return watch.peak(), seconds, own, process.measured(BACKWARD), watch.baseline


def wrong_numbers(results, expected) -> str:
    """'' when ``results`` (out, (dq, dk, dv)) match ``expected`` within TOLERANCE, else what is wrong."""
    names = ("the output", "dq", "dk", "dv")
    try:
        got = [results[0], *results[1]]
    except (TypeError, IndexError):
        return "the pair did not return (output, cache) and (dq, dk, dv)"
    want = [expected[0], *expected[1]]
    if len(got) != len(want):
        return f"the backward returned {len(got) - 1} gradients, not 3"
    for name, g, w in zip(names, got, want, strict=True):
        if not isinstance(g, np.ndarray) or g.shape != w.shape:
            return f"{name} is {type(g).__name__} {getattr(g, 'shape', '')}, not an array {w.shape}"
        error = float(np.max(np.abs(g - w))) if g.size else 0.0
        if not error <= TOLERANCE * max(float(np.max(np.abs(w))), 1e-300):
            return f"{name} differs from the library's by {error:.3g} (largest element {np.max(np.abs(w)):.3g})"
    return ""


def verdict(
    low: int, high: int, seconds: float, full: int, library: float, memory_fraction: float, time_ratio: float,
    how: str = "",
) -> Row:  # fmt: skip
    """PASS when both targets hold; FAIL naming each target missed, or the memory target not confirmed (the peak known
    only to lie between ``low`` and ``high`` bytes, ``high`` not below the target; ``resident.UNKNOWN``: no bound).
    The detail always gives both measurements."""
    ratio = seconds / max(library, 1e-9)
    target = memory_fraction * full
    if high == low:
        peak = f"peak {low / 2**20:.1f} MiB = {low / full:.3f}"
    elif high >= resident.UNKNOWN:
        peak = f"peak at least {low / 2**20:.1f} MiB = {low / full:.3f}"
    else:
        peak = f"peak between {low / 2**20:.1f} and {high / 2**20:.1f} MiB = {low / full:.3f} to {high / full:.3f}"
    memory = f"{peak} of one (L, L) array (target < {memory_fraction:g}{'; ' + how if how else ''})"
    speed = (
        f"time {seconds:.2f} s = {ratio:.2f}× the library's chunked kernel ({library:.2f} s; target ≤ {time_ratio:g}×)"
    )
    missed = [name for name, ok in (("memory", low < target), ("time", ratio <= time_ratio)) if not ok]
    detail = f"{memory}; {speed}"
    if missed:
        detail = f"{' and '.join(missed)} target missed: {detail}"
    elif high >= target:
        detail = f"memory target not confirmed (the peak may reach the target): {detail}"
    return Row(FUNCTION, "FAIL" if missed or high >= target else "PASS", detail)


def check_systems(
    student, size: int = SIZE, memory_fraction: float = MEMORY_FRACTION, time_ratio: float = TIME_RATIO,
    reset: bool = True, repeats: int = MEASURE_REPEATS,
) -> Row:  # fmt: skip
    """The systems row for a student (a ``ChildProcess``) whose flash pair passed. ``reset=False``: without
    resetting the high-water marks (the fallback of a machine without a writable clear_refs); ``repeats`` rounds."""
    if not resident.available():
        why = "this system has no /proc/PID/statm to read a process's memory from outside it (Linux has)"
        return Row(FUNCTION, NOT_MEASURED, f"{why}: the targets are unchecked, not passed (--no-systems skips them)")
    full = size * size * 8  # bytes of one (L, L) float64 array
    block = max(1, size * BLOCK // SIZE)  # 128 at L = 4096: a tile (L, block) is 1/32 of the (L, L) array
    low = high = ahead = 0
    seconds = library = float("inf")
    hows = set()
    with library_process() as ours:
        for round_ in range(repeats):  # the largest peak, the fastest time: a busy machine slows, never speeds
            q, k, v, d_o = inputs(size, seed=round_)  # other inputs each round: nothing to keep from the last one
            args = [("q", q), ("k", k), ("v", v), ("mask", None), ("block", block)]
            try:
                _, taken, _, expected, held_by_ours = measured_call(ours, args, d_o, reset)
            except Exception as e:  # noqa: BLE001 - a time-out on a machine far too busy: said, never a pass
                return Row(FUNCTION, NOT_MEASURED, f"the library's kernel could not be measured at L = {size}: {e}")
            library = min(library, taken)
            student.start(BACKWARD)  # each measured call its own time limit: not shared with the library's rounds
            try:
                peak, taken, _, results, held = measured_call(student, args, d_o, reset)
            except Exception as e:  # noqa: BLE001 - the student's error, a time-out: the row says it
                return Row(FUNCTION, "FAIL", f"at L = {size}: {e}")
            wrong = wrong_numbers(results, expected)
            if wrong:
                return Row(FUNCTION, "FAIL", f"at L = {size}: {wrong}")
            extra = held - held_by_ours  # memory reserved before the call is not seen growing in it
            extra = extra if extra > resident.SLACK else 0  # below: two processes' modules and counters differ
            low, high, ahead = max(low, peak.low), max(high, peak.high + extra), max(ahead, extra)
            seconds = min(seconds, taken)
            hows.add(peak.how)
    how = "measured by the checker: " + " / ".join(sorted(hows))
    if ahead > 0:
        how += (f"; the process held {ahead / 2**20:.1f} MiB more than the library's before the call, which the call "
                "could use unseen (import only NumPy)")  # fmt: skip
    return verdict(low, high, seconds, full, library, memory_fraction, time_ratio, how)
