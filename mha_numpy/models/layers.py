"""The pairs of a Transformer other than attention, each ``NAME_forward -> (out, cache)`` /
``NAME_backward(d_out, cache)``: embedding lookup, residual add, softmax cross-entropy, LayerNorm, RMSNorm,
GELU, SiLU, the feed-forward blocks (GELU MLP, SwiGLU), BERT's embedding sum and mean pooling.

Like ``functional``, every backward line names the forward line it reverses (``# ← F1``); the
derivations are in ``docs/derivation.md``.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .._checks import as_array, as_float_array
from ..functional import rms_norm_backward, rms_norm_forward  # noqa: F401  (one pair: QK-norm's too)
from .erf import erf_float32

# --------------------------------------------------------------------------- embedding


def check_ids(ids, name: str, num_rows: int) -> np.ndarray:
    """``ids`` as an integer array, every id in [0, num_rows); else ValueError naming ``name`` and the shape."""
    ids = as_array(ids, name)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {ids.dtype} with shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        raise ValueError(
            f"{name} with shape {ids.shape} has ids outside [0, {num_rows}): min {ids.min()}, max {ids.max()}"
        )
    return ids


def checked_params(weights, expected: dict, dtype) -> dict[str, np.ndarray]:
    """A model's parameters from ``weights`` (name -> array): exactly the names of ``expected`` (name -> shape), each
    of its shape, copied into ``dtype`` (the caller's arrays are never shared), or ValueError naming the first wrong."""
    missing = [name for name in expected if name not in weights]
    if missing:
        raise ValueError(f"the weights lack {len(missing)} of the {len(expected)} tensors, e.g. {missing[:3]}")
    for name, shape in expected.items():
        if tuple(np.shape(weights[name])) != shape:
            raise ValueError(f"weight {name} has shape {tuple(np.shape(weights[name]))}, the config implies {shape}")
    return {name: np.array(weights[name], dtype=dtype, copy=True) for name in expected}


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


# --------------------------------------------------------------------------- LayerNorm


def layer_norm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float):
    """Normalise each feature vector to mean 0 and variance 1, then scale by gamma and shift by beta.

    x: (..., E)   gamma, beta: (E,)   ->   out: (..., E). The variance is the biased one (divide by E), as in
    torch.nn.LayerNorm. Derivation of the backward: docs/derivation.md, "LayerNorm".
    """
    x = as_float_array(x, "x")
    gamma, beta = as_float_array(gamma, "gamma", ndim=1), as_float_array(beta, "beta", ndim=1)
    if x.ndim < 1 or gamma.shape != (x.shape[-1],) or beta.shape != gamma.shape:
        raise ValueError(f"layer_norm: x {x.shape} needs gamma and beta of shape (E,), got {gamma.shape}, {beta.shape}")
    # Two (..., E) arrays are made, xc (becoming x_hat in place) and out: every fresh array costs its first touch
    # of memory (a page fault per 4 KiB, as much as the arithmetic at BERT's sizes), so the steps reuse them.
    mean = x.mean(axis=-1, keepdims=True)  # F1: (..., 1) μ
    xc = x - mean  # F2: (..., E) x - μ, a new array
    var = np.einsum("...e,...e->...", xc, xc)[..., None] / x.shape[-1]  # F3: (..., 1) σ² (biased), no (..., E) temp
    rstd = 1.0 / np.sqrt(var + eps)  # F4: (..., 1) 1/σ with σ = sqrt(σ² + eps)
    x_hat = xc  # F5: (..., E) normalised, in place: x - μ is not needed again
    x_hat *= rstd
    out = x_hat * gamma  # F6: (..., E)
    out += beta
    return out, (x_hat, rstd, gamma)


