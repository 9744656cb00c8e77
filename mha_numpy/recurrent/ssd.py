"""Mamba-2's SSD (state-space duality): the selective scan as a recurrence, as chunks, and as one (L, L) matrix.

Per head h, with a_t = A_h · dt_t ≤ 0 the log decay of token t (A_h ≤ 0, dt_t ≥ 0):

    S_t = e^{a_t} S_{t−1} + dt_t B_t x_tᵀ,    y_t = S_tᵀ C_t + D_h x_t        S (N, P): the state, S₀ given or 0

a decayed linear attention (``linear``, ``gated_delta``) without the delta correction: q = C, k = B, v = dt · x, the
log decay g = a. Unrolled, with γ_i = Σ_{t ≤ i} a_t (``segment_sum``: γ_i − γ_j = Σ_{j < t ≤ i} a_t),

    y = M x + e^{γ} ⊙ (C S₀),   M_ij = C_i·B_j e^{γ_i − γ_j} dt_j  (j ≤ i),  M_ii += D_h,  0 above the diagonal

the SSM as attention (``ssd_matrix_forward``): the masked matrix C Bᵀ ⊙ exp(segment_sum(a)) with each column
scaled by dt_j. The chunked scan (transformers' ``mamba2_chunk_scan``) is that matrix within chunks of c tokens
and the recurrence across them:

    C1  γ = cumsum(a) within each chunk
    C2  M = (C Bᵀ ⊙ Γ) · dt_j + D I         Γ_ij = e^{γ_i − γ_j}, j ≤ i: ``decayed.decayed_products`` (its C3, C5)
    C3  y = M x                             the diagonal blocks (Y_diag)
    C4  T = (B ⊙ e^{γ_c − γ} dt)ᵀ x          what a chunk writes into the state leaving it (c its last token)
    C5  S_{n+1} = e^{γ_c} S_n + T_n          the states entering each chunk, one chunk at a time
    C6  y += e^{γ} ⊙ (C S_n)                 the off-diagonal blocks (Y_off): the state entering the chunk read

The quadratic form (impl="quadratic") is the same code with one chunk of L tokens: M is then the (L, L) matrix
above, C4–C5 give the final state. transformers forms C5 as a matrix too (exp(segment_sum) over the chunks' total
decays, an (n+1, n+1) einsum); we run it as the recurrence it is, equal in exact arithmetic.

Layout: the family's (B, H, L, d) with the Mamba names (transformers: (B, L, H, d), its state (B, H, P, N), ours
(B, H, N, P) = (dk, dv) as the delta rule's; ``interop.mamba2`` converts).

============  ================  =========================================================================
argument      shape             meaning
============  ================  =========================================================================
x             (B, H, L, P)      the input of each head (the values)
dt            (B, H, L)         the time step of each token, ≥ 0 (softplus(dt + dt_bias), clamped, in the layer)
A             (H,)              the decay rate of each head, ≤ 0 (−exp(A_log) in the layer)
B, C          (B, G, L, N)      the input and output projections of the state (the keys and the queries), one a
                                group; head h reads group h // (H / G) (transformers' repeat_interleave)
D             (H,) or None      the skip: y += D_h x
initial_state (B, H, N, P)      S₀ (zeros when None)
============  ================  =========================================================================

float64 by default, float32 stays float32 (every input in x's dtype). Derivation: docs/derivation.md, "SSD".
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .._checks import as_float_array, check_like
from .checks import check_chunk_size
from .decayed import decayed_products_backward, decayed_products_forward
from .delta_chunked import to_chunks

IMPLS = ("chunked", "quadratic")


def check_ssd_inputs(x, dt, A, B, C, D, initial_state):
    """Shapes as the module docstring's table, one dtype, finite, dt ≥ 0, A ≤ 0; ValueError naming the argument."""
    x = as_float_array(x, "x", ndim=4)
    b, H, L, P = x.shape
    dt = as_float_array(dt, "dt", ndim=3)
    if dt.shape != (b, H, L):
        raise ValueError(f"dt with shape {dt.shape} must be (B, H, L) = {(b, H, L)} for x with shape {x.shape}")
    A = as_float_array(A, "A", ndim=1)
    if A.shape != (H,):
        raise ValueError(f"A with shape {A.shape} must be (H,) = ({H},), one rate a head")
    B = as_float_array(B, "B", ndim=4)
    if B.shape[0] != b or B.shape[2] != L or B.shape[1] == 0 or H % B.shape[1]:
        raise ValueError(f"B with shape {B.shape} must be (B, G, L, N) = ({b}, G, {L}, N) with H = {H} a multiple "
                         f"of G")  # fmt: skip
    C = as_float_array(C, "C", ndim=4)
    if C.shape != B.shape:
        raise ValueError(f"C with shape {C.shape} must have B's shape {B.shape} (B, G, L, N)")
    named = {"dt": dt, "A": A, "B": B, "C": C}
    if D is not None:
        D = named["D"] = as_float_array(D, "D", ndim=1)
        if D.shape != (H,):
            raise ValueError(f"D with shape {D.shape} must be (H,) = ({H},), one skip a head")
    if initial_state is not None:
        initial_state = named["initial_state"] = as_float_array(initial_state, "initial_state", ndim=4)
        if initial_state.shape != (b, H, B.shape[3], P):
            raise ValueError(f"initial_state with shape {initial_state.shape} must be (B, H, N, P) = "
                             f"{(b, H, B.shape[3], P)}")  # fmt: skip
    for name, a in named.items():
        if a.dtype != x.dtype:
            raise ValueError(f"{name} has dtype {a.dtype}, x has {x.dtype}: one dtype for the call")
    for name, a in {"x": x, **named}.items():
        if not np.isfinite(a).all():
            raise ValueError(f"{name} with shape {a.shape} must be finite")
    if not (dt >= 0).all():
        raise ValueError(f"dt must be >= 0 (a time step), got min {np.min(dt)!r}")
    if not (A <= 0).all():
        raise ValueError(f"A must be <= 0 (the state is multiplied by exp(A·dt)), got max {np.max(A)!r}")
    return x, dt, A, B, C, D, initial_state


