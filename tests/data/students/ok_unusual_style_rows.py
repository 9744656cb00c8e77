"""A correct student's file in unusual styles (einsum, explicit Jacobians, one-hot products, the inverse rotation as
the forward at −θ): every function passes and no relation is said (tests/test_checker_relations.py)."""

import numpy as np


def linear_forward(x, W, b):
    return np.einsum("...i,oi->...o", x, W) + b, (x, W)


def linear_backward(dy, cache):
    x, W = cache
    lead = list(range(dy.ndim - 1))
    dW = np.tensordot(dy, x, axes=(lead, lead))  # Σ over every leading axis: (out, in)
    return np.einsum("...o,oi->...i", dy, W), dW, np.sum(dy, axis=tuple(lead))


def embedding_forward(ids, table):
    onehot = np.eye(table.shape[0])[ids]  # (..., V)
    return onehot @ table, onehot  # (..., V) @ (V, E)


def embedding_backward(d_out, cache):
    onehot = cache
    lead = list(range(d_out.ndim - 1))
    return np.tensordot(onehot, d_out, axes=(lead, lead))  # onehotᵀ @ d_out: repeats add up by themselves


def softmax_forward(x):
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isneginf(top), 0.0, top)
    lse = top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True))  # -inf for a row of -inf
    p = np.where(np.isneginf(lse), 0.0, np.exp(x - np.where(np.isneginf(lse), 0.0, lse)))
    return p, p


def softmax_backward(dp, cache):
    p = cache
    jac = np.einsum("...i,ij->...ij", p, np.eye(p.shape[-1])) - np.einsum("...i,...j->...ij", p, p)  # diag(p) − ppᵀ
    return np.einsum("...ij,...j->...i", jac, dp)  # the Jacobian is symmetric


def layer_norm_forward(x, gamma, beta, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    sigma = np.sqrt(np.mean((x - mu) ** 2, axis=-1, keepdims=True) + eps)
    xhat = (x - mu) / sigma
    return gamma * xhat + beta, (xhat, sigma, gamma)


def layer_norm_backward(d_out, cache):
    xhat, sigma, gamma = cache
    E = xhat.shape[-1]
    eye = np.eye(E)
    # the Jacobian of x̂ by x, row by row: (I − 1/E − x̂ x̂ᵀ / E) / σ, (..., E, E)
    jac = (eye - 1.0 / E - np.einsum("...i,...j->...ij", xhat, xhat) / E) / sigma[..., None]
    dx = np.einsum("...ij,...i->...j", jac, d_out * gamma)
    lead = tuple(range(d_out.ndim - 1))
    return dx, np.sum(d_out * xhat, axis=lead), np.sum(d_out, axis=lead)


def softmax_cross_entropy_forward(logits, targets):
    top = logits.max(axis=-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(logits - top).sum(axis=-1))  # (...)
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return float(np.mean(lse - picked)), (np.exp(logits - lse[..., None]), np.eye(logits.shape[-1])[targets])


def softmax_cross_entropy_backward(d_loss, cache):
    p, onehot = cache
    return d_loss * (p - onehot) / (p.size // p.shape[-1])


def dropout_forward(x, p, rng, keep_mask):
    return np.where(keep_mask, x / (1 - p), 0.0), (keep_mask, 1 / (1 - p))


def dropout_backward(d_out, cache):
    keep_mask, gain = cache
    return np.where(keep_mask, d_out * gain, 0.0)


def repeat_kv_forward(x, n_rep):
    heads = np.arange(x.shape[1] * n_rep) // n_rep  # query head h reads k/v head h // n_rep
    return x[:, heads], (x.shape, heads)


def repeat_kv_backward(d_out, cache):
    shape, heads = cache
    dx = np.zeros(shape)
    np.add.at(dx, (slice(None), heads), d_out)  # every copy adds to its head
    return dx


def _turn(x, positions, theta, sign):
    B, H, L, d = x.shape
    pos = np.arange(L) if positions is None else np.asarray(positions)
    angles = sign * pos[..., None] / theta ** (np.arange(d // 2) * 2 / d)  # (..., L, d/2)
    if angles.ndim == 3:
        angles = angles[:, None]  # (B, 1, L, d/2)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    c, s = np.cos(angles), np.sin(angles)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)  # each pair (i, i + d/2) turned


def rope_forward(x, positions, theta):
    return _turn(x, positions, theta, 1.0), (positions, theta)


def rope_backward(d_out, cache):
    positions, theta = cache
    return _turn(d_out, positions, theta, -1.0)  # a rotation's transpose is the turn back


def soft_cap_forward(scores, cap):
    return cap * np.tanh(scores / cap), (scores, cap)


def soft_cap_backward(d_out, cache):
    scores, cap = cache
    return d_out / np.cosh(scores / cap) ** 2  # tanh' = 1 / cosh²