def layer_norm_backward(d_out: np.ndarray, cache):
    """d_out: (..., E) -> dx: (..., E), dgamma: (E,), dbeta: (E,).

    dx = (1/σ) · (dx̂ - mean(dx̂) - x̂ · mean(dx̂ · x̂)) with dx̂ = d_out · gamma: two row means, no E×E Jacobian.
    """
    x_hat, rstd, gamma = cache
    lead = tuple(range(d_out.ndim - 1))  # every axis but the features
    dgamma = (d_out * x_hat).sum(axis=lead)  # ← F6: (E,)
    dbeta = d_out.sum(axis=lead)  # ← F6: (E,)
    dx_hat = d_out * gamma  # ← F6: (..., E)
    mean_d = dx_hat.mean(axis=-1, keepdims=True)  # ← F2, F1: (..., 1) the part that moves μ
    mean_dx = np.einsum("...e,...e->...", dx_hat, x_hat)[..., None] / x_hat.shape[-1]  # ← F4, F3: (..., 1) moves σ
    dx = dx_hat  # ← F5 ... F1: (..., E) rstd · (dx̂ - mean_d - x̂ · mean_dx), in place on the fresh dx̂
    dx -= mean_d
    dx -= x_hat * mean_dx
    dx *= rstd
    return dx, dgamma, dbeta


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """The forward half alone: x (..., E) -> (..., E)."""
    return layer_norm_forward(x, gamma, beta, eps)[0]


# --------------------------------------------------------------------------- RMSNorm


# --------------------------------------------------------------------------- GELU

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_APPROXIMATIONS = ("none", "tanh")


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in x's dtype. float32: ``erf.erf_float32`` (NumPy passes, within 1 ulp,
    about twice as fast as scipy's scalar loop). Otherwise scipy.special.erf (compiled, ~10x faster than Python) when
    scipy is installed, else the C library's ``math.erf`` element by element, so that the core needs only NumPy."""
    if x.dtype == np.float32:
        return erf_float32(x)
    try:
        from scipy.special import erf as scipy_erf
    except ModuleNotFoundError:
        return np.vectorize(math.erf, otypes=[x.dtype])(x)
    return scipy_erf(x)


def gelu_forward(x: np.ndarray, approximate: str = "none"):
    """GELU(x) = x · Φ(x), Φ the standard normal CDF; elementwise, x: (...) -> (...).

    approximate="none" (BERT's): Φ(x) = (1 + erf(x / √2)) / 2, ``erf`` above (float32 stays float32).
    approximate="tanh" (GPT-2's): Φ(x) ≈ (1 + tanh(√(2/π) · (x + 0.044715 x³))) / 2, as torch's
    gelu(approximate="tanh").
    """
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    x = as_float_array(x, "x")
    if approximate == "none":
        u = np.divide(x, math.sqrt(2.0), out=np.empty_like(x))  # (...) an array even when 0-d; float32 stays float32
        cdf = erf(u)  # F1: (...) Φ(x) = (1 + erf(x / √2)) / 2
        cdf += 1.0  # in place on erf's fresh array (a fresh one costs its first touch of memory)
        cdf *= 0.5
    else:
        u = None  # no temporary of ours to write into
        cdf = 0.5 * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))  # F1: (...) tanh form of Φ(x)
    return np.multiply(x, cdf, out=u), (x, cdf, approximate)  # F2: (...), into u's memory when there is one


def gelu_backward(d_out: np.ndarray, cache):
    """d_out: (...) -> dx: (...). d/dx [x Φ(x)] = Φ(x) + x Φ'(x), Φ' = φ the Gaussian density (or the tanh form's)."""
    x, cdf, approximate = cache
    if approximate == "none":
        pdf = x * x  # ← F1: φ(x) = Φ'(x) = exp(-x²/2) / √(2π), in place on one fresh array
        pdf *= -0.5
        np.exp(pdf, out=pdf)
        pdf *= 1.0 / math.sqrt(2.0 * math.pi)
    else:
        t = 2.0 * cdf - 1.0  # tanh(u), recovered from F1
        pdf = 0.5 * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)  # ← F1: d/dx of the tanh form
    dx = pdf  # ← F2: product rule, d_out · (Φ(x) + x φ(x)), in place on pdf
    dx *= x
    dx += cdf
    dx *= d_out
    return dx


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """The forward half alone: x (...) -> (...)."""
    return gelu_forward(x, approximate)[0]