# --------------------------------------------------------------------------- the matrix of one chunk (C1's γ given)


def matrix_forward(gam, dt, Bh, Ch, D):
    """C2: M (…, c, c) = (C Bᵀ ⊙ e^{γ_i − γ_j}) · dt_j for j ≤ i, + D on the diagonal.

    gam, dt: (B, H, n, c)   Bh, Ch: (B, H, n, c, N)   D: (H,) or None   ->   (M (B, H, n, c, c), cache)
    """
    W, c_W = decayed_products_forward(Ch, Bh, gam[..., None])  # M1: (…, c, N) (…, c, N) -> (…, c, c), 0 above
    M = W * dt[..., None, :]  # M2: (…, c, c) * (…, 1, c): column j times dt_j
    if D is not None:
        M = M + D[:, None, None, None] * np.eye(M.shape[-1], dtype=M.dtype)  # M3: (H, 1, 1, 1) * (c, c)
    return M, (W, c_W, dt, D is not None)


def matrix_backward(dM, cache):
    """dM (B, H, n, c, c) -> (dgam, ddt (B, H, n, c), dBh, dCh (B, H, n, c, N), dD (H,) or None)."""
    W, c_W, dt, has_D = cache
    dD = np.trace(dM, axis1=-2, axis2=-1).sum(axis=(0, 2)) if has_D else None  # ← M3: (H,)
    ddt = np.sum(dM * W, axis=-2)  # ← M2: (…, c), Σ over the rows i
    dCh, dBh, dgam = decayed_products_backward(dM * dt[..., None, :], c_W)  # ← M2, M1
    return dgam[..., 0], ddt, dBh, dCh, dD


# --------------------------------------------------------------------------- the chunked scan (C1–C6)


