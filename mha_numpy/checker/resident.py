"""A process's peak memory during one call, read from outside it (Linux ``/proc``): exercise 13's systems stage
measures the student's process from the checker's process with it, never from what the student's process says.

``Watch(pid)`` around one call:

- before: ``/proc/PID/clear_refs`` ← "5" resets the process's high-water mark of resident memory (VmHWM) to its
  resident memory now, and the resident memory of its tree now (``/proc/PID/statm``) is the baseline;
- during: a thread of this process reads the process's VmRSS and VmHWM (``/proc/PID/status``) and the resident
  memory of the rest of its tree every ``INTERVAL`` seconds (the tree: its descendants and every process of its
  session, rescanned every ``RESCAN`` samples); a peak between two samples shows in the next one's VmHWM;
- after: one more sample, VmHWM the process's peak as the kernel saw it.

The peak above the baseline is the largest of them. The student's code may reset its own high-water mark (it can
write its own clear_refs) but cannot stop the sampling: writing a (4096, 4096) float64 array takes tens of
milliseconds, many samples; and a VmHWM that goes down between two samples is a reset, said in the report, the peak
then only known from below (``UNKNOWN`` above). Resident memory counts the pages touched, whichever allocator made
them (NumPy, ctypes, a bytearray, an mmap): ``np.empty((L, L))`` never written costs nothing, ``bytearray(n)``
(zeroed) costs n bytes. The descendants' pages shared with the process (a fork's) are counted once more: an
over-count, never an under-count. Not counted: memory outside the process's tree (a file written to a tmpfs, a
process that left the session and its parent).

Where clear_refs cannot be written (the process made itself not dumpable and the checker is not root, a kernel
without it), VmHWM is the peak since the process started: the call's peak when the call raised it, else only a bound
above it. ``Peak.low`` is what was measured, ``Peak.high`` the bound (the same when the peak is exact); ``Peak.how``
says which, for the report. Without ``/proc`` (macOS) nothing is measured: ``available()`` is False.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

INTERVAL = 0.002  # seconds between two samples (a read of status costs ~90 µs, of statm ~30 µs)
RESCAN = 25  # samples between two searches of the process's tree (a scan of /proc costs ~2 ms)
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CPUS = os.cpu_count() or 1
# bytes a reading may be off without anything happening: the kernel keeps a process's page counts per CPU and reads
# their sum approximately, each off by up to a batch (32 pages, or 2 per CPU if more) per CPU: 256 KiB on 2 CPUs,
# 32 MiB on 64 (a VmHWM lower than a moment ago by less is no reset)
SLACK = max(4 << 20, max(32, 2 * CPUS) * CPUS * PAGE)
UNKNOWN = 1 << 62  # Peak.high when nothing bounds the peak (the process reset its own high-water mark)


def available(pid: int | None = None) -> bool:
    """Whether ``/proc/<pid>/statm`` can be read here (Linux): the only way this module measures."""
    try:
        resident(os.getpid() if pid is None else pid)
    except OSError:
        return False
    return True


def resident(pid: int) -> int:
    """Bytes of ``pid``'s resident memory now (``/proc/PID/statm``'s second field); OSError when it is gone."""
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


def status(pid: int) -> tuple[int, int]:
    """Bytes of ``pid``'s resident memory now and of its high-water mark (VmRSS, VmHWM of ``/proc/PID/status``: the
    peak since it started, or since the last reset); OSError when it is gone."""
    found = {}
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith((b"VmRSS:", b"VmHWM:")):
                found[line[:5]] = int(line.split()[1]) * 1024  # kB
    if len(found) < 2:
        raise OSError(f"/proc/{pid}/status has no VmRSS and VmHWM")
    return found[b"VmRSS"], found[b"VmHWM"]


def reset_high_water(pid: int) -> bool:
    """Set ``pid``'s VmHWM to its resident memory now (``echo 5 > /proc/PID/clear_refs``); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def processes() -> list[tuple[int, int, int]] | None:
    """(pid, parent pid, session) of every process, from one scan of ``/proc``; None where there is no ``/proc``."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    found = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, session, ...
        if len(fields) > 3:
            found.append((int(entry), int(fields[1]), int(fields[3])))
    return found


def tree(pid: int) -> list[int]:
    """``pid``, its descendants, and the processes of its session (``pid`` leads one: the checker's child): one scan
    of ``/proc``. A process that left the session and was re-parented (a double fork, then setsid) is not found."""
    table = processes()
    if table is None:
        return [pid]
    parents: dict[int, list[int]] = {}
    for child, parent, _ in table:
        parents.setdefault(parent, []).append(child)
    found = {child for child, _, session in table if session == pid}
    todo, seen = [pid], {pid}
    while todo:  # the descendants, breadth first
        for child in parents.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return sorted(found | seen)


@dataclass(frozen=True)
class Peak:
    """The call's peak resident memory above the baseline, in bytes: ``low`` measured, ``high`` the bound above it
    (== ``low`` when exact); ``how`` says how it was measured, for the report."""

    low: int
    high: int  # UNKNOWN: no bound
    how: str

    @property
    def exact(self) -> bool:
        return self.high == self.low


class Watch:
    """``with Watch(pid) as w: <the call>`` then ``w.peak()``; ``reset=False`` does without clear_refs (the
    fallback's path, for tests). Each sample reads the process's VmRSS and VmHWM (a peak between two samples shows in
    the next one's VmHWM, unless the process resets it in between) and its tree's other processes' resident memory;
    a VmHWM lower than the last one seen (by more than ``SLACK``) means the process reset it itself during the call."""

    def __init__(self, pid: int, interval: float = INTERVAL, reset: bool = True):
        self.pid, self.interval, self.want_reset = pid, interval, reset
        self.reset = self.tampered = False
        self.hwm_after: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0

    def _sample_once(self, pids: list[int]) -> None:
        rss, hwm = status(self.pid)
        others = 0
        for p in pids:
            if p != self.pid:
                try:
                    others += resident(p)
                except OSError:  # ended since the scan
                    pass
        self.tampered |= hwm < self.hwm_seen - SLACK
        self.hwm_seen = hwm
        self.top_hwm = max(self.top_hwm, hwm)
        self.top = max(self.top, rss + others)

    def __enter__(self) -> Watch:
        self.hwm_before = status(self.pid)[1]
        self.reset = self.want_reset and reset_high_water(self.pid)
        self.pids = tree(self.pid)
        self.process_baseline, self.hwm_seen = status(self.pid)
        self.top_hwm = self.hwm_seen
        self.baseline = self.top = self.process_baseline + sum(resident(p) for p in self.pids if p != self.pid)
        self._thread = threading.Thread(target=self._sample, name="mha_numpy-resident", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples += 1
            try:
                if self.samples % RESCAN == 0:
                    self.pids = tree(self.pid)
                self._sample_once(self.pids)
            except OSError:  # the process is gone: the call fails anyway
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._sample_once(tree(self.pid))
            self.hwm_after = self.hwm_seen
        except OSError:
            self.hwm_after = None

    def peak(self) -> Peak:
        """The call's peak above the baseline (``Peak``), after the ``with`` block."""
        sampled = max(0, self.top - self.baseline)
        every = f"sampled every {self.interval * 1e3:g} ms"
        if self.hwm_after is None:
            return Peak(sampled, sampled, f"resident memory {every} (the process ended)")
        hwm = max(0, self.top_hwm - self.process_baseline)
        if self.tampered:  # the process reset its own mark: a peak between two samples may be gone unseen
            return Peak(
                max(sampled, hwm), UNKNOWN, f"the process reset its own high-water mark during the call; {every}"
            )
        if self.reset:
            return Peak(max(sampled, hwm), max(sampled, hwm), f"high-water mark reset before the call; {every}")
        if self.top_hwm > self.hwm_before:  # the call raised the high-water mark since the start: its peak
            return Peak(max(sampled, hwm), max(sampled, hwm), f"high-water mark raised by the call; {every}")
        why = "the high-water mark could not be reset (/proc/PID/clear_refs not writable) and was not raised"
        return Peak(sampled, max(sampled, hwm), f"resident memory {every}; {why}: only a bound above the peak")
