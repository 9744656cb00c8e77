"""Small helpers for the tests (not fixtures: plain functions, imported explicitly)."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy.gradcheck import check_function


def require_torch():
    """Import torch or skip the calling test with a clear reason (a failure under CI)."""
    return pytest.importorskip("torch", reason="torch is not installed: pip install -r requirements-dev.txt")


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if b.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


RTOL_TARGET = 1e-7  # the project's target for the max relative error of a float64 gradient


def grad_check(forward, backward, inputs, names, seed=0, allow_zero=True):
    """Random upstream gradient, analytic backward, central differences; every row <= RTOL_TARGET.

    ``allow_zero=False`` also fails a row whose true gradient is 0 (a check that could not fail there).
    """
    rng = np.random.default_rng(seed)
    out, cache = forward(**inputs)
    d_out = rng.standard_normal(out.shape)
    grads = backward(d_out, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    report = check_function(lambda **kw: forward(**kw)[0], dict(zip(names, grads)), inputs, d_out)
    assert report.passed, str(report)
    for row in report.rows:
        assert (allow_zero or not row.zero_gradient) and row.max_rel_err <= RTOL_TARGET, str(report)
    return report


def grad_check_self_attention(mha, x, mask=None):
    """``grad_check`` of a module's self-attention on x (B, L, E) under ``mask``: the input (its three paths summed)
    and every parameter, against a random upstream gradient."""

    def forward(query, **params):
        mha.params.update(params)
        return mha.forward(query, query, query, mask=mask)

    def backward(d_out, cache):
        grads = mha.backward(d_out, cache)
        return (grads["query"] + grads["key"] + grads["value"], *(grads[n] for n in mha.params))

    inputs = dict(query=x, **{n: p.copy() for n, p in mha.params.items()})
    return grad_check(forward, backward, inputs, ["query", *mha.params])


def cpu_ticks() -> dict[int, int]:
    """{thread id: user + system clock ticks} of every thread of this process (Linux /proc)."""
    import os  # noqa: PLC0415 - only the thread tests need it

    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that just ended
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def helper_share(n: int = 2000) -> float:
    """The share of an (n, n) @ (n, n) float64 product's CPU time spent in threads other than the caller's (BLAS's
    own workers). With BLAS on two threads each computes about half of the product (OpenBLAS cuts it in equal
    parts, so the share does not depend on how busy the machine is: a loaded machine slows both alike); on one
    thread it is 0. Per-thread CPU time sees what a thread count reported by threadpool_info() may not.
    First a pause: after a threaded product OpenBLAS's workers spin for about 0.1 s (OPENBLAS_THREAD_TIMEOUT)
    before they sleep, and that spinning would count as their share of the next product."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    a = np.random.default_rng(0).random((n, n))
    time.sleep(0.5)
    before = cpu_ticks()
    a @ a  # (n, n) @ (n, n) -> (n, n)
    after = cpu_ticks()
    spent = {t: after[t] - before.get(t, 0) for t in after}
    return 1.0 - spent.get(threading.get_native_id(), 0) / max(1, sum(spent.values()))


def alibi_by_hand(H, Lq, Lk):
    """ALiBi (H, Lq, Lk) from the paper: slopes 2^(-8 (h + 1) / H), -m_h |i + (Lk - Lq) - j| (queries last)."""
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    i, j = np.arange(Lq)[:, None] + (Lk - Lq), np.arange(Lk)[None, :]
    return -slopes[:, None, None] * np.abs(i - j)


def rel_bias_by_hand(table, Lq, Lk):
    """T5-style (H, Lq, Lk): table[h, clip(j - i, -R, R) + R]."""
    R = (table.shape[1] - 1) // 2
    rows = [[[table[h, min(max(j - i, -R), R) + R] for j in range(Lk)] for i in range(Lq)] for h in range(len(table))]
    return np.array(rows)


# The gap between a saturated row's top score and its others, (float32, float64): "one-hot" leaves the other weights
# exactly 0 (e^-1e4 underflows); "tiny weights" leaves them below half an ulp of 1, so the top weight rounds to 1
# (the regime of torch's OpInfo samples for SDPA); "near-saturated" above it: P_ij* = 1 - δ with ulp ≪ δ ≪ 1.
SATURATION_GAP = {"one-hot": (1e4, 1e4), "tiny weights": (20.0, 40.0), "near-saturated": (10.0, 30.0)}
SATURATION_MASKS = ("none", "causal", "padding, a blocked row", "additive")


