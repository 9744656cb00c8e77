"""The gated delta rule by chunks: the WY/UT representation within a chunk, the state carried across chunks.

The same recurrence as ``delta_rule`` (R1–R4), on the same prepared arrays (q, k (B, H, L, dk), v (B, H, L, dv),
g (B, H, L) or per key channel (B, H, L, dk), β (B, H, L)), computed as transformers' ``torch_chunk_gated_delta_rule``
(and ``chunk_kimi_delta_attention``) does. The sequence is cut into N chunks of C tokens (the last padded with
g = β = 0 and zero q, k, v, which leave the state and the real tokens' outputs exactly as they are). In one chunk,
with S the state entering it and i, j = 1 … C:

    C1  γ_i = Σ_{j≤i} g_j                                          the decay's log from the chunk's start
    C2  Γ_ij = exp(γ_i − γ_j) for j ≤ i, 0 above                   per channel with Kimi's gate (``decayed``)
    C3  A_ij = β_i Σ_d k_id k_jd Γ_ijd for j < i, 0 elsewhere      (C, C); one gate a head: (Diag(β) K Kᵀ) ⊙ Γ
    C4  T = (I + A)⁻¹ (forward substitution);  U = T (β ⊙ V),  Kc = T (β ⊙ e^γ ⊙ K)      the UT transform
    C5  P_ij = Σ_d q_id k_jd Γ_ijd (j ≤ i);  Q̃ = e^γ ⊙ Q,  K̃ = e^(γ_C − γ) ⊙ K,  λ = e^(γ_C)
    S1  W = U − Kc S                                               (C, dv): row j is β_j u_j of R2–R3
    S2  O = Q̃ S + P W                                              (C, dv): the state's read + within the chunk
    S3  S ← Diag(λ) S + K̃ᵀ W                                      (dk, dv): the state leaving the chunk

Why it is exact (docs/derivation.md § 30.4): unrolling R1–R3 inside the chunk gives
w_j = β_j (v_j − Sᵀ(e^(γ_j) ⊙ k_j) − Σ_{m<j} (Γ_jm ⊙ k_j)ᵀ k_m w_m), a unit lower-triangular system
(I + A) W = β ⊙ V − (β e^γ ⊙ K) S, whose solution is S1; S2 and S3 are R4 and R3 summed in closed form. Only
C2–C5 are (C, C) arrays, one per chunk (never (L, L)); only S1–S3 run in sequence over the chunks.

C1–C5 and S2 are formed for a block of chunks (about ``BLOCK_TOKENS`` tokens) at a time, so the temporaries do not
grow with L. The backward walks the blocks in reverse: the state's gradient through each chunk of the block
(← S3, S2, S1: two products a chunk), then the whole block back through C5…C1 (``within_chunks_backward``, each
line naming its forward line).

Threads: the B·H sequences are independent, so they are cut into bands, one per thread NumPy's BLAS may use
(``threads.blas_threads``: ``threadpoolctl``'s limit or ``OPENBLAS_NUM_THREADS``), each band run whole on the
house's pool with BLAS itself held to one thread. The products here are small ((C, dk) @ (dk, dv), (C, C) @
(C, d)), and BLAS's own threads split each of them at a cost larger than the product: at L = 4096, H = 2,
d = 128, float32, on 2 shared cores, forward + backward went from 1.04 s (BLAS on two threads) to 0.27 s, 4.3×
(docs/performance.md, the gated delta rule). Every head's arithmetic is the same in any band: the numbers do not
depend on the threads.
"""

from __future__ import annotations

import numpy as np

from .. import threads
from .decayed import decayed_products_backward, decayed_products_cache, decayed_products_forward

BLOCK_TOKENS = 4096  # the tokens of a block of chunks (chunk_blocks)


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
    """C3's β ⊙ K, C4's right-hand sides and C5's elementwise terms for every chunk at once: β ⊙ K, β ⊙ V,
    β e^γ ⊙ K, Q̃, K̃ (…, C, ·), λ (B, H, N, 1 or dk)."""
    kb = Bt[..., None] * K  # C3: β ⊙ K (B, H, N, C, dk)
    eg = np.exp(gam)  # (B, H, N, C, 1 or dk)
    Bv, Bk = Bt[..., None] * V, eg * kb  # C4: β ⊙ V (…, C, dv), β e^γ ⊙ K (…, C, dk)
    Qt, Kt = eg * Q, np.exp(gam[..., -1:, :] - gam) * K  # C5: (…, C, dk)
    lam = np.exp(gam[..., -1, :])  # C5: (B, H, N, 1 or dk), the rows of S
    return kb, Bv, Bk, Qt, Kt, lam


