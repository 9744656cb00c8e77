"""The gates of the delta rule's layers: the write strength β and the decay g, each a pair with its backward.

    β = σ(b)                                       the write strength of each token, in (0, 1)
    g = −exp(A_log) · softplus(a + dt_bias)        the log of the state's decay, ≤ 0 (the state is scaled by e^g)
    Δ = clamp(softplus(dt + dt_bias), lo, hi)      Mamba-2's time step (``time_step_forward``), ≥ 0

Qwen3-Next (``Qwen3NextGatedDeltaNet``): a (…, H) and b (…, H) are projections of the token, one decay per value
head, A_log and dt_bias (H,) (``decay_forward``). Kimi Linear (``KimiLinearForgetGate``): a (…, H, d), one decay
per head and key channel, A_log (H,) and dt_bias (H, d) (the same ``decay_forward``; A_log broadcast over d).

softplus(u) = log(1 + e^u) is computed as max(u, 0) + log1p(e^−|u|), which overflows nowhere; its derivative is
σ(u). torch's ``F.softplus`` (Qwen3-Next) and Kimi's ``torch.where(g > 20, g, log(1 + exp(g)))`` return u itself
above 20, a relative difference below 1e-10 there (e^−20 / 20), and a derivative of 1 instead of σ(u) = 1 − 2e-9.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array


def sigmoid_forward(x):
    """σ(x) = 1 / (1 + e^−x) elementwise, as (1 + tanh(x/2)) / 2 (overflows nowhere). (…) -> ((…), cache)."""
    x = as_float_array(x, "x")
    s = 0.5 * (1.0 + np.tanh(0.5 * x))  # F1: (…)
    return s, s


def sigmoid_backward(d_out, cache):
    """d_out: (…) -> dx: (…); σ' = σ (1 − σ)."""
    s = cache
    return d_out * s * (1.0 - s)  # ← F1


def softplus_forward(u):
    """softplus(u) = log(1 + e^u) elementwise, as max(u, 0) + log1p(e^−|u|). (…) -> ((…), cache)."""
    u = as_float_array(u, "u")
    sp = np.maximum(u, 0) + np.log1p(np.exp(-np.abs(u)))  # F1: (…)
    return sp, u


def softplus_backward(d_out, cache):
    """d_out: (…) -> du: (…); softplus' = σ."""
    u = cache
    return d_out * (0.5 * (1.0 + np.tanh(0.5 * u)))  # ← F1


def check_decay(a, A_log, dt_bias):
    """a (…, H) or (…, H, d); A_log (H,); dt_bias a's trailing shape past the leading dims ((H,) or (H, d))."""
    a = as_float_array(a, "a")
    A_log = as_float_array(A_log, "A_log", ndim=1)
    dt_bias = as_float_array(dt_bias, "dt_bias")
    H = A_log.shape[0]
    if dt_bias.ndim not in (1, 2) or dt_bias.shape[0] != H:
        raise ValueError(f"dt_bias with shape {dt_bias.shape} must be (H,) or (H, d) with H = {H} (A_log's)")
    if a.ndim < dt_bias.ndim or a.shape[a.ndim - dt_bias.ndim :] != dt_bias.shape:
        raise ValueError(f"a with shape {a.shape} must end in dt_bias's shape {dt_bias.shape}")
    if not a.dtype == A_log.dtype == dt_bias.dtype:
        raise ValueError(f"a, A_log, dt_bias must share one dtype: got {a.dtype}, {A_log.dtype}, {dt_bias.dtype}")
    return a, A_log, dt_bias


def decay_forward(a, A_log, dt_bias):
    """g = −exp(A_log) · softplus(a + dt_bias): the log-decay of the state, ≤ 0.

    a: (…, H) (one decay a head: Qwen3-Next) or (…, H, d) (one a key channel: Kimi)   A_log: (H,)
    dt_bias: (H,) or (H, d), a's trailing shape   ->   (g of a's shape, cache)
    """
    a, A_log, dt_bias = check_decay(a, A_log, dt_bias)
    per_channel = dt_bias.ndim == 2
    sp, c_sp = softplus_forward(a + dt_bias)  # F1: (…, H[, d]) softplus(a + dt_bias)
    A = np.exp(A_log)  # F2: (H,) the decay rate
    A_b = A[:, None] if per_channel else A  # (H, 1) or (H,): broadcast over the channels
    g = -A_b * sp  # F3: (…, H[, d])
    return g, (sp, c_sp, A, A_b, per_channel)


