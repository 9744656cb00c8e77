"""Independent references for the tests: written with einsum and loops, sharing no code with mha_numpy.

- ``einsum_mha``: the module, one einsum per step, whole tensors at once.
- ``per_head_loop``: the module one (batch item, head) at a time, with explicit allowed-key sets (the
  "Σₕ headₕ W_oₕᵀ" reading of the formula).
- ``attention``: the attention alone on (B, H, L, d) arrays, with a float mask, a bias and a keep-mask.
- ``exact_attention_backward``: its gradients in 50-digit decimal arithmetic, the yardstick of rounding errors.
"""

from __future__ import annotations

import decimal

import numpy as np


def _softmax_rows(s):
    """Softmax over the last axis; rows with no finite entry (all -inf) give zeros, NaN stays NaN."""
    w = np.zeros_like(s)
    has_key = ~np.isneginf(s).all(-1)  # rows with at least one key allowed (or a NaN)
    z = s[has_key] - s[has_key].max(-1, keepdims=True)
    w[has_key] = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    return w


def attention(q, k, v, mask=None, scale=None, bias=None, keep=None, p=0.0, sinks=None):
    """softmax(q kᵀ · scale + bias + mask) (keep / (1 - p)) v -> (context, weights before dropout).

    sinks: None or (H,), gpt-oss's way: each head's logit appended as one more column after the mask, the softmax
    taken over it too, the column dropped (the weights returned are the keys')."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if sinks is not None:
        column = np.broadcast_to(np.asarray(sinks)[None, :, None, None], (*s.shape[:3], 1))  # (B, H, Lq, 1)
        s = np.concatenate([s, column], axis=-1)  # (B, H, Lq, Lk + 1)
    w = _softmax_rows(s)
    w = w if sinks is None else w[..., :-1]  # the sink's column dropped
    dropped = w if keep is None else w * keep / (1 - p)
    return np.einsum("bhqk,bhkd->bhqd", dropped, v), w


def einsum_mha(params, query, key, value, mask, H):
    """Straightforward reference: one einsum per step -> (output (B, Lq, E), weights (B, H, Lq, Lk))."""
    E = params["W_q"].shape[0]
    d = E // H

    def proj(x, w, b):
        return np.einsum("bli,oi->blo", x, params[w]) + params.get(b, 0.0)

    def heads(x):  # (B, L, E) -> (B, H, L, d)
        return x.reshape(x.shape[0], x.shape[1], H, d).transpose(0, 2, 1, 3)

    Q, K, V = heads(proj(query, "W_q", "b_q")), heads(proj(key, "W_k", "b_k")), heads(proj(value, "W_v", "b_v"))
    ctx, w = attention(Q, K, V, mask)
    ctx = ctx.transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], E)
    return proj(ctx, "W_o", "b_o"), w


def per_head_loop(params, query, key, value, keep, H):
    """One head and one batch element at a time; ``keep`` (B, H, Lq, Lk) bool = may attend."""
    B, Lq, E = query.shape
    d = E // H
    q = np.einsum("bli,oi->blo", query, params["W_q"]) + params.get("b_q", 0)
    k = np.einsum("bli,oi->blo", key, params["W_k"]) + params.get("b_k", 0)
    v = np.einsum("bli,oi->blo", value, params["W_v"]) + params.get("b_v", 0)
    out = np.zeros((B, Lq, E)) + params.get("b_o", 0)
    weights = np.zeros((B, H, Lq, key.shape[1]))
    for b in range(B):
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            s = np.einsum("id,jd->ij", q[b, :, sl], k[b, :, sl]) / np.sqrt(d)
            allowed = keep[b, h]
            for i in range(Lq):
                if allowed[i].any():
                    z = np.exp(s[i, allowed[i]] - s[i, allowed[i]].max())
                    weights[b, h, i, allowed[i]] = z / z.sum()
            out[b] += (weights[b, h] @ v[b, :, sl]) @ params["W_o"][:, sl].T  # Σₕ headₕ W_oₕᵀ
    return out, weights


def exact_lse(q, k, mask=None, scale=1.0, bias=None, sinks=None):
    """Each row's log Σ_j exp(s_ij) in decimal arithmetic (50 digits), rounded to float64: (B, H, Lq); -inf for a row
    with no allowed key. s = q kᵀ · scale + bias, then the mask (bool True = may attend, or float added): the exact
    value at the float inputs, shifted by the row's max so that a score near finfo.min stays exact too. sinks: None
    or (H,), each head's logit one more term of every row's sum."""
    ctx = decimal.Context(prec=50)
    dec = ctx.create_decimal
    B, H, Lq, Lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    full = (B, H, Lq, Lk)
    mask = None if mask is None else np.broadcast_to(mask, full)
    bias = None if bias is None else np.broadcast_to(bias, full)
    out = np.full((B, H, Lq), -np.inf)
    for b, h, i in np.ndindex(B, H, Lq):
        s = []  # the row's allowed scores
        for j in range(Lk):
            x = sum((dec(float(a)) * dec(float(c)) for a, c in zip(q[b, h, i], k[b, h, j])), dec(0)) * dec(scale)
            x += 0 if bias is None else dec(float(bias[b, h, i, j]))
            if mask is not None and (not mask[b, h, i, j] if mask.dtype == np.bool_ else np.isneginf(mask[b, h, i, j])):
                continue
            s.append(x if mask is None or mask.dtype == np.bool_ else x + dec(float(mask[b, h, i, j])))
        if sinks is not None:
            s.append(dec(float(sinks[h])))
        if s:
            top = max(s)
            out[b, h, i] = float(top + sum(((x - top).exp(ctx) for x in s), dec(0)).ln(ctx))
    return out


def exact_attention_backward(
    q, k, v, d_context, mask=None, scale=1.0, bias=None, keep=None, p=0.0, d_lse=None, sinks=None
):
    """The gradients of ``attention`` in decimal arithmetic with 50 significant digits, rounded to float64 at the end.

    q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv), d_context (B, H, Lq, dv); mask, bias, keep broadcast to
    (B, H, Lq, Lk) (dropout needs its ``keep``). The float inputs are taken as the exact numbers they are, so the
    result is the true gradient at those inputs (to ~1e-50): the yardstick for the rounding error of a float32 or
    float64 kernel. A loop over every score: small shapes only.
    d_lse: None or (B, H, Lq), the gradient of each row's log-sum-exp lse_i = log Σ_j exp(s_ij) beside the context's
    (∂ lse_i / ∂ s_ij = P_ij, written out here as its own term).
    sinks: None or (H,): each head's logit one more entry of every softmax row, of value 0 (gpt-oss).
    -> dq, dk, dv (the inputs' shapes), dS (B, H, Lq, Lk), the gradient of a bias before its broadcast, and d_sinks
    (H,) (None without sinks).
    """
    ctx = decimal.Context(prec=50)
    B, H, Lq, Lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    full = (B, H, Lq, Lk)
    mask = None if mask is None else np.broadcast_to(mask, full)
    bias = None if bias is None else np.broadcast_to(bias, full)
    keep = None if keep is None else np.broadcast_to(keep, full)

    def dec(x):
        return ctx.create_decimal(float(x))

    def dot(a, b):
        return sum((x * y for x, y in zip(a, b)), zero)

    zero, one, sc = dec(0), dec(1), dec(scale)
    drop = one / dec(1 - p)
    dq, dk, dv, ds = (np.zeros(shape) for shape in (q.shape, k.shape, v.shape, full))
    d_sinks = None if sinks is None else [zero] * H
    for b in range(B):
        for h in range(H):
            Q, K, V, dO = ([[dec(x) for x in row] for row in a[b, h]] for a in (q, k, v, d_context))
            dK, dV = [[zero] * k.shape[3] for _ in range(Lk)], [[zero] * v.shape[3] for _ in range(Lk)]
            for i in range(Lq):
                s = []  # the row's scores, None where blocked
                for j in range(Lk):
                    x = dot(Q[i], K[j]) * sc + (zero if bias is None else dec(bias[b, h, i, j]))
                    if mask is not None and mask.dtype == np.bool_:
                        x = x if mask[b, h, i, j] else None
                    elif mask is not None:
                        x = None if np.isneginf(mask[b, h, i, j]) else x + dec(mask[b, h, i, j])
                    s.append(x)
                sink = None if sinks is None else dec(sinks[h])
                if all(x is None for x in s):  # no key allowed: zero weights, zero gradients; the sink takes it all
                    if sink is not None and d_lse is not None:
                        d_sinks[h] += dec(d_lse[b, h, i])  # lse = sink there: its gradient is d_lse
                    continue
                top = max([x for x in s if x is not None] + ([] if sink is None else [sink]))
                e = [zero if x is None else (x - top).exp(ctx) for x in s]
                e_sink = zero if sink is None else (sink - top).exp(ctx)
                total = sum(e) + e_sink
                P = [x / total for x in e]  # the weights
                P_sink = e_sink / total
                kd = [one if keep is None else (drop if keep[b, h, i, j] else zero) for j in range(Lk)]  # keep / (1-p)
                dP = [dot(dO[i], V[j]) * kd[j] for j in range(Lk)]
                Dp = dot(P, dP)
                dS = [P[j] * (dP[j] - Dp) for j in range(Lk)]  # the softmax VJP
                if d_lse is not None:
                    dS = [x + P[j] * dec(d_lse[b, h, i]) for j, x in enumerate(dS)]  # the lse's: P_ij d_lse_i
                if sink is not None:  # the sink's entry: dP = 0 (no value), so P_sink (0 - Σ_j P_j dP_j) (+ d_lse's)
                    d_sinks[h] += P_sink * (-Dp + (zero if d_lse is None else dec(d_lse[b, h, i])))
                ds[b, h, i] = [float(x) for x in dS]
                dq[b, h, i] = [float(dot(dS, [K[j][c] for j in range(Lk)]) * sc) for c in range(k.shape[3])]
                for j in range(Lk):
                    dK[j] = [x + dS[j] * Q[i][c] * sc for c, x in enumerate(dK[j])]
                    dV[j] = [x + P[j] * kd[j] * dO[i][c] for c, x in enumerate(dV[j])]
            dk[b, h] = np.array([[float(x) for x in row] for row in dK]).reshape(dk[b, h].shape)
            dv[b, h] = np.array([[float(x) for x in row] for row in dV]).reshape(dv[b, h].shape)
    return dq, dk, dv, ds, None if sinks is None else np.array([float(x) for x in d_sinks])
