"""Exercise 14's pair, the gated delta rule token by token, and the backward's classic mistakes as variants.

The exercise (exercises/ex14_delta_rule_backward.ipynb) gives the forward and asks for the backward through time.
One decay a head (Gated DeltaNet, Qwen3-Next's rule), on the core's prepared arrays: q, k (B, H, L, dk), v
(B, H, L, dv), g (B, H, L) ≤ 0, β (B, H, L), S₀ (B, H, dk, dv) or None. For t = 0 … L−1 (docs/derivation.md § 30.2):

    R1  S̃_t = a_t S_{t−1},  a_t = exp(g_t)
    R2  u_t = v_t − S̃_tᵀ k_t
    R3  S_t = S̃_t + β_t k_t u_tᵀ
    R4  o_t = S_tᵀ q_t

``delta_rule_recurrent_forward(q, k, v, g, beta, initial_state) -> (o, cache)`` with cache (q, k, v, g, beta,
initial_state, states), ``states`` (B, H, L + 1, dk, dv) holding S₀ and the state after each token (every state: the
exercise's backward reads them, where the library's keeps one every ``checkpoint`` tokens and recomputes); the
backward returns None for the initial state's gradient when none was given (docs/architecture.md's convention).
Both halves are the library's (``recurrent.delta_rule``), the cache translated; ``delta_backward_with`` is the
exercise's backward written plainly with one step wrong, the variants the checker names (``bugs``).
"""

from __future__ import annotations

import numpy as np

from ..recurrent import delta_rule as DR


def delta_rule_recurrent_forward(q, k, v, g, beta, initial_state):
    """R1–R4 for every token -> o (B, H, L, dv), cache (q, k, v, g, beta, initial_state, states), states
    (B, H, L + 1, dk, dv)."""
    B, H, L, dk = q.shape
    S0 = np.zeros((B, H, dk, v.shape[-1])) if initial_state is None else np.asarray(initial_state)
    (o, S_last), (_, _, _, _, _, saved, _, _) = DR.delta_rule_recurrent_forward(q, k, v, g, beta, S0, checkpoint=1)
    states = np.stack([*saved, S_last], axis=2)  # (B, H, L + 1, dk, dv): the state before each token, then the last
    return o, (q, k, v, g, beta, initial_state, states)


def delta_rule_recurrent_backward(d_o, cache):
    """d_o (B, H, L, dv) -> (dq, dk, dv, dg, d_beta, d_initial_state), the last None when the forward had none."""
    q, k, v, g, beta, initial_state, states = cache
    saved = [states[:, :, t] for t in range(q.shape[2])]  # S before token t: the library's checkpoints, one a token
    library_cache = (q, k, v, np.exp(g)[..., None], beta, saved, 1, g.shape)
    dq, dk, dv, dg, d_beta, dS0 = DR.delta_rule_recurrent_backward(d_o, None, library_cache)
    return dq, dk, dv, dg, d_beta, None if initial_state is None else dS0


def _carried(part: dict, t: int, carried, k_t, u, S_dec, S_prev, a_t, b_t) -> None:
    """Token t's dk, dv, dβ and dg computed from ``carried`` alone, the state's gradient the later tokens sent back
    (B, H, dk, dv): the steps ← R3, R2, R1 are linear in dS, so the rest is token t's own q_t do_tᵀ."""
    du = b_t * np.einsum("bhk,bhkv->bhv", k_t, carried)  # (B, H, dv)
    dS_u = np.einsum("bhkv,bhv->bhk", carried, u)  # (B, H, dk)
    part["v_carried"][:, :, t] = du
    part["k_carried"][:, :, t] = b_t * dS_u - np.einsum("bhkv,bhv->bhk", S_dec, du)
    part["b_carried"][:, :, t] = np.sum(k_t * dS_u, axis=-1)
    part["g_carried"][:, :, t] = a_t[..., 0, 0] * np.sum((carried - k_t[..., :, None] * du[..., None, :]) * S_prev,
                                                          axis=(-2, -1))  # fmt: skip


