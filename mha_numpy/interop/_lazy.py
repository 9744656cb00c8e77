"""torch and transformers at the edge: imported on first use, and tensors turned into arrays."""

from __future__ import annotations

import importlib

import numpy as np


def require(package: str):
    """Import ``package`` (torch or transformers) or raise an ImportError that names it."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        top = package.split(".")[0]
        raise ImportError(
            f"this function of mha_numpy.interop needs the '{top}' package, which is not installed; "
            f"install it with `pip install {top}` (or `pip install -r requirements-dev.txt`)"
        ) from exc


def to_numpy(x) -> np.ndarray | None:
    """A torch tensor or array-like -> ndarray (a copy for tensors); None stays None."""
    if x is None:
        return None
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().cpu().numpy().copy()
    return np.asarray(x)