# --------------------------------------------------------------------------- feed-forward


def feed_forward_forward(x: np.ndarray, W1: np.ndarray, b1: np.ndarray, W2: np.ndarray, b2: np.ndarray,
                         approximate: str = "none"):  # fmt: skip
    """The Transformer's position-wise MLP, linear -> GELU -> linear (PyTorch layout W (out, in)).

    x: (..., E)   W1: (I, E)   b1: (I,)   W2: (E, I)   b2: (E,)   ->   out: (..., E); I = 4E in BERT.
    """
    h, c_1 = F.linear_forward(x, W1, b1)  # F1: (..., E) @ (E, I) -> (..., I)
    g, c_g = gelu_forward(h, approximate)  # F2: (..., I)
    out, c_2 = F.linear_forward(g, W2, b2)  # F3: (..., I) @ (I, E) -> (..., E)
    return out, (c_1, c_g, c_2)


def feed_forward_backward(d_out: np.ndarray, cache):
    """d_out: (..., E) -> dx (..., E), dW1 (I, E), db1 (I,), dW2 (E, I), db2 (E,)."""
    c_1, c_g, c_2 = cache
    d_g, dW2, db2 = F.linear_backward(d_out, c_2)  # ← F3: (..., E) @ (E, I) -> (..., I)
    d_h = gelu_backward(d_g, c_g)  # ← F2: (..., I)
    dx, dW1, db1 = F.linear_backward(d_h, c_1)  # ← F1: (..., I) @ (I, E) -> (..., E)
    return dx, dW1, db1, dW2, db2


# --------------------------------------------------------------------------- SiLU and SwiGLU


def silu_forward(x: np.ndarray):
    """SiLU(x) = x · σ(x), σ the logistic sigmoid (Llama's activation, torch's silu); elementwise, (...) -> (...)."""
    x = as_float_array(x, "x")
    e = np.exp(-np.abs(x))  # e^{-|x|} <= 1: never overflows
    s = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))  # F1: (...) σ(x), either form of 1 / (1 + e^{-x})
    return x * s, (x, s)  # F2: (...)


def silu_backward(d_out: np.ndarray, cache):
    """d_out: (...) -> dx: (...). d/dx [x σ(x)] = σ(x) + x σ(x)(1 - σ(x)) = σ(x)(1 + x(1 - σ(x)))."""
    x, s = cache
    return d_out * (s * (1.0 + x * (1.0 - s)))  # ← F2, F1: product rule, σ' = σ(1 - σ)


def swiglu_forward(x: np.ndarray, W_gate: np.ndarray, W_up: np.ndarray, W_down: np.ndarray):
    """Llama's feed-forward: down(silu(gate(x)) ⊙ up(x)), three linears without biases (PyTorch layout W (out, in)).

    x: (..., E)   W_gate, W_up: (I, E)   W_down: (E, I)   ->   out: (..., E); I = intermediate_size.
    """
    g, c_g = F.linear_forward(x, W_gate)  # F1: (..., E) @ (E, I) -> (..., I) the gate's pre-activation
    u, c_u = F.linear_forward(x, W_up)  # F2: (..., E) @ (E, I) -> (..., I)
    a, c_a = silu_forward(g)  # F3: (..., I)
    m = a * u  # F4: (..., I) the gated product
    out, c_d = F.linear_forward(m, W_down)  # F5: (..., I) @ (I, E) -> (..., E)
    return out, (c_g, c_u, c_a, a, u, c_d)


def swiglu_backward(d_out: np.ndarray, cache):
    """d_out: (..., E) -> dx (..., E), dW_gate (I, E), dW_up (I, E), dW_down (E, I)."""
    c_g, c_u, c_a, a, u, c_d = cache
    d_m, dW_down, _ = F.linear_backward(d_out, c_d)  # ← F5: (..., E) @ (E, I) -> (..., I)
    d_a, d_u = d_m * u, d_m * a  # ← F4: each factor gets the other one times d_m
    d_g = silu_backward(d_a, c_a)  # ← F3: (..., I)
    dx_up, dW_up, _ = F.linear_backward(d_u, c_u)  # ← F2: (..., I) @ (I, E) -> (..., E)
    dx_gate, dW_gate, _ = F.linear_backward(d_g, c_g)  # ← F1: (..., I) @ (I, E) -> (..., E)
    return dx_gate + dx_up, dW_gate, dW_up, dW_down  # x fed both F1 and F2: the sum of the two paths