def chunks_forward(xc, dtc, ac, Bc, Cc, D, S0):
    """C1–C6 on chunked arrays: xc (B, H, n, c, P), dtc, ac (B, H, n, c), Bc, Cc (B, H, n, c, N), S0 (B, H, N, P)
    -> ((y (B, H, n, c, P), the final state (B, H, N, P)), cache)."""
    gam = np.cumsum(ac, axis=-1)  # C1: (B, H, n, c) γ within each chunk, ≤ 0
    M, c_M = matrix_forward(gam, dtc, Bc, Cc, D)  # C2: (B, H, n, c, c)
    y = M @ xc  # C3: (…, c, c) @ (…, c, P) -> (…, c, P)
    e_end = np.exp(gam[..., -1:] - gam)  # C4: (…, c) e^{γ_c − γ_l} ≤ 1, the decay from token l to the chunk's end
    w = e_end * dtc  # C4: (…, c)
    Bw = Bc * w[..., None]  # C4: (…, c, N)
    T = Bw.swapaxes(-1, -2) @ xc  # C4: (…, N, c) @ (…, c, P) -> (…, N, P)
    lam = np.exp(gam[..., -1])  # C5: (B, H, n) a chunk's total decay
    states = np.empty(T.shape, dtype=T.dtype)  # (B, H, n, N, P) the state entering each chunk
    S = S0
    for j in range(T.shape[2]):
        states[:, :, j] = S
        S = lam[:, :, j, None, None] * S + T[:, :, j]  # C5: (B, H, N, P)
    eg = np.exp(gam)  # C6: (…, c) e^{γ_l}, the decay from the chunk's start to token l
    CS = Cc @ states  # C6: (…, c, N) @ (…, N, P) -> (…, c, P)
    y = y + eg[..., None] * CS  # C6
    return (y, S), (xc, dtc, Bc, Cc, M, c_M, gam, e_end, w, Bw, lam, states, eg, CS)


def chunks_backward(dy, dS, cache):
    """dy (B, H, n, c, P), dS (B, H, N, P) -> (dx, ddt, da (B, H, n, c), dB, dC (…, c, N), dD, dS0)."""
    xc, dtc, Bc, Cc, M, c_M, gam, e_end, w, Bw, lam, states, eg, CS = cache
    dE = eg[..., None] * dy  # ← C6: (…, c, P)
    dCc = dE @ states.swapaxes(-1, -2)  # ← C6: (…, c, P) @ (…, P, N) -> (…, c, N)
    d_states = Cc.swapaxes(-1, -2) @ dE  # ← C6: (…, N, c) @ (…, c, P) -> (…, N, P)
    dgam = eg * np.sum(dy * CS, axis=-1)  # ← C6: (…, c), d e^γ = e^γ dγ
    dT = np.empty_like(states)  # the gradient of each chunk's write T_n (that of the state leaving it)
    dlam = np.empty_like(lam)
    for j in reversed(range(states.shape[2])):
        dT[:, :, j] = dS
        dlam[:, :, j] = np.sum(dS * states[:, :, j], axis=(-2, -1))  # ← C5
        dS = lam[:, :, j, None, None] * dS + d_states[:, :, j]  # ← C5: (B, H, N, P)
    dgam[..., -1] += dlam * lam  # ← C5: d e^{γ_c}
    dx = Bw @ dT  # ← C4: (…, c, N) @ (…, N, P) -> (…, c, P)
    dBw = xc @ dT.swapaxes(-1, -2)  # ← C4: (…, c, P) @ (…, P, N) -> (…, c, N)
    dBc = dBw * w[..., None]  # ← C4
    dw = np.sum(dBw * Bc, axis=-1)  # ← C4: (…, c)
    ddt = dw * e_end  # ← C4
    dexp = dw * w  # ← C4: the gradient of the exponent γ_c − γ_l
    dgam[..., -1] += dexp.sum(axis=-1)  # ← C4
    dgam -= dexp  # ← C4
    dM = dy @ xc.swapaxes(-1, -2)  # ← C3: (…, c, P) @ (…, P, c) -> (…, c, c)
    dx += M.swapaxes(-1, -2) @ dy  # ← C3: (…, c, c) @ (…, c, P)
    dgam2, ddt2, dB2, dC2, dD = matrix_backward(dM, c_M)  # ← C2
    dgam += dgam2
    da = np.flip(np.cumsum(np.flip(dgam, -1), axis=-1), -1)  # ← C1: ā_t = Σ_{i ≥ t} γ̄_i within the chunk
    return dx, ddt + ddt2, da, dBc + dB2, dCc + dC2, dD, dS


# --------------------------------------------------------------------------- the public pairs


