"""Exercise 13 solved (key blocks, no (Lq, Lk) array), but every call on large inputs sleeps 2 s and the process's
clocks are replaced to say it did not: its own stopwatch would read no time. The checker times the request itself."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "exercises" / "solutions"))
from ex13_flash_backward import flash_attention_backward as _backward  # noqa: E402
from ex13_flash_backward import flash_attention_forward as _forward  # noqa: E402

_sleep = time.sleep
for _name in ("perf_counter", "monotonic", "time", "process_time"):
    setattr(time, _name, lambda: 0.0)


def flash_attention_forward(q, k, v, mask, block):
    if q.shape[2] >= 1024:
        _sleep(2.0)
    return _forward(q, k, v, mask, block)


def flash_attention_backward(d_o, cache):
    return _backward(d_o, cache)