def chunk_blocks(N: int, C: int, reverse: bool = False) -> list[slice]:
    """The chunks in blocks of about BLOCK_TOKENS tokens: what is not carried across chunks is formed a block at a
    time, so the temporaries do not grow with L."""
    step = max(1, BLOCK_TOKENS // C)
    blocks = [slice(s, min(s + step, N)) for s in range(0, N, step)]
    return blocks[::-1] if reverse else blocks


def head_bands(BH: int) -> list[slice]:
    """The B·H sequences in consecutive bands, one per thread NumPy's BLAS may use (at most B·H bands)."""
    return threads.row_bands(BH, max(1, min(threads.blas_threads(), BH)))


def on_bands(work, bands: list[slice]) -> None:
    """``work(i)`` for every band i, on the pool (one thread a band), BLAS held to one thread throughout."""
    with threads.blas_single_threaded():
        threads.run_items(work, range(len(bands)), len(bands))


def delta_chunked_forward(q, k, v, g, beta, S0, chunk_size: int = 64):
    """The chunked form, its B·H sequences in bands run side by side (``band_forward`` on each): the same
    arguments and results as ``band_forward``; the cache holds the bands' caches."""
    B, H, L, dv = v.shape
    flat = [x.reshape(1, B * H, *x.shape[2:]) for x in (q, k, v, g, beta, S0)]  # (B, H, ...) -> (1, B·H, ...)
    o = np.empty((1, B * H, L, dv), dtype=v.dtype)  # (1, B·H, L, dv)
    S = np.empty((1, B * H, *S0.shape[2:]), dtype=v.dtype)  # (1, B·H, dk, dv)
    bands = head_bands(B * H)
    caches = [None] * len(bands)

    def work(i):
        (o[:, bands[i]], S[:, bands[i]]), caches[i] = band_forward(*(x[:, bands[i]] for x in flat), chunk_size)

    on_bands(work, bands)
    return (o.reshape(B, H, L, dv), S.reshape(S0.shape)), (bands, caches, q.shape, v.shape, g.shape)


def delta_chunked_backward(d_o, d_S, cache):
    """d_o (B, H, L, dv), d_S (B, H, dk, dv) or None  ->  (dq, dk, dv, dg, d_beta, dS0), ``band_backward`` on
    each band of the forward."""
    bands, caches, q_shape, v_shape, g_shape = cache
    B, H, L, dv = v_shape
    flat_o = d_o.reshape(1, B * H, L, dv)  # (B, H, L, dv) -> (1, B·H, L, dv)
    flat_S = None if d_S is None else d_S.reshape(1, B * H, *d_S.shape[2:])  # (1, B·H, dk, dv)
    dtype = d_o.dtype
    shapes = (q_shape, q_shape, v_shape, g_shape, v_shape[:3], (B, H, q_shape[3], dv))  # dq, dk, dv, dg, dβ, dS0
    grads = [np.empty((1, B * H, *s[2:]), dtype=dtype) for s in shapes]  # each (1, B·H, ...)

    def work(i):
        b = bands[i]
        band = band_backward(flat_o[:, b], None if flat_S is None else flat_S[:, b], caches[i])
        for out, x in zip(grads, band, strict=True):
            out[:, b] = x

    on_bands(work, bands)
    return tuple(x.reshape(s) for x, s in zip(grads, shapes, strict=True))


def band_forward(q, k, v, g, beta, S0, chunk_size: int = 64):
    """C1–C5 a block of chunks at a time, S1–S3 chunk by chunk.   q, k (B, H, L, dk), v (B, H, L, dv),
    g (B, H, L) or (B, H, L, dk), beta (B, H, L), S0 (B, H, dk, dv)  ->  ((o (B, H, L, dv), S_L), cache)."""
    B, H, L, dv = v.shape
    C = min(chunk_size, max(L, 1))
    Q, K, V, G, Bt = (to_chunks(x, C) for x in (q, k, v, g if g.ndim == 4 else g[..., None], beta))  # (B, H, N, C, ·)
    gam = np.cumsum(G, axis=-2)  # C1: (B, H, N, C, 1 or dk)
    N = Q.shape[2]
    T, P = (np.empty((B, H, N, C, C), dtype=v.dtype) for _ in range(2))
    states = np.empty((B, H, N, *S0.shape[2:]), dtype=v.dtype)  # the state entering each chunk
    W, O = np.empty(V.shape, dtype=v.dtype), np.empty(V.shape, dtype=v.dtype)  # (B, H, N, C, dv)
    S = S0
    for b in chunk_blocks(N, C):
        Qb, Kb, gb = Q[:, :, b], K[:, :, b], gam[:, :, b]
        kb, Bv, Bk, Qt, Kt, lam = within_chunks(Qb, Kb, V[:, :, b], Bt[:, :, b], gb)
        A, _ = decayed_products_forward(kb, Kb, gb, strict=True)  # C2, C3: (B, H, n, C, C), strictly lower
        T[:, :, b] = unit_lower_inverse(A)  # C4
        U, Kc = T[:, :, b] @ Bv, T[:, :, b] @ Bk  # C4: (…, C, C) @ (…, C, dv) and @ (…, C, dk)
        P[:, :, b], _ = decayed_products_forward(Qb, Kb, gb)  # C2, C5: (…, C, C), the diagonal included
        for i, n in enumerate(range(b.start, b.stop)):
            states[:, :, n] = S
            W[:, :, n] = U[:, :, i] - Kc[:, :, i] @ S  # S1: (B, H, C, dk) @ (B, H, dk, dv) -> (B, H, C, dv)
            S = lam[:, :, i, :, None] * S + Kt[:, :, i].swapaxes(-1, -2) @ W[:, :, n]  # S3: (B, H, dk, C) @ (…, C, dv)
        O[:, :, b] = Qt @ states[:, :, b] + P[:, :, b] @ W[:, :, b]  # S2: (…, C, dk) @ (…, dk, dv) + (…, C, C) @ (…)
    o = O.reshape(B, H, N * C, dv)[:, :, :L]  # (B, H, N·C, dv) -> (B, H, L, dv)
    return (o, S), (Q, K, V, Bt, gam, T, P, states, W, L, C, g.shape)


def band_backward(d_o, d_S, cache):
    """d_o (B, H, L, dv), d_S (B, H, dk, dv) or None  ->  (dq, dk, dv, dg, d_beta, dS0): the blocks of chunks in
    reverse, the state's gradient carried through each block's chunks, then the block's ← C5…C1."""
    Q, K, V, Bt, gam, T, P, states, W, L, C, g_shape = cache
    B, H, N = Q.shape[:3]
    dO = to_chunks(d_o, C)  # (B, H, N, C, dv)
    dS = np.zeros((B, H, *states.shape[3:]), dtype=states.dtype) if d_S is None else d_S.copy()  # (B, H, dk, dv)
    dQ, dK, dV, dgam, d_beta = (np.empty(x.shape, dtype=x.dtype) for x in (Q, K, V, gam, Bt))
    for b in chunk_blocks(N, C, reverse=True):
        blocks = (x[:, :, b] for x in (dO, Q, K, V, Bt, gam, T, P, states, W))
        dS, (dQ[:, :, b], dK[:, :, b], dV[:, :, b], dgam[:, :, b], d_beta[:, :, b]) = block_backward(dS, *blocks)
    dg = np.cumsum(dgam[..., ::-1, :], axis=-2)[..., ::-1, :]  # ← C1: dg_j = Σ_{i≥j} dγ_i within the chunk

    def unchunk(x):  # (B, H, N, C, ...) -> (B, H, L, ...), the padding dropped
        return x.reshape(B, H, N * C, *x.shape[4:])[:, :, :L]

    return unchunk(dQ), unchunk(dK), unchunk(dV), unchunk(dg).reshape(g_shape), unchunk(d_beta), dS


def block_backward(dS, dO, Q, K, V, Bt, gam, T, P, states, W):
    """One block of chunks (…, n, C, ·), dS the gradient of the state leaving its last chunk -> (the gradient of
    the state entering its first, (dQ, dK, dV, dγ, dβ) of its chunks)."""
    within = within_chunks(Q, K, V, Bt, gam)  # the forward's elementwise terms again: kb, Bv, Bk, Q̃, K̃, λ
    kb, _, Bk, Qt, Kt, lam = within
    Kc = T @ Bk  # C4: (…, C, C) @ (…, C, dk)
    PtdO = P.swapaxes(-1, -2) @ dO  # ← S2: Pᵀ dO (…, C, C) @ (…, C, dv)
    QtdO = Qt.swapaxes(-1, -2) @ dO  # ← S2: Q̃ᵀ dO (…, dk, C) @ (…, C, dv) -> (…, dk, dv)
    dS_out = np.empty_like(states)  # the gradient of the state leaving each chunk
    dW = np.empty_like(W)
    for n in reversed(range(states.shape[2])):
        dS_out[:, :, n] = dS
        dW[:, :, n] = Kt[:, :, n] @ dS + PtdO[:, :, n]  # ← S3, S2: (B, H, C, dk) @ (B, H, dk, dv)
        dS = lam[:, :, n, :, None] * dS + QtdO[:, :, n] - Kc[:, :, n].swapaxes(-1, -2) @ dW[:, :, n]  # ← S3, S2, S1
    d_lam = np.sum(states * dS_out, axis=-1)  # ← S3: (B, H, n, dk), the rows of S
    d_lam = d_lam if lam.shape[-1] != 1 else np.sum(d_lam, axis=-1, keepdims=True)  # (B, H, n, 1 or dk)
    dKt = W @ dS_out.swapaxes(-1, -2)  # ← S3: (…, C, dv) @ (…, dv, dk) -> (…, C, dk)
    dQt = dO @ states.swapaxes(-1, -2)  # ← S2: (…, C, dv) @ (…, dv, dk)
    dP = dO @ W.swapaxes(-1, -2)  # ← S2: (…, C, dv) @ (…, dv, C)
    dKc = -(dW @ states.swapaxes(-1, -2))  # ← S1: (…, C, dv) @ (…, dv, dk); and dU = dW
    c_A, c_P = decayed_products_cache(kb, K, gam, strict=True), decayed_products_cache(Q, K, gam)  # C2 again
    return dS, within_chunks_backward(dQt, dKt, dP, d_lam, dW, dKc, K, V, Bt, gam, T, within, c_A, c_P)


def within_chunks_backward(dQt, dKt, dP, d_lam, dU, dKc, K, V, Bt, gam, T, within, c_A, c_P):
    """← C5…C2 for every chunk at once -> (dQ, dK, dV, dγ, dβ), each (B, H, N, C, ·)."""
    kb, Bv, Bk, Qt, Kt, lam = within

    def per_gate(x):  # a gate a head: the channels' sum, (…, C, 1)
        return x if gam.shape[-1] != 1 else np.sum(x, axis=-1, keepdims=True)

    eg = np.exp(gam)
    dQ = eg * dQt  # ← C5: Q̃ = e^γ ⊙ Q
    dK = np.exp(gam[..., -1:, :] - gam) * dKt  # ← C5: K̃ = e^(γ_C − γ) ⊙ K
    r = per_gate(dKt * Kt)  # ← C5: K̃'s exponent
    dgam = per_gate(dQt * Qt) - r  # ← C5
    dgam[..., -1, :] += np.sum(r, axis=-2) + lam * d_lam  # ← C5: γ_C in K̃ and in λ = e^(γ_C)
    dQ_P, dK_P, dgam_P = decayed_products_backward(dP, c_P)  # ← C5, C2: P
    Tt = T.swapaxes(-1, -2)
    dT = dU @ Bv.swapaxes(-1, -2) + dKc @ Bk.swapaxes(-1, -2)  # ← C4: (…, C, dv) @ (…, dv, C) + (…, C, dk) @ (…, dk, C)
    dBv, dBk = Tt @ dU, Tt @ dKc  # ← C4: (…, C, C) @ (…, C, ·)
    dA = np.tril(-(Tt @ dT @ Tt), -1)  # ← C4: d(M⁻¹) = −M⁻¹ dM M⁻¹, M = I + A; A's strictly lower entries only
    dkb, dK_A, dgam_A = decayed_products_backward(dA, c_A)  # ← C3, C2: A
    dkb += eg * dBk  # ← C4: Bk = e^γ ⊙ kb
    dgam += dgam_P + dgam_A + per_gate(dBk * Bk)  # ← C4
    dV = Bt[..., None] * dBv  # ← C4: Bv = β ⊙ V
    d_beta = np.sum(dBv * V, axis=-1) + np.sum(dkb * K, axis=-1)  # ← C4, C3: kb = β ⊙ K
    return dQ + dQ_P, dK + dK_P + dK_A + Bt[..., None] * dkb, dV, dgam, d_beta  # ← C3