def delta_backward_with(carry: bool = True, beta_error: bool = True, decay_after: bool = True, key_read: bool = True):
    """The exercise's backward, plainly, with one step wrong: not ``carry``, the state's gradient restarted at every
    token (only q_t do_tᵀ); not ``beta_error``, dβ_t = k_tᵀ dS v_t (the write taken for β k vᵀ); not ``decay_after``,
    the decay applied to the gradient of S_t before the write's backward instead of after it; not ``key_read``, dk_t
    without the read of R2 (−S̃_t du_t). ``backward(d_o, cache, paths)`` with a dict ``paths`` fills it with the two
    paths into dk (the write's, the read's) and into dβ (through v_t and through the read of u_t), and the part of
    dk, dv, dβ and dg that the state's gradient carried back from the later tokens brings (each is linear in dS)."""

    def backward(d_o, cache, paths: dict | None = None):
        q, k, v, g, beta, initial_state, states = cache
        a = np.exp(g)  # (B, H, L)
        dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
        dg, d_beta = np.zeros(g.shape), np.zeros(beta.shape)
        dS = np.zeros(states.shape[:2] + states.shape[3:])  # (B, H, dk, dv)
        part = {n: np.zeros(k.shape) for n in ("k_write", "k_read", "k_carried")}
        part |= {n: np.zeros(beta.shape) for n in ("b_v", "b_r", "b_carried", "g_carried")}
        part["v_carried"] = np.zeros(v.shape)
        for t in reversed(range(q.shape[2])):
            a_t, b_t = a[:, :, t, None, None], beta[:, :, t, None]  # (B, H, 1, 1), (B, H, 1)
            q_t, k_t, v_t, do_t = q[:, :, t], k[:, :, t], v[:, :, t], d_o[:, :, t]
            S_prev, S_t = states[:, :, t], states[:, :, t + 1]  # (B, H, dk, dv)
            S_dec = a_t * S_prev  # R1
            u = v_t - np.einsum("bhk,bhkv->bhv", k_t, S_dec)  # R2
            outer = q_t[..., :, None] * do_t[..., None, :]  # ← R4: q_t do_tᵀ (B, H, dk, dv)
            _carried(part, t, dS if carry else 0 * dS, k_t, u, S_dec, S_prev, a_t, b_t)  # what later tokens sent
            dS = dS + outer if carry else outer
            if not decay_after:
                dS = a_t * dS
            dq[:, :, t] = np.einsum("bhkv,bhv->bhk", S_t, do_t)  # ← R4
            dS_u = np.einsum("bhkv,bhv->bhk", dS, u if beta_error else v_t)  # ← R3
            d_beta[:, :, t] = np.sum(k_t * dS_u, axis=-1)
            dS_u = np.einsum("bhkv,bhv->bhk", dS, u)
            du = b_t * np.einsum("bhk,bhkv->bhv", k_t, dS)  # ← R3
            dv[:, :, t] = du  # ← R2
            dk[:, :, t] = b_t * dS_u - (np.einsum("bhkv,bhv->bhk", S_dec, du) if key_read else 0.0)  # ← R3, R2
            part["k_write"][:, :, t], part["k_read"][:, :, t] = b_t * dS_u, -np.einsum("bhkv,bhv->bhk", S_dec, du)
            read = np.einsum("bhk,bhkv->bhv", k_t, S_dec)  # (B, H, dv): S̃_tᵀ k_t, the read of R2
            part["b_v"][:, :, t] = np.einsum("bhk,bhkv,bhv->bh", k_t, dS, v_t)  # dβ_t through u_t's v_t
            part["b_r"][:, :, t] = -np.einsum("bhk,bhkv,bhv->bh", k_t, dS, read)  # ... and through its −S̃_tᵀ k_t
            dS_dec = dS - k_t[..., :, None] * du[..., None, :]  # ← R2
            dg[:, :, t] = a_t[..., 0, 0] * np.sum(dS_dec * S_prev, axis=(-2, -1))  # ← R1
            dS = a_t * dS_dec if decay_after else dS_dec  # ← R1
        if paths is not None:
            paths.update(part)
        return dq, dk, dv, dg, d_beta, None if initial_state is None else dS

    return backward
