"""allocator.keep_freed_memory: after it, a freed big array's memory serves the next one (no fresh pages, so no page
faults); before it, glibc gives such blocks back to the kernel. Each case runs in a process of its own, since the
setting is process-wide and lasts."""

from __future__ import annotations

import platform
import subprocess
import sys

import numpy as np
import pytest

from mha_numpy.allocator import keep_freed_memory

FAULTS = r"""
import resource, sys
import numpy as np
from mha_numpy.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
elif sys.argv[1] == "keep, a NumPy int":
    assert keep_freed_memory(np.int64(256 * 2**20))  # issue 35: NumPy's integers are ints (this was refused)
n = 3 * 2**20 // 8  # 3 MiB of float64: above glibc's mmap threshold, below NumPy's 4 MiB huge-page advice
warm = [np.ones(n) for _ in range(3)]  # the first layer's worth: fresh pages either way
del warm
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(20):  # a layer's worth of arrays at once, all freed before the next layer's
    arrays = [np.ones(n) for _ in range(3)]
    del arrays
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(setting: str) -> int:
    r = subprocess.run([sys.executable, "-c", FAULTS, setting], capture_output=True, text=True, check=True)
    return int(r.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_freed_memory_is_reused_after_the_call_and_given_back_before_it():
    pages = 20 * 3 * 3 * 2**20 // 4096  # every array in fresh 4 KiB pages
    default, kept, kept_np = faults("default"), faults("keep"), faults("keep, a NumPy int")
    assert default >= pages // 2  # the premise: glibc's default gives each freed array back (faults it in again)
    assert kept <= default // 10  # after the call, the same arrays reuse the memory
    assert kept_np <= default // 10  # and so with the size given as np.int64


def test_bad_sizes_are_refused():
    for bad in (0, -1, 1.5, True, "1", np.bool_(True), np.float64(2**20), np.int64(0), None):
        with pytest.raises(ValueError, match="nbytes"):
            keep_freed_memory(bad)