def saturated_case(rows: str, mask_kind: str, dtype, seed: int = 0):
    """One head (B = H = 1), Lq = 7, Lk = 9, with rows that put (almost) all their weight on one key.

    k_j = [e_j, noise], so query i's score for key j is q_i[j] plus a little: queries 1, 2, 4, 5 have the gap
    ``SATURATION_GAP[rows]`` at keys 3, 0, 3, 8 (two of them share their top key), queries 0, 3, 6 are ordinary.
    mask_kind: one of ``SATURATION_MASKS``; a mask may block a row's top key, which makes it ordinary.
    -> q, k, v, d_context (1, 1, L, ·) in ``dtype``, mask (bool (Lq, Lk), float in ``dtype``, or None).
    """
    from mha_numpy import masks  # noqa: PLC0415 - as in conftest: helpers stay importable before the package

    rng = np.random.default_rng(seed)
    Lq, Lk = 7, 9
    k = np.concatenate([np.eye(Lk), 0.3 * rng.standard_normal((Lk, 2))], axis=1)  # (Lk, Lk + 2)
    q = np.concatenate([rng.standard_normal((Lq, Lk)), 0.5 * rng.standard_normal((Lq, 2))], axis=1)  # (Lq, Lk + 2)
    q[[1, 2, 4, 5], :Lk] = 0.0
    q[[1, 2, 4, 5], [3, 0, 3, 8]] = SATURATION_GAP[rows][int(np.dtype(dtype) == np.float64)]
    v, d_context = rng.standard_normal((Lk, 3)), rng.standard_normal((Lq, 3))
    padding = np.ones((Lq, Lk), bool)
    padding[:, 7:] = False  # the last two keys are padding (query 5's top key among them)
    padding[4] = False  # query 4 sees nothing
    mask = {
        "none": None,
        "causal": masks.causal_mask(Lq, Lk, diagonal=Lk - Lq),  # bottom-right: query i sees keys 0 ... i + 2
        "padding, a blocked row": padding,
        "additive": rng.normal(0, 2, (Lq, Lk)).astype(dtype),
    }[mask_kind]
    return (*(a.astype(dtype)[None, None] for a in (q, k, v, d_context)), mask)


def error_against_exact(grads, exact) -> float:
    """max |grad - exact| over the gradients, divided by the largest |exact| of them all: a gradient that is 0 in
    theory is judged against the largest one, not against its own rounding noise."""
    scale = max(float(np.abs(e).max()) for e in exact)
    return max(float(np.abs(np.asarray(g, np.float64) - e).max()) for g, e in zip(grads, exact)) / scale


def directional_errors(mha, x, call: dict, rng) -> dict[str, float]:
    """Relative error of <grad, u> against the central difference of <d_out, output> along a random u, per input
    and parameter (float64, eps 1e-6). A gradient that is zero in theory (the key bias's: softmax ignores a constant
    added to a row) is judged against the largest directional derivative instead of its own rounding noise.
    Self-attention on x (B, L, E), the call's keyword arguments ``call`` (mask, training, dropout_mask)."""
    out, cache = mha.forward(x, x, x, **call)
    d_out = rng.standard_normal(out.shape)
    grads = mha.backward(d_out, cache)
    grads = {"x": grads["query"] + grads["key"] + grads["value"], **{n: grads[n] for n in mha.params}}
    derivatives = {}
    for name, g in grads.items():
        u = rng.standard_normal(g.shape)
        target = x if name == "x" else mha.params[name]
        values = []
        for sign in (1, -1):
            original = target.copy()
            target += sign * 1e-6 * u
            xx = target if name == "x" else x
            values.append(float(np.sum(d_out * mha.forward(xx, xx, xx, **call)[0])))
            target[...] = original
        derivatives[name] = (values[0] - values[1]) / 2e-6, float(np.sum(g * u))  # numeric, analytic
    floor = 1e-3 * max(abs(a) for _, a in derivatives.values())  # below it, an error is judged against the largest
    return {name: abs(n - a) / max(abs(n), abs(a), floor) for name, (n, a) in derivatives.items()}


def check_recompute_and_decoding(default, lean, x, rng):
    """Under a causal mask, ``lean`` (the same module with recompute=True) gives ``default``'s output to 1e-13 and
    its gradients to 1e-13 of the largest (a random upstream gradient), and decoding x (B, L, E) token by token
    through a KV cache gives the full causal forward to 1e-12."""
    from mha_numpy import KVCache, masks

    L = x.shape[1]
    mask = masks.causal_mask(L)
    out, cache = default.forward(x, x, x, mask=mask)
    out_r, cache_r = lean.forward(x, x, x, mask=mask)
    d_out = rng.standard_normal(out.shape)
    grads, grads_r = default.backward(d_out, cache), lean.backward(d_out, cache_r)
    largest = max(np.abs(g).max() for g in grads.values())
    assert np.abs(out_r - out).max() <= 1e-13 * np.abs(out).max()
    assert all(np.abs(grads[n] - grads_r[n]).max() <= 1e-13 * largest for n in grads)
    kv = KVCache()
    steps = [default.forward(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], kv_cache=kv)[0] for t in range(L)]
    assert np.abs(np.concatenate(steps, axis=1) - out).max() <= 1e-12 * np.abs(out).max()
