"""Small helpers for the tests (not fixtures: plain functions, imported explicitly)."""

from __future__ import annotations

import numpy as np
import pytest


def require_torch():
    """Import torch or skip the calling test with a clear reason (a failure under CI)."""
    return pytest.importorskip("torch", reason="torch is not installed: pip install -r requirements-dev.txt")


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if b.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)
