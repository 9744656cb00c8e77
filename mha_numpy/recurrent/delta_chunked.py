"""The gated delta rule by chunks: the WY/UT representation within a chunk, the state carried across chunks.

The same recurrence as ``delta_rule`` (R1–R4), on the same prepared arrays (q, k (B, H, L, dk), v (B, H, L, dv),
g, β (B, H, L): one decay a head and token), computed as transformers' ``torch_chunk_gated_delta_rule`` does. The
sequence is cut into N chunks of C tokens (the last padded with g = β = 0 and zero q, k, v, which leave the state
and the real tokens' outputs exactly as they are). In one chunk, with S the state entering it and i, j = 1 … C:

    C1  γ_i = Σ_{j≤i} g_j                                          the decay's log from the chunk's start
    C2  Γ_ij = exp(γ_i − γ_j) for j ≤ i, 0 above                   (C, C)
    C3  A = (Diag(β) K Kᵀ) ⊙ Γ, strictly lower                     (C, C)
    C4  T = (I + A)⁻¹ (forward substitution);  U = T (β ⊙ V),  Kc = T (β ⊙ e^γ ⊙ K)      the UT transform
    C5  P = (Q Kᵀ) ⊙ Γ;  Q̃ = e^γ ⊙ Q,  K̃ = e^(γ_C − γ) ⊙ K,  λ = e^(γ_C)
    S1  W = U − Kc S                                               (C, dv): row j is β_j u_j of R2–R3
    S2  O = Q̃ S + P W                                              (C, dv): the state's read + within the chunk
    S3  S ← λ S + K̃ᵀ W                                            (dk, dv): the state leaving the chunk

Why it is exact (docs/derivation.md § 30): unrolling R1–R3 inside the chunk gives
w_j = β_j (v_j − e^(γ_j) Sᵀ k_j − Σ_{m<j} Γ_jm (k_jᵀ k_m) w_m), a unit lower-triangular system (I + A) W =
β ⊙ V − (β e^γ ⊙ K) S, whose solution is S1; S2 and S3 are R4 and R3 summed in closed form. Only C1–C5 are
(C, C) arrays, one per chunk (never (L, L)); only S1–S3 run in sequence over the chunks.

The backward runs the chunks in reverse for the state's gradient (← S3, S2, S1: two products a chunk), then every
chunk at once back through C5…C1 (module functions, each line naming its forward line).
"""

from __future__ import annotations

import numpy as np


def unit_lower_inverse(A: np.ndarray) -> np.ndarray:
    """T = (I + A)⁻¹ for A (..., C, C) strictly lower triangular, by forward substitution:
    row i of T is e_i − Σ_{j<i} A_ij T_j (T unit lower triangular)."""
    C = A.shape[-1]
    T = np.zeros_like(A)
    T[..., range(C), range(C)] = 1.0
    for i in range(1, C):
        T[..., i, :i] = -(A[..., i, None, :i] @ T[..., :i, :i])[..., 0, :]  # (..., 1, i) @ (..., i, i) -> (..., i)
    return T


