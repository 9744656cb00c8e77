"""The derivative of a FlexAttention ``score_mod`` when the user gives none (``mha_numpy.flex``): complex steps, and
the probe that decides whether to trust them.

For an analytic f, f(s + iε) = f(s) + iε f'(s) + O(ε²), with no subtraction: f'(s) = Im f(s + iε) / ε is exact to
rounding at ε = ``STEP`` = 1e-20. A parameter's derivative takes one complex step per element. The complex step
cannot see through np.abs, ``.real`` or a rounding (their complex extension is not the derivative of the real
function), so ``probe`` compares it with central differences at a few random entries of the call's own scores first,
and refuses the mod where they disagree.
"""

from __future__ import annotations

import numpy as np

STEP = 1e-20  # the complex step ε
PROBE_ENTRIES = 16  # random entries of the scores at which a derived derivative is checked


def complex_step_vjp(mod):
    """The VJP of ``mod`` (a checked mod) by complex steps: the score's at once, a parameter's element by element."""

    def vjp(score, b, h, q_idx, kv_idx, d_out, **params):
        z = score.astype(np.complex128) + 1j * STEP  # s + iε at every entry: each entry reads only its own score
        d_score = d_out * (mod(z, b, h, q_idx, kv_idx, **params).imag / STEP)  # ← f'(s) d_out
        grads = {}
        for name, p in params.items():
            pz = p.astype(np.complex128)  # a complex copy, one element stepped at a time
            g = np.zeros(p.size)
            for e in range(p.size):
                pz.flat[e] += 1j * STEP
                g[e] = np.sum(d_out * mod(score, b, h, q_idx, kv_idx, **{**params, name: pz}).imag) / STEP
                pz.flat[e] = p.flat[e]
            grads[name] = g.reshape(p.shape).astype(p.dtype)  # Σ over the block's entries of d_out ∂f/∂θ_e
        return d_score.astype(score.dtype), grads

    return vjp


def probe(mod, query, key, scale, group, params, derive: bool):
    """Call ``mod`` on PROBE_ENTRIES random entries of this call's scores (flat (n,) blocks, as the chunked kernel's
    pivot entries are), checking its result, and, when ``derive``, its complex-step derivatives against central
    differences there: in the score, and in each parameter along a random direction. ValueError where they
    disagree. Costs O(n · d), before any attention arithmetic."""
    B, H, Lq, _ = query.shape
    Lk = key.shape[2]
    if B * H * Lq * Lk == 0:
        return
    rng = np.random.default_rng(0)
    b, h, i, j = (rng.integers(0, n, PROBE_ENTRIES) for n in (B, H, Lq, Lk))  # (n,) each
    kb = b if key.shape[0] > 1 else np.zeros_like(b)
    s = np.einsum("nd,nd->n", query[b, h, i].astype(np.float64), key[kb, h // group, j]) * scale  # (n,) scores
    params64 = {n: p.astype(np.float64) for n, p in params.items()}
    f = mod(s, b, h, i, j, **params64)  # the result's checks, on entries of this call
    if not derive:
        return
    ok = np.isfinite(f)

    def compare(exact, plus, minus, eps, what):
        with np.errstate(invalid="ignore"):  # -inf - -inf where the mod blocks an entry (not compared)
            fd = (plus - minus) / (2 * eps)  # central differences, O(eps²) + rounding O(ulp(f) / eps)
        noise = 1e3 * np.finfo(np.float64).eps * (np.abs(plus) + np.abs(minus)) / eps
        tol = 1e-6 * (1.0 + np.abs(exact) + np.abs(fd)) + noise
        bad = ok & np.isfinite(plus) & np.isfinite(minus) & ~(np.abs(exact - fd) <= tol)
        if np.any(bad):
            n = np.flatnonzero(bad)[0]
            raise ValueError(f"score_mod's derivative in {what} cannot be derived by complex steps (at score "
                             f"{s[n]:.4g}: complex step {exact[n]:.6g}, central differences {fd[n]:.6g}; np.abs, "
                             f".real or a rounding?): give score_mod_vjp")  # fmt: skip

    eps = 1e-6 * np.maximum(1.0, np.abs(s))
    try:
        exact = mod(s.astype(np.complex128) + 1j * STEP, b, h, i, j, **params64).imag / STEP
    except ValueError as e:
        raise ValueError(f"score_mod does not run on complex scores, so its derivative cannot be derived ({e}): "
                         "give score_mod_vjp") from e  # fmt: skip
    compare(exact, mod(s + eps, b, h, i, j, **params64), mod(s - eps, b, h, i, j, **params64), eps, "the score")
    for name, p in params64.items():
        u = rng.standard_normal(p.shape)  # a random direction in the parameter
        eps_p = 1e-6 * max(1.0, float(np.max(np.abs(p), initial=0.0)))

        def at(x, name=name):
            return mod(s, b, h, i, j, **{**params64, name: x})

        try:
            exact = at(p + 1j * STEP * u).imag / STEP
        except ValueError as e:
            raise ValueError(f"score_mod does not run on complex params[{name!r}] ({e}): give score_mod_vjp") from e
        compare(exact, at(p + eps_p * u), at(p - eps_p * u), eps_p, f"params[{name!r}]")
