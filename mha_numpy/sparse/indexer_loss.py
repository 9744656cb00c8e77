"""The lightning indexer's training loss, as the DeepSeek-V3.2 paper states it (§ 2.1, "continued pre-training").

The target of query t is the main attention's distribution over the keys, summed over its heads and L1-normalised,
with no gradient into the main attention (detached: a constant here):

    p_t = Σ_h A_h,t,: / ‖Σ_h A_h,t,:‖₁

and the loss is the KL divergence from the indexer's softmax to it, summed over the queries (and the batch):

    L = Σ_t KL(p_t ‖ softmax(I_t)) = Σ_t Σ_s p_ts (log p_ts - log softmax(I_t)_s)      (0 · log 0 = 0)

Dense warm-up: s runs over every key the mask allows (causal), the main attention dense. Sparse stage: s runs over
the selected keys S_t only, the target restricted to S_t and L1-normalised there (the sparse main attention's
weights already live on S_t). The sparse stage in O(L · k), the arrays laid out slot by slot (B, Lq, k), nothing
Lq × Lk::

    p = indexer_target(sparse_cache.selected_weights(), index >= 0)      # (B, H, Lq, k) -> (B, Lq, k)
    I, c_I = indexer_forward(x, q_resid, params, cfg, index=index)       # the selected keys' scores, gathered
    loss, c_L = indexer_loss_forward(I, p, index >= 0)                   # the -1 slots masked
    grads = indexer_backward(indexer_loss_backward(1.0, c_L), c_I)       # scattered to the chosen keys' rows

(``mask=`` a ``TopKSelection`` with (B, Lq, Lk) scores and target gives the same loss and gradients, densely.)

The paper also detaches the indexer's input from the main model (the indexer learns from L alone, the model from its
language loss alone): ``indexer.indexer_backward`` returns the gradients of x and q_resid too, and a training step
drops them.

Backward (with Σ_s p_ts = 1, or 0 for a row with no mass): ∂L/∂I_ts = softmax(I_t)_s · Σ_s' p_ts' - p_ts on the
allowed keys, 0 on the others. The scores are (B, Lq, Lk) (the dense warm-up) or (B, Lq, k) (the sparse stage).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array
from .topk import check_selection_mask, mask_rows


def _allowed(mask, shape) -> np.ndarray:
    """mask (None, bool, StructuredMask, TopKSelection) -> (b, Lq, Lk) bool entries (built: the loss is dense)."""
    m = check_selection_mask(mask, shape)
    return np.ones((1, *shape[1:]), dtype=bool) if m is None else mask_rows(m, 0, shape[1], shape[2])


def indexer_target(weights, mask=None) -> np.ndarray:
    """weights (B, H, Lq, Lk) the main attention's probabilities -> p (B, Lq, Lk): summed over heads, zero where
    ``mask`` blocks (the selection, in the sparse stage), L1-normalised per query (a row with no mass stays 0).
    A constant of the loss: nothing is differentiated through it."""
    A = as_float_array(weights, "weights", ndim=4)
    p = A.sum(axis=1)  # (B, Lq, Lk)
    p = np.where(_allowed(mask, p.shape), p, 0.0)
    total = np.abs(p).sum(axis=-1, keepdims=True)  # (B, Lq, 1) ‖·‖₁
    return p / np.where(total > 0, total, 1.0)


def indexer_loss_forward(scores, target, mask=None):
    """scores (B, Lq, Lk) the indexer's I, target (B, Lq, Lk) ``indexer_target``'s p, mask: the keys the softmax
    runs over (None: all; causal for the dense warm-up; the ``TopKSelection`` for the sparse stage) -> the loss
    (a 0-d array, Σ over queries and batch), cache. ValueError when the target puts mass on a key the mask blocks
    or is negative."""
    I = as_float_array(scores, "scores", ndim=3)  # noqa: E741
    p = as_float_array(target, "target", ndim=3)
    if p.shape != I.shape or p.dtype != I.dtype:
        raise ValueError(f"target {p.shape} {p.dtype} must have the scores' shape and dtype {I.shape} {I.dtype}")
    allowed = _allowed(mask, I.shape)  # (b, Lq, Lk)
    if np.any(p < 0) or np.any((p > 0) & ~allowed):
        raise ValueError("target must be >= 0 and 0 on the keys the mask blocks (make it with indexer_target(w, mask))")
    Z = np.where(allowed, I, -np.inf)  # F1: (B, Lq, Lk) only the allowed keys
    m = Z.max(axis=-1, keepdims=True)  # (B, Lq, 1), -inf for a row with no key
    m = np.where(np.isfinite(m), m, 0.0)
    E = np.exp(Z - m)  # 0 where blocked
    ell = E.sum(axis=-1, keepdims=True)
    log_q = np.where(allowed, Z - m - np.log(np.where(ell > 0, ell, 1.0)), 0.0)  # F2: log softmax, 0 where blocked
    log_p = np.log(np.where(p > 0, p, 1.0))  # 0 · log 0 = 0
    loss = np.sum(p * (log_p - log_q))  # F3: Σ_t KL(p_t ‖ q_t)
    return loss, (E / np.where(ell > 0, ell, 1.0), p)


def indexer_loss_backward(d_loss, cache) -> np.ndarray:
    """d_loss (a number) -> dI (B, Lq, Lk) = d_loss · (softmax(I) · Σ p - p), 0 on the blocked keys."""
    q, p = cache  # (B, Lq, Lk) each: q 0 where blocked
    return float(d_loss) * (q * p.sum(axis=-1, keepdims=True) - p)  # ← F3, F2, F1
