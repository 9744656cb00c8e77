"""The torch mods of ``verify_flex`` and their NumPy twins: "MODULE:FUNCTION" resolved, torch's own helpers
replaced by ours (``noop_mask``), a torch function tried on NumPy arrays when no twin is given, the params and the
user's arrays (or tensors, on any device) read as float64."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

from .. import masks as M


def resolve(obj, argument: str):
    """A callable as it is, or "MODULE:FUNCTION" (a module name or a .py file) imported -> the callable;
    ValueError naming ``argument``."""
    if obj is None or callable(obj):
        return obj
    if not isinstance(obj, str) or obj.count(":") < 1 or not all(obj.rpartition(":")[::2]):
        raise ValueError(f"{argument} must be a callable or 'MODULE:FUNCTION', got {obj!r:.80}")
    module_part, _, attr = obj.rpartition(":")
    try:
        if module_part.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(module_part).stem, module_part)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # torch's dynamo looks a mod's module up by its name
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_part)
        for part in attr.split("."):
            module = getattr(module, part)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises: named, one line
        raise ValueError(f"{argument}: cannot load {obj!r}: {type(e).__name__}: {e}") from None
    if not callable(module):
        raise ValueError(f"{argument}: {obj} is a {type(module).__name__}, not a function")
    return module


def known_twin(torch, mask_mod):
    """torch's own helpers, which do not run on NumPy, by ours: noop_mask."""
    from torch.nn.attention import flex_attention as tf

    return M.noop_mask if mask_mod is getattr(tf, "noop_mask", None) else None


def numpy_twin(mod, twin, argument: str, option: str, params: dict, notes: list, kind: str):
    """The NumPy twin of ``mod``: ``twin``, or ``mod`` itself when it runs on a small NumPy block (noted)."""
    if twin is not None:
        return twin
    index = np.ix_(np.arange(1), np.arange(1), np.arange(2), np.arange(3))  # (1,1,1,1) ... (1,1,1,3)
    try:
        out = mod(np.zeros((1, 1, 2, 3)), *index, **params) if kind == "score" else mod(*index)
        if not isinstance(out, (np.ndarray, np.generic, bool, float)):
            raise TypeError(f"it returned a {type(out).__name__}, not a NumPy array")
    except Exception as e:  # noqa: BLE001 - the torch function on NumPy arrays: it may raise anything
        message = " ".join(str(e).split())[:160]
        raise ValueError(f"{argument} does not run on NumPy arrays ({type(e).__name__}: {message}): give its NumPy "
                         f"twin ({option})") from None  # fmt: skip
    notes.append(f"{argument} ran unchanged on NumPy arrays (no twin given): its forward against torch's is the "
                 "check that it means the same there")  # fmt: skip
    return mod


def read_params(params) -> dict:
    """{name: array or tensor} (or None) -> {name: float64 array}; ValueError naming what is not."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ValueError(f"params must be a dict {{name: array or tensor}}, got {type(params).__name__}")
    taken = sorted(set(params) & {"out", "lse", "dq", "dk", "dv"})
    if taken:
        raise ValueError(f"params: {taken[0]!r} is the name of a tensor of the report: give the parameter another")
    return {name: as_float64(p, f"params[{name!r}]") for name, p in params.items()}


def as_float64(x, what: str) -> np.ndarray:
    """An array or a tensor (on any device, with or without grad) -> a float64 NumPy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not an array of numbers ({type(x).__name__}: {e})") from None
