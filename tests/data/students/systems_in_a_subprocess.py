"""Exercise 13 solved (key blocks), but on large inputs the forward has another process hold an (L, L) array (as a
kernel that builds the whole scores in a helper process would): its memory is not the student's process's. The
checker counts the processes the student's process started (its descendants, its session) with it."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "exercises" / "solutions"))
from ex13_flash_backward import flash_attention_backward  # noqa: E402, F401 - the graded pair
from ex13_flash_backward import flash_attention_forward as _forward  # noqa: E402

HELPER = "import sys, time, numpy as np\na = np.ones(({0}, {0}))\na += 1\ntime.sleep(0.5)\n"


def flash_attention_forward(q, k, v, mask, block):
    if q.shape[2] >= 1024:
        subprocess.run([sys.executable, "-c", HELPER.format(q.shape[2])], check=True)
    return _forward(q, k, v, mask, block)