def ssd_forward(x, dt, A, B, C, D=None, initial_state=None, chunk_size=64, impl="chunked"):
    """Mamba-2's SSD, chunked (transformers' ``mamba2_chunk_scan``) or quadratic (one chunk: the (L, L) matrix).

    Shapes: the module docstring's table. Returns ((y (B, H, L, P), final_state (B, H, N, P)), cache). Inputs are
    not modified.

        F1  a = A · dt                  (B, H, L) the log decay of each token
        F2  B, C repeated to the H heads (head h reads group h // (H / G))
        F3  x, dt, a, B, C cut into chunks of c tokens (c = L for the quadratic form), zero-padded: a padded token
            writes nothing (dt = 0) and decays nothing (a = 0)
        F4  C1–C6 (module docstring)
        F5  y back to (B, H, L, P)
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    chunk_size = check_chunk_size(chunk_size)
    x, dt, A, B, C, D, initial_state = check_ssd_inputs(x, dt, A, B, C, D, initial_state)
    b, H, L, P = x.shape
    G, N = B.shape[1], B.shape[3]
    a = dt * A[:, None]  # F1: (B, H, L) * (H, 1)
    Bh, c_rb = F.repeat_kv_forward(B, H // G, check=False)  # F2: (B, G, L, N) -> (B, H, L, N)
    Ch, c_rc = F.repeat_kv_forward(C, H // G, check=False)  # F2
    c = max(L, 1) if impl == "quadratic" else min(chunk_size, max(L, 1))
    xc, dtc, ac, Bc, Cc = (to_chunks(t, c) for t in (x, dt, a, Bh, Ch))  # F3: (B, H, n, c, ·)
    S0 = np.zeros((b, H, N, P), dtype=x.dtype) if initial_state is None else initial_state.copy()  # L = 0 returns it
    (yc, S), c_core = chunks_forward(xc, dtc, ac, Bc, Cc, D, S0)  # F4
    y = yc.reshape(b, H, -1, P)[:, :, :L]  # F5: (B, H, n·c, P) -> (B, H, L, P)
    return (y, S), (c_core, c_rb, c_rc, A, dt, initial_state is not None, y.shape, S.shape, x.dtype)


def ssd_backward(d_y, cache, d_final_state=None) -> dict:
    """d_y (B, H, L, P), d_final_state (B, H, N, P) or None -> {"x", "dt", "A", "B", "C", "D", "initial_state"},
    each in its input's shape (D and initial_state None when the forward had none)."""
    c_core, c_rb, c_rc, A, dt, has_state, y_shape, S_shape, dtype = cache
    d_y = check_like(d_y, "d_y", y_shape, dtype, "y")
    if d_final_state is None:
        d_final_state = np.zeros(S_shape, dtype=dtype)
    d_final_state = check_like(d_final_state, "d_final_state", S_shape, dtype, "final_state").copy()  # as S0
    b, H, L, P = y_shape
    c = c_core[0].shape[3]
    dx, ddt, da, dBh, dCh, dD, dS0 = chunks_backward(to_chunks(d_y, c), d_final_state, c_core)  # ← F5, F4

    def unchunk(t):  # ← F3: (B, H, n, c, ·) -> (B, H, L, ·)
        return t.reshape(b, H, -1, *t.shape[4:])[:, :, :L]

    dx, ddt, da, dBh, dCh = (unchunk(t) for t in (dx, ddt, da, dBh, dCh))
    dB = F.repeat_kv_backward(dBh, c_rb)  # ← F2: each group's heads summed
    dC = F.repeat_kv_backward(dCh, c_rc)  # ← F2
    ddt = ddt + da * A[:, None]  # ← F1
    dA = np.sum(da * dt, axis=(0, 2))  # ← F1: (H,)
    return {"x": dx, "dt": ddt, "A": dA, "B": dB, "C": dC, "D": dD, "initial_state": dS0 if has_state else None}


