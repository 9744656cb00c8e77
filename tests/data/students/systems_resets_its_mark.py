"""Exercise 13 with the right numbers and the whole (Lq, Lk) matrices, that resets its own process's high-water mark
of resident memory (``echo 5 > /proc/self/clear_refs``) after each call, so that the mark read after the call shows
none of them. The checker also samples the memory during the call, and sees the mark go down."""

from flash_full_matrix import flash_attention_backward as _backward
from flash_full_matrix import flash_attention_forward as _forward


def _reset_mark():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def flash_attention_forward(q, k, v, mask, block):
    out = _forward(q, k, v, mask, block)
    _reset_mark()
    return out


def flash_attention_backward(d_o, cache):
    grads = _backward(d_o, cache)
    _reset_mark()
    return grads
