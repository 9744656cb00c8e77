"""The checks of the recurrent family: each raises ``ValueError`` naming the argument, before any arithmetic."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_bool, as_float_array, as_int, default_scale


class DeltaInputs(NamedTuple):
    """The checked inputs of ``gated_delta_rule_forward`` and their sizes."""

    q: np.ndarray  # (B, Hk, L, dk)
    k: np.ndarray  # (B, Hk, L, dk)
    v: np.ndarray  # (B, H, L, dv)
    g: np.ndarray  # (B, H, L) one decay a head, or (B, H, L, dk) one a key channel (Kimi Delta Attention)
    beta: np.ndarray  # (B, H, L)
    initial_state: np.ndarray | None  # (B, H, dk, dv)
    scale: float
    use_qk_l2norm: bool


def _same_dtype(arrays: dict[str, np.ndarray | None], dtype) -> None:
    for name, a in arrays.items():
        if a is not None and a.dtype != dtype:
            raise ValueError(f"{name} has dtype {a.dtype}; every input must have q's dtype {dtype}")


def check_qkv_heads(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k (B, Hk, L, dk), v (B, H, L, dv) with H a multiple of Hk, one dtype."""
    q = as_float_array(q, "q", ndim=4)
    k = as_float_array(k, "k", ndim=4)
    v = as_float_array(v, "v", ndim=4)
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {q.shape} (B, Hk, L, dk), got {k.shape}")
    B, Hk, L, _ = q.shape
    if v.shape[0] != B or v.shape[2] != L:
        raise ValueError(f"v must be (B, H, L, dv) = ({B}, H, {L}, dv) like q {q.shape}, got {v.shape}")
    if Hk == 0 or v.shape[1] % Hk:
        raise ValueError(
            f"v's heads {v.shape[1]} must be a multiple of q and k's heads {Hk} (v {v.shape}, q {q.shape})"
        )
    _same_dtype({"k": k, "v": v}, q.dtype)
    return q, k, v


def check_delta_inputs(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    """Every input of ``gated_delta_rule_forward`` checked: shapes, one dtype, g ≤ 0, β in [0, 1]."""
    q, k, v = check_qkv_heads(q, k, v)
    B, _, L, dk = q.shape
    H, dv = v.shape[1], v.shape[3]
    g = as_float_array(g, "g")
    if g.shape != (B, H, L) and g.shape != (B, H, L, dk):
        raise ValueError(f"g must be (B, H, L) = {(B, H, L)} or per channel (B, H, L, dk) = {(B, H, L, dk)}, "
                         f"got {g.shape}")  # fmt: skip
    beta = as_float_array(beta, "beta")
    if beta.shape != (B, H, L):
        raise ValueError(f"beta must be (B, H, L) = {(B, H, L)}, got {beta.shape}")
    if initial_state is not None:
        initial_state = as_float_array(initial_state, "initial_state")
        if initial_state.shape != (B, H, dk, dv):
            raise ValueError(f"initial_state must be (B, H, dk, dv) = {(B, H, dk, dv)}, got {initial_state.shape}")
    _same_dtype({"g": g, "beta": beta, "initial_state": initial_state}, q.dtype)
    for name, a in (("q", q), ("k", k), ("v", v), ("initial_state", initial_state)):
        if a is not None and not np.isfinite(a).all():
            raise ValueError(f"{name} {a.shape} must be finite")
    if not (g <= 0).all():  # NaN fails too
        raise ValueError(f"g must be <= 0 (a log decay: the state is multiplied by exp(g)), got max {np.max(g)!r}")
    if not ((beta >= 0) & (beta <= 1)).all():
        raise ValueError(f"beta must be in [0, 1], got min {np.min(beta)!r}, max {np.max(beta)!r}")
    return DeltaInputs(
        q, k, v, g, beta, initial_state, default_scale(dk, scale), as_bool(use_qk_l2norm, "use_qk_l2norm")
    )


def check_chunk_size(chunk_size) -> int:
    return as_int(chunk_size, "chunk_size", minimum=1)


def check_impl(impl) -> str:
    if impl not in ("chunked", "recurrent"):
        raise ValueError(f"impl must be 'chunked' or 'recurrent', got {impl!r}")
    return impl
