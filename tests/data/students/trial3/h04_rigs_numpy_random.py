# expect: FAIL
# where: apply_mask_backward scores
# name: hostile
"""Hostile: at import, replaces numpy's random generators with ones that give all-ones arrays (an all-ones
upstream gradient hides many bugs) and a fixed seed; the mask's backward is the identity (gradient through blocked
scores)."""

import numpy as np

_real_default_rng = np.random.default_rng


class _Ones:
    def __init__(self, *a, **k):
        self._g = _real_default_rng(0)

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        return np.ones(size, dtype=dtype)

    def normal(self, loc=0.0, scale=1.0, size=None):
        return np.ones(size) * loc + 1.0

    def random(self, size=None, dtype=np.float64, out=None):
        return np.full(size, 0.5, dtype=dtype)

    def uniform(self, low=0.0, high=1.0, size=None):
        return np.full(size, (low + high) / 2)

    def __getattr__(self, name):
        return getattr(self._g, name)


np.random.default_rng = _Ones
np.random.Generator = _Ones
np.random.randn = lambda *shape: np.ones(shape)
np.random.rand = lambda *shape: np.full(shape, 0.5)


def apply_mask_forward(scores, mask):
    if mask.dtype == bool:
        out = np.where(mask, scores, -np.inf)
    else:
        out = scores + mask
    return out, None


def apply_mask_backward(d_out, cache):
    return d_out  # the bug: a blocked score passes its gradient on