# --------------------------------------------------------------------------- BERT's embedding sum


def bert_embeddings_forward(input_ids: np.ndarray, token_type_ids: np.ndarray, word: np.ndarray,
                            position: np.ndarray, token_type: np.ndarray, padding_idx: int | None = None):  # fmt: skip
    """word[input_ids] + position[0 ... L-1] + token_type[token_type_ids], before BERT's LayerNorm.

    input_ids, token_type_ids: (B, L) ints   word: (V, E)   position: (P, E), P >= L   token_type: (T, E)
    ->   out: (B, L, E). padding_idx: as torch's nn.Embedding(padding_idx=...), which BERT's word table uses:
    that row (the [PAD] token's) gets no gradient, so training never moves it.
    """
    input_ids, token_type_ids = as_array(input_ids, "input_ids"), as_array(token_type_ids, "token_type_ids")
    if input_ids.ndim != 2 or np.shape(token_type_ids) != input_ids.shape:
        raise ValueError(f"input_ids {input_ids.shape} and token_type_ids {np.shape(token_type_ids)} must be (B, L)")
    B, L = input_ids.shape
    positions = np.broadcast_to(np.arange(L), (B, L))  # (B, L): 0, 1, ..., L-1 in every row
    w, c_w = embedding_forward(input_ids, word)  # F1: (B, L, E)
    t, c_t = embedding_forward(token_type_ids, token_type)  # F2: (B, L, E)
    p, c_p = embedding_forward(positions, position)  # F3: (B, L, E)
    s, _ = add_forward(w, t)  # F4: (B, L, E)
    out, _ = add_forward(s, p)  # F5: (B, L, E)
    return out, (c_w, c_p, c_t, padding_idx)


def bert_embeddings_backward(d_out: np.ndarray, cache):
    """d_out: (B, L, E) -> d_word (V, E), d_position (P, E), d_token_type (T, E)."""
    c_w, c_p, c_t, padding_idx = cache
    d_s, d_p = add_backward(d_out)  # ← F5: (B, L, E) each
    d_w, d_t = add_backward(d_s)  # ← F4: (B, L, E) each
    d_word = embedding_backward(d_w, c_w)  # ← F1: (V, E)
    if padding_idx is not None:
        d_word[padding_idx] = 0.0  # the padding row is frozen, as in torch (← F1)
    return d_word, embedding_backward(d_p, c_p), embedding_backward(d_t, c_t)  # ← F3, F2


# --------------------------------------------------------------------------- mean pooling


def mean_pool_forward(x: np.ndarray, attention_mask: np.ndarray):
    """The mean of the token vectors over real tokens (sentence-transformers' pooling, without the unit norm).

    x: (B, L, E)   attention_mask: (B, L) 1 = real token, 0 = padding   ->   out: (B, E)
    """
    x, attention_mask = as_float_array(x, "x", ndim=3), as_array(attention_mask, "attention_mask")
    if attention_mask.shape != x.shape[:2]:
        raise ValueError(f"attention_mask with shape {attention_mask.shape} must be (B, L) = {x.shape[:2]}")
    w = attention_mask.astype(x.dtype)[:, :, None]  # (B, L, 1)
    w = w / np.maximum(w.sum(axis=1, keepdims=True), 1.0)  # (B, L, 1): 1/n_b on real tokens, 0 on padding
    return (x * w).sum(axis=1), w  # F1: (B, L, E) -> (B, E)


def mean_pool_backward(d_out: np.ndarray, cache):
    """d_out: (B, E) -> dx: (B, L, E); padding positions get 0."""
    w = cache
    return d_out[:, None, :] * w  # ← F1: (B, 1, E) * (B, L, 1) -> (B, L, E)
