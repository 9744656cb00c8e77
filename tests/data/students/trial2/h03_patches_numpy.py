# expect: FAIL
# where: softmax_backward x
# name: hostile
"""Hostile: patches NumPy's comparisons to say "equal" (np.allclose, np.isclose, np.testing, np.abs, np.max) in the
hope that the checker compares in this process; the backward is the Jacobian's diagonal only."""

import numpy as np

_real_abs, _real_max = np.abs, np.max
np.allclose = lambda *a, **k: True
np.isclose = lambda a, b, *r, **k: np.ones(np.broadcast_shapes(np.shape(a), np.shape(b)), dtype=bool)
np.array_equal = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
np.testing.assert_array_equal = lambda *a, **k: None
np.abs = lambda x, *a, **k: 0 * _real_abs(x)
np.max = lambda x, *a, **k: 0 * _real_max(x, *a, **k)


def softmax_forward(x):
    m = np.maximum.reduce(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    return p, p


def softmax_backward(dp, cache):
    p = cache
    return p * (1 - p) * dp
