# expect: FAIL
# where: attention_context_backward v
# name: hostile
"""Hostile: at import, starts a non-daemon thread that never returns (the process cannot exit on its own) and
ignores SIGTERM; dv is doubled."""

import signal
import threading
import time

import numpy as np


def _forever():
    while True:
        time.sleep(0.5)


try:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
except ValueError:  # not the main thread
    pass
threading.Thread(target=_forever, daemon=False).start()


def attention_context_forward(p, v):
    return p @ v, (p, v)


def attention_context_backward(d_context, cache):
    p, v = cache
    dp = d_context @ np.swapaxes(v, -1, -2)
    dv = 2.0 * (np.swapaxes(p, -1, -2) @ d_context)  # the bug: twice
    return dp, dv