def to_chunks(x: np.ndarray, C: int) -> np.ndarray:
    """(B, H, L, ...) -> (B, H, N, C, ...), zero-padded to N·C tokens (a new array; the input is not modified)."""
    B, H, L = x.shape[:3]
    pad = -L % C
    if pad:
        x = np.concatenate([x, np.zeros((B, H, pad, *x.shape[3:]), dtype=x.dtype)], axis=2)  # (B, H, N·C, ...)
    return x.reshape(B, H, (L + pad) // C, C, *x.shape[3:])  # (B, H, N, C, ...)


def within_chunks(Q, K, V, Bt, gam):
    """C2, C3's β ⊙ K, C4's right-hand sides and C5 for every chunk at once (elementwise but one GEMM): Γ (…, C, C),
    β ⊙ K, β ⊙ V, β e^γ ⊙ K, P (…, C, C), Q̃, K̃ (…, C, dk), λ (B, H, N)."""
    C = Q.shape[3]
    lower = np.tril(np.ones((C, C), dtype=bool))
    diff = gam[..., :, None] - gam[..., None, :]  # C2: (B, H, N, C, 1) - (B, H, N, 1, C) -> (B, H, N, C, C)
    Gam = np.where(lower, np.exp(np.where(lower, diff, 0.0)), 0.0)  # C2: above the diagonal 0 (no exp overflow)
    kb = Bt[..., None] * K  # C3: β ⊙ K (B, H, N, C, dk)
    eg = np.exp(gam)[..., None]  # (B, H, N, C, 1)
    Bv, Bk = Bt[..., None] * V, eg * kb  # C4: β ⊙ V (…, C, dv), β e^γ ⊙ K (…, C, dk)
    P = (Q @ K.swapaxes(-1, -2)) * Gam  # C5: (…, C, dk) @ (…, dk, C) -> (…, C, C)
    Qt, Kt = eg * Q, np.exp(gam[..., -1:] - gam)[..., None] * K  # C5: (…, C, dk)
    lam = np.exp(gam[..., -1])  # C5: (B, H, N)
    return Gam, kb, Bv, Bk, P, Qt, Kt, lam


def delta_chunked_forward(q, k, v, g, beta, S0, chunk_size: int = 64):
    """C1–C5 for every chunk at once, then S1–S3 chunk by chunk.   q, k (B, H, L, dk), v (B, H, L, dv),
    g, beta (B, H, L), S0 (B, H, dk, dv)  ->  ((o (B, H, L, dv), S_L (B, H, dk, dv)), cache)."""
    B, H, L, dv = v.shape
    C = min(chunk_size, max(L, 1))
    Q, K, V, G, Bt = (to_chunks(x, C) for x in (q, k, v, g, beta))  # (B, H, N, C, ·)
    gam = np.cumsum(G, axis=-1)  # C1: (B, H, N, C)
    Gam, kb, Bv, Bk, P, Qt, Kt, lam = within_chunks(Q, K, V, Bt, gam)  # C2, C3, C5 and C4's right-hand sides
    A = np.tril((kb @ K.swapaxes(-1, -2)) * Gam, -1)  # C3: (B, H, N, C, dk) @ (B, H, N, dk, C) -> (…, C, C)
    T = unit_lower_inverse(A)  # C4: (B, H, N, C, C)
    U, Kc = T @ Bv, T @ Bk  # C4: (…, C, C) @ (…, C, dv) and @ (…, C, dk)
    N = Q.shape[2]
    states = np.empty((B, H, N, *S0.shape[2:]), dtype=v.dtype)  # the state entering each chunk
    W = np.empty_like(U)
    S = S0
    for n in range(N):
        states[:, :, n] = S
        W[:, :, n] = U[:, :, n] - Kc[:, :, n] @ S  # S1: (B, H, C, dk) @ (B, H, dk, dv) -> (B, H, C, dv)
        S = lam[:, :, n, None, None] * S + Kt[:, :, n].swapaxes(-1, -2) @ W[:, :, n]  # S3: (B, H, dk, C) @ (…, C, dv)
    O = Qt @ states + P @ W  # S2: (…, C, dk) @ (…, dk, dv) + (…, C, C) @ (…, C, dv), every chunk at once
    o = O.reshape(B, H, N * C, dv)[:, :, :L]  # (B, H, N·C, dv) -> (B, H, L, dv)
    return (o, S), (Q, K, V, Bt, gam, T, states, W, L, C)  # the rest is recomputed: elementwise, or one GEMM


def delta_chunked_backward(d_o, d_S, cache):
    """d_o (B, H, L, dv), d_S (B, H, dk, dv) or None  ->  (dq, dk, dv, dg, d_beta, dS0)."""
    Q, K, V, Bt, gam, T, states, W, L, C = cache
    within = within_chunks(Q, K, V, Bt, gam)  # the forward's C2–C5 again: Γ, kb, Bv, Bk, P, Q̃, K̃, λ
    _, _, _, Bk, P, Qt, Kt, lam = within
    Kc = T @ Bk  # C4: (…, C, C) @ (…, C, dk)
    B, H, N = Q.shape[:3]
    dO = to_chunks(d_o, C)  # (B, H, N, C, dv)
    dS = np.zeros((B, H, *states.shape[3:]), dtype=states.dtype) if d_S is None else d_S.copy()  # (B, H, dk, dv)
    dS_out = np.empty_like(states)  # the gradient of the state leaving each chunk
    dW = np.empty_like(W)
    PtdO = P.swapaxes(-1, -2) @ dO  # ← S2: Pᵀ dO (…, C, C) @ (…, C, dv)
    QtdO = Qt.swapaxes(-1, -2) @ dO  # ← S2: Q̃ᵀ dO (…, dk, C) @ (…, C, dv) -> (…, dk, dv)
    for n in reversed(range(N)):
        dS_out[:, :, n] = dS
        dW[:, :, n] = Kt[:, :, n] @ dS + PtdO[:, :, n]  # ← S3, S2: (B, H, C, dk) @ (B, H, dk, dv)
        dS = lam[:, :, n, None, None] * dS + QtdO[:, :, n] - Kc[:, :, n].swapaxes(-1, -2) @ dW[:, :, n]  # ← S3, S2, S1
    d_lam = np.sum(states * dS_out, axis=(-2, -1))  # ← S3: (B, H, N)
    dKt = W @ dS_out.swapaxes(-1, -2)  # ← S3: (…, C, dv) @ (…, dv, dk) -> (…, C, dk)
    dQt = dO @ states.swapaxes(-1, -2)  # ← S2: (…, C, dv) @ (…, dv, dk)
    dP = dO @ W.swapaxes(-1, -2)  # ← S2: (…, C, dv) @ (…, dv, C)
    dKc = -(dW @ states.swapaxes(-1, -2))  # ← S1: (…, C, dv) @ (…, dv, dk); and dU = dW
    grads = within_chunks_backward(dQt, dKt, dP, d_lam, dW, dKc, Q, K, V, Bt, gam, T, within)  # ← C5…C1

    def unchunk(x):  # (B, H, N, C, ...) -> (B, H, L, ...), the padding dropped
        return x.reshape(B, H, N * C, *x.shape[4:])[:, :, :L]

    return (*(unchunk(x) for x in grads), dS)


def within_chunks_backward(dQt, dKt, dP, d_lam, dU, dKc, Q, K, V, Bt, gam, T, within):
    """← C5…C1 for every chunk at once -> (dQ, dK, dV, dg, dβ), each (B, H, N, C, ·)."""
    Gam, kb, Bv, Bk, _, Qt, Kt, lam = within
    eg = np.exp(gam)[..., None]
    dgam = np.sum(dQt * Qt, axis=-1)  # ← C5: Q̃ = e^γ ⊙ Q
    dQ = eg * dQt  # ← C5
    r = np.sum(dKt * Kt, axis=-1)  # ← C5: K̃ = e^(γ_C − γ) ⊙ K, (B, H, N, C)
    dK = np.exp(gam[..., -1:] - gam)[..., None] * dKt  # ← C5
    dgam -= r
    dgam[..., -1] += np.sum(r, axis=-1) + lam * d_lam  # ← C5: γ_C in K̃ and in λ = e^(γ_C)
    dPm = dP * Gam  # ← C5: P = (Q Kᵀ) ⊙ Γ
    dQ += dPm @ K  # ← C5: (…, C, C) @ (…, C, dk)
    dK += dPm.swapaxes(-1, -2) @ Q  # ← C5
    dGam = dP * (Q @ K.swapaxes(-1, -2))  # ← C5: (…, C, dk) @ (…, dk, C)
    Tt = T.swapaxes(-1, -2)
    dT = dU @ Bv.swapaxes(-1, -2) + dKc @ Bk.swapaxes(-1, -2)  # ← C4: (…, C, dv) @ (…, dv, C) + (…, C, dk) @ (…, dk, C)
    dBv, dBk = Tt @ dU, Tt @ dKc  # ← C4: (…, C, C) @ (…, C, ·)
    dA = np.tril(-(Tt @ dT @ Tt), -1)  # ← C4: d(M⁻¹) = −M⁻¹ dM M⁻¹, M = I + A; A's strictly lower entries only
    dAm = dA * Gam  # ← C3: A = (kb Kᵀ) ⊙ Γ
    dkb = dAm @ K  # ← C3: (…, C, C) @ (…, C, dk)
    dK += dAm.swapaxes(-1, -2) @ kb  # ← C3
    dGam += dA * (kb @ K.swapaxes(-1, -2))  # ← C3: (…, C, dk) @ (…, dk, C)
    dkb += eg * dBk  # ← C4: Bk = e^γ ⊙ kb
    dgam += np.sum(dBk * Bk, axis=-1)  # ← C4
    dV = Bt[..., None] * dBv  # ← C4: Bv = β ⊙ V
    d_beta = np.sum(dBv * V, axis=-1) + np.sum(dkb * K, axis=-1)  # ← C4, C3: kb = β ⊙ K
    dK += Bt[..., None] * dkb  # ← C3
    G = dGam * Gam  # ← C2: ∂Γ_ij/∂γ_i = Γ_ij = −∂Γ_ij/∂γ_j
    dgam += np.sum(G, axis=-1) - np.sum(G, axis=-2)  # ← C2
    dg = np.cumsum(dgam[..., ::-1], axis=-1)[..., ::-1]  # ← C1: dg_j = Σ_{i≥j} dγ_i within the chunk
    return dQ, dK, dV, dg, d_beta
