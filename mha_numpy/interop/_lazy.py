"""torch and transformers at the edge: imported on first use, and tensors turned into arrays."""

from __future__ import annotations

import numpy as np

from .._checks import as_array
from .._optional import require as _require_optional


def require(package: str):
    """Import ``package`` (torch or transformers) or raise MissingDependency (an ImportError) naming the extra."""
    return _require_optional(package, "this function of mha_numpy.interop")


def to_numpy(x, name: str = "the array") -> np.ndarray | None:
    """A torch tensor or array-like -> ndarray (a copy for tensors); None stays None; a ragged list is a ValueError
    naming ``name``."""
    if x is None:
        return None
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().cpu().numpy().copy()
    return as_array(x, name)
