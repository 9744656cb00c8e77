"""The pairs of a Transformer other than attention, each ``NAME_forward -> (out, cache)`` /
``NAME_backward(d_out, cache)``: embedding lookup, residual add, softmax cross-entropy, LayerNorm, GELU.

Like ``functional``, every backward line names the forward line it reverses (``# ← F1``); the
derivations are in ``docs/derivation.md``.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import as_float_array
from ._erf import erf

# --------------------------------------------------------------------------- embedding


def check_ids(ids, name: str, num_rows: int) -> np.ndarray:
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {ids.dtype} with shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        raise ValueError(
            f"{name} with shape {ids.shape} has ids outside [0, {num_rows}): min {ids.min()}, max {ids.max()}"
        )
    return ids


def embedding_forward(ids: np.ndarray, table: np.ndarray):
    """Look up one row of ``table`` per id.

    ids: (...) integers in [0, N)   table: (N, E)   ->   out: (..., E) with out[i] = table[ids[i]]
    """
    table = as_float_array(table, "table", ndim=2)
    ids = check_ids(ids, "ids", table.shape[0])
    out = table[ids]  # F1: (..., E), a copy
    return out, (ids, table.shape)


def embedding_backward(d_out: np.ndarray, cache):
    """d_out: (..., E) -> d_table: (N, E).

    A scatter-add: every occurrence of id n adds its d_out row to d_table[n]. ``d_table[ids] += d_out``
    would be wrong, because with repeated ids NumPy keeps only one of the writes; ``np.add.at`` adds them all.
    """
    ids, shape = cache
    d_table = np.zeros(shape, dtype=d_out.dtype)  # (N, E); rows never looked up get 0
    np.add.at(d_table, ids, d_out)  # ← F1: d_table[ids[i]] += d_out[i] for every i, repeats accumulate
    return d_table


# --------------------------------------------------------------------------- add (the residual)


def add_forward(a: np.ndarray, b: np.ndarray):
    """out = a + b, same shapes. Used for token + position and for the residual x + attention(x)."""
    if np.shape(a) != np.shape(b):
        raise ValueError(f"add needs equal shapes, got a {np.shape(a)} and b {np.shape(b)}")
    return a + b, None  # F1


def add_backward(d_out: np.ndarray, cache=None):
    """d_out -> (da, db): a sum passes its gradient unchanged to both terms."""
    return d_out, d_out  # ← F1: ∂(a + b)/∂a = ∂(a + b)/∂b = identity


# --------------------------------------------------------------------------- softmax cross-entropy


def softmax_cross_entropy_forward(logits: np.ndarray, targets: np.ndarray):
    """Mean over tokens of -log softmax(logits)[target], computed stably through log-softmax.

    logits: (..., V)   targets: (...) integers in [0, V)   ->   loss: float, cache
    """
    logits = as_float_array(logits, "logits")
    targets = check_ids(targets, "targets", logits.shape[-1])
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets with shape {targets.shape} must match logits {logits.shape} without the last axis")
    shifted = logits - logits.max(axis=-1, keepdims=True)  # F1: (..., V), largest entry 0: exp cannot overflow
    log_z = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # F2: (..., 1), log of the normaliser
    log_p = shifted - log_z  # F3: (..., V) log-softmax
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]  # F4: (...) log p[target]
    loss = -picked.mean()  # F5: mean over the N = targets.size tokens
    return float(loss), (np.exp(log_p), targets)


def softmax_cross_entropy_backward(d_loss: float, cache):
    """d_loss (a scalar, 1.0 for the loss itself) -> d_logits (..., V).

    The log-softmax VJP, d_shifted = d_log_p - p · Σ d_log_p; with d_log_p = -onehot / N this is
    the familiar (p - onehot) / N.
    """
    p, targets = cache
    d_picked = np.full(targets.shape, -d_loss / targets.size, dtype=p.dtype)  # ← F5: (...)
    d_log_p = np.zeros_like(p)  # (..., V)
    np.put_along_axis(d_log_p, targets[..., None], d_picked[..., None], axis=-1)  # ← F4: only the target entry
    d_shifted = d_log_p - p * d_log_p.sum(axis=-1, keepdims=True)  # ← F3, F2: ∂log_z/∂shifted = p
    return d_shifted  # ← F1: each row of d_shifted sums to 0, so the subtracted max gets no gradient


# --------------------------------------------------------------------------- LayerNorm and GELU (forward only for now)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Normalise each token's feature vector to mean 0, variance 1, then scale and shift.

    x: (B, L, E)   gamma, beta: (E,)   ->   (B, L, E). The variance is the biased one (divide by E).
    """
    mean = x.mean(axis=-1, keepdims=True)  # (B, L, 1)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (B, L, 1)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta  # (B, L, E)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x · Φ(x) = 0.5 · x · (1 + erf(x / √2)); not the tanh approximation."""
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))  # a Python float keeps float32 float32