def decay_backward(d_g, cache):
    """d_g: a's shape -> da (a's shape), dA_log (H,), ddt_bias (dt_bias's shape)."""
    sp, c_sp, A, A_b, per_channel = cache
    d_g = as_float_array(d_g, "d_g")
    if d_g.shape != sp.shape:
        raise ValueError(f"d_g with shape {d_g.shape} must be g's shape {sp.shape}")
    head_axes = 2 if per_channel else 1
    lead = tuple(range(d_g.ndim - head_axes))  # every axis before the heads
    d_A = -(d_g * sp).sum(axis=lead)  # ← F3: (H[, d])
    if per_channel:
        d_A = d_A.sum(axis=-1)  # ← F3: (H,) A_log was broadcast over the channels
    dA_log = d_A * A  # ← F2: d exp(A_log) = exp(A_log)
    da = softplus_backward(-A_b * d_g, c_sp)  # ← F3, F1: (…, H[, d])
    return da, dA_log, da.sum(axis=lead)  # ← F1: dt_bias was added to every token


def time_step_forward(dt, dt_bias, limit=(0.0, float("inf"))):
    """Δ = clamp(softplus(dt + dt_bias), lo, hi): Mamba-2's time step of each token and head (``Mamba2Mixer``, its
    ``time_step_limit``; the SSD's dt, ``recurrent.ssd``).

    dt: (…, H)   dt_bias: (H,)   limit: (lo, hi) with 0 ≤ lo ≤ hi (hi may be inf)   ->   (Δ (…, H), cache)
    """
    dt = as_float_array(dt, "dt")
    dt_bias = as_float_array(dt_bias, "dt_bias", ndim=1)
    if dt.ndim < 1 or dt.shape[-1] != dt_bias.shape[0] or dt.dtype != dt_bias.dtype:
        raise ValueError(f"dt with shape {dt.shape} and dtype {dt.dtype} must be (…, H) with dt_bias's H = "
                         f"{dt_bias.shape[0]} and dtype {dt_bias.dtype}")  # fmt: skip
    lo, hi = check_time_step_limit(limit)
    sp, c_sp = softplus_forward(dt + dt_bias)  # F1: (…, H)
    return np.clip(sp, lo, hi), (c_sp, (sp >= lo) & (sp <= hi))  # F2: (…, H)


def time_step_backward(d_delta, cache):
    """d_delta: (…, H) -> d_dt (…, H), d_dt_bias (H,); the clamp passes the gradient where softplus lies in
    [lo, hi], bounds included (torch.clamp's rule), and none outside."""
    c_sp, inside = cache
    d_delta = as_float_array(d_delta, "d_delta")
    if d_delta.shape != inside.shape:
        raise ValueError(f"d_delta with shape {d_delta.shape} must be the time step's shape {inside.shape}")
    d_u = softplus_backward(d_delta * inside, c_sp)  # ← F2, F1: (…, H)
    return d_u, d_u.sum(axis=tuple(range(d_u.ndim - 1)))  # ← F1: dt_bias was added to every token


def check_time_step_limit(limit) -> tuple[float, float]:
    """(lo, hi) as floats with 0 ≤ lo ≤ hi (hi may be inf), or ValueError naming ``limit``."""
    try:
        lo, hi = (float(v) for v in limit)
    except (TypeError, ValueError):
        raise ValueError(f"limit must be a pair (lo, hi) of numbers, got {limit!r}") from None
    if not 0.0 <= lo <= hi or np.isnan(hi):
        raise ValueError(f"limit must be (lo, hi) with 0 <= lo <= hi, got {limit!r}")
    return lo, hi