def ssd_matrix_forward(dt, A, B, C, D=None):
    """The SSM as attention: M (B, H, L, L) with y = M x + e^{γ} ⊙ (C S₀) the scan's output (module docstring).

    dt (B, H, L), A (H,), B, C (B, G, L, N), D (H,) or None -> (M, cache): C Bᵀ masked by the decay matrix
    exp(segment_sum(A·dt)), column j scaled by dt_j, D on the diagonal; 0 above the diagonal.
    """
    dt = as_float_array(dt, "dt", ndim=3)
    P = 1  # the matrix does not see x: a placeholder head size for the shared checks
    x = np.zeros((*dt.shape, P), dtype=dt.dtype)
    _, dt, A, B, C, D, _ = check_ssd_inputs(x, dt, A, B, C, D, None)
    H = dt.shape[1]
    a = dt * A[:, None]  # F1: (B, H, L)
    Bh, c_rb = F.repeat_kv_forward(B, H // B.shape[1], check=False)  # F2: (B, H, L, N)
    Ch, c_rc = F.repeat_kv_forward(C, H // B.shape[1], check=False)  # F2
    gam = np.cumsum(a, axis=-1)  # C1: (B, H, L) γ over the whole sequence
    M, c_M = matrix_forward(gam[:, :, None], dt[:, :, None], Bh[:, :, None], Ch[:, :, None], D)  # C2: one chunk
    return M[:, :, 0], (c_M, c_rb, c_rc, A, dt, M.shape[:2] + M.shape[3:])


def ssd_matrix_backward(dM, cache) -> dict:
    """dM (B, H, L, L) -> {"dt", "A", "B", "C", "D"} (D None when the forward had none)."""
    c_M, c_rb, c_rc, A, dt, M_shape = cache
    dM = check_like(dM, "dM", M_shape, dt.dtype, "M")
    dgam, ddt, dBh, dCh, dD = matrix_backward(dM[:, :, None], c_M)  # ← C2
    da = np.flip(np.cumsum(np.flip(dgam[:, :, 0], -1), axis=-1), -1)  # ← C1: a reversed cumulative sum
    return {
        "dt": ddt[:, :, 0] + da * A[:, None],  # ← F1
        "A": np.sum(da * dt, axis=(0, 2)),  # ← F1
        "B": F.repeat_kv_backward(dBh[:, :, 0], c_rb),  # ← F2
        "C": F.repeat_kv_backward(dCh[:, :, 0], c_rc),  # ← F2
        "D": dD,
    }


def ssd_step(x_t, dt_t, A, B_t, C_t, D=None, state=None):
    """One token of decoding with the state: S ← e^{A·dt} S + dt B xᵀ, y = Sᵀ C + D x (transformers'
    ``mamba2_selective_state_update``).

    x_t (B, H, P), dt_t (B, H), A (H,), B_t, C_t (B, G, N), D (H,) or None, state (B, H, N, P) or None (zeros)
    -> (y_t (B, H, P), new_state (B, H, N, P)). The inputs, ``state`` included, are not modified.
    """
    arrays = {"x_t": (x_t, 3), "dt_t": (dt_t, 2), "B_t": (B_t, 3), "C_t": (C_t, 3)}
    for name, (a, ndim) in arrays.items():
        if np.ndim(a) != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions, got shape {np.shape(a)}")
    try:  # the sequence's checks with L = 1
        x, dt, A, B, C, D, S = check_ssd_inputs(
            np.asarray(x_t)[:, :, None], np.asarray(dt_t)[:, :, None], A, np.asarray(B_t)[:, :, None],
            np.asarray(C_t)[:, :, None], D, state,
        )  # fmt: skip
    except ValueError as e:  # named as the caller knows them: x -> x_t, initial_state -> state
        name, _, rest = str(e).partition(" ")
        name = {"initial_state": "state", "A": "A", "D": "D"}.get(name, f"{name}_t")
        raise ValueError(f"{name} {rest}") from None
    H = x.shape[1]
    if S is None:
        S = np.zeros((x.shape[0], H, B.shape[3], x.shape[3]), dtype=x.dtype)
    Bh = np.repeat(B[:, :, 0], H // B.shape[1], axis=1)  # (B, G, N) -> (B, H, N), head h <- group h // (H / G)
    Ch = np.repeat(C[:, :, 0], H // B.shape[1], axis=1)  # (B, H, N)
    x, dt = x[:, :, 0], dt[:, :, 0]  # (B, H, P), (B, H)
    S = np.exp(A * dt)[..., None, None] * S + (dt[..., None] * Bh)[..., None] * x[:, :, None, :]  # (B, H, N, P)
    y = (Ch[:, :, None, :] @ S)[:, :, 0]  # (B, H, 1, N) @ (B, H, N, P) -> (B, H, P)
    if D is not None:
        y = y + D[:, None] * x  # (H, 1) * (B, H, P)
    return y, S
