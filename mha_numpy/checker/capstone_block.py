"""The second capstone (exercise 10): the whole backward of one pre-norm Transformer block, one intermediate at a time.

GPT-2's block (``models.block.Block`` with norm_position="pre", norm="layer_norm", ffn="gelu", approximate="tanh"),
cut into the steps of ``BLOCK_STEPS``: LayerNorm, the self-attention of exercise 9, the residual, LayerNorm, the
feed-forward with GELU, the residual. The loss is ``sum(y * d_y)`` for a random ``d_y`` (the checker's random
upstream gradient), so ``d loss / d y = d_y``. The student writes ``capstone_block_backward(cache)`` in plain NumPy;
the table, the first wrong gradient and the diagnosis work as in ``checker.capstone``. LayerNorm is two steps, the
normalisation (x̂) and the affine map (γ x̂ + β), so that a wrong mean term shows at the normalisation's input.
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ..models import layers as LY
from . import capstone as C
from .capstone import Capstone, CapstoneBug

BLOCK_BACKWARD = "capstone_block_backward"
EPS = 1e-5
PARAMS = ("gamma1", "beta1", "W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o", "gamma2", "beta2",
          "W_1", "b_1", "W_2", "b_2")  # fmt: skip
# the Block's roles -> the capstone's names (models.block reads its parameters through such a table)
BLOCK_NAMES = {"norm1.weight": "gamma1", "norm1.bias": "beta1", "norm2.weight": "gamma2", "norm2.bias": "beta2",
               **{n: n for n in PARAMS if not n.startswith(("gamma", "beta"))}}  # fmt: skip

# (label, the forward line, the names whose gradients this line's backward yields), in the forward's order
BLOCK_STEPS = (
    ("F1", "xhat1 = (x - mean(x)) / sqrt(var(x) + eps)    (B, L, E)  over the last axis, eps = 1e-5", ("x",)),
    ("F2", "n1 = xhat1 * gamma1 + beta1                    (B, L, E)", ("xhat1", "gamma1", "beta1")),
    ("F3", "q = n1 @ W_q.T + b_q                           (B, L, E)", ("W_q", "b_q", "n1")),
    ("F4", "k = n1 @ W_k.T + b_k                           (B, L, E)", ("W_k", "b_k")),
    ("F5", "v = n1 @ W_v.T + b_v                           (B, L, E)", ("W_v", "b_v")),
    ("F6", "qh = q.reshape(B, L, H, D).transpose(0, 2, 1, 3)   (B, H, L, D)", ("q",)),
    ("F7", "kh = k.reshape(B, L, H, D).transpose(0, 2, 1, 3)   (B, H, L, D)", ("k",)),
    ("F8", "vh = v.reshape(B, L, H, D).transpose(0, 2, 1, 3)   (B, H, L, D)", ("v",)),
    ("F9", "scores = qh @ kh.swapaxes(-1, -2) * scale      (B, H, L, L)  scale = 1/sqrt(D)", ("qh", "kh")),
    ("F10", "weights = softmax(scores, axis=-1)            (B, H, L, L)", ("scores",)),
    ("F11", "ctx = weights @ vh                            (B, H, L, D)", ("weights", "vh")),
    ("F12", "merged = ctx.transpose(0, 2, 1, 3).reshape(B, L, E)", ("ctx",)),
    ("F13", "a = merged @ W_o.T + b_o                      (B, L, E)", ("merged", "W_o", "b_o")),
    ("F14", "h = x + a                                     (B, L, E)  the first residual", ("a",)),
    ("F15", "xhat2 = (h - mean(h)) / sqrt(var(h) + eps)    (B, L, E)", ("h",)),
    ("F16", "n2 = xhat2 * gamma2 + beta2                   (B, L, E)", ("xhat2", "gamma2", "beta2")),
    ("F17", "u = n2 @ W_1.T + b_1                          (B, L, I)  I = 2E here", ("W_1", "b_1", "n2")),
    ("F18", "gl = 0.5 * u * (1 + tanh(sqrt(2/pi) * (u + 0.044715 * u**3)))   (B, L, I)  GELU, tanh form", ("u",)),
    ("F19", "f = gl @ W_2.T + b_2                          (B, L, E)", ("gl", "W_2", "b_2")),
    ("F20", "y = h + f                                     (B, L, E)  the second residual", ("f",)),
    ("F21", "loss = sum(y * d_y)                           ()  d_y: a random upstream gradient", ("y",)),
)
# x and h each feed a residual's skip and a LayerNorm: their gradients are complete at the norm's line (F1, F15)
BLOCK_ORDER = C.backward_order(BLOCK_STEPS)
BLOCK_GRADS = tuple(name for _, name in BLOCK_ORDER)


def forward_listing() -> str:
    """The block capstone's forward (exercise 10)."""
    return C.listing(BLOCK_STEPS)


def block_params(E: int, H: int, inner: int, rng: np.random.Generator) -> dict:
    """Random parameters of the block: weights N(0, 0.5²), biases N(0, 0.1²), gammas 1 + N(0, 0.1²)."""
    P = {}
    for name, shape in (("W_q", (E, E)), ("W_k", (E, E)), ("W_v", (E, E)), ("W_o", (E, E)), ("W_1", (inner, E)),
                        ("W_2", (E, inner))):  # fmt: skip
        P[name] = rng.standard_normal(shape) * 0.5
    for name, n in (("b_q", E), ("b_k", E), ("b_v", E), ("b_o", E), ("b_1", inner), ("b_2", E), ("beta1", E),
                    ("beta2", E)):  # fmt: skip
        P[name] = rng.standard_normal(n) * 0.1
    P["gamma1"], P["gamma2"] = 1 + 0.1 * rng.standard_normal(E), 1 + 0.1 * rng.standard_normal(E)
    return {name: P[name] for name in PARAMS}


def block_forward(
    params: dict, x: np.ndarray, d_y: np.ndarray, num_heads: int, causal: bool = False
) -> tuple[dict, dict]:
    """x, d_y (B, L, E) -> (cache: every intermediate, parameter and input by name, the library's caches).

    causal: the attention's (``capstone.attention_forward``), for the GPT of exercise 15."""
    P = params
    E = x.shape[-1]
    scale = 1.0 / np.sqrt(E // num_heads)
    ones, zeros = np.ones(E), np.zeros(E)
    c: dict = {}
    xhat1, c["xhat1"] = LY.layer_norm_forward(x, ones, zeros, EPS)  # F1: (B, L, E)
    n1 = xhat1 * P["gamma1"] + P["beta1"]  # F2: (B, L, E)
    values = dict(xhat1=xhat1, n1=n1, **C.attention_forward(n1, P, num_heads, scale, c, causal))  # F3 ... F13
    h = x + values["a"]  # F14: (B, L, E)
    xhat2, c["xhat2"] = LY.layer_norm_forward(h, ones, zeros, EPS)  # F15: (B, L, E)
    n2 = xhat2 * P["gamma2"] + P["beta2"]  # F16: (B, L, E)
    u, c["u"] = F.linear_forward(n2, P["W_1"], P["b_1"])  # F17: (B, L, E) @ (E, I) -> (B, L, I)
    gl, c["gl"] = LY.gelu_forward(u, approximate="tanh")  # F18: (B, L, I)
    f, c["f"] = F.linear_forward(gl, P["W_2"], P["b_2"])  # F19: (B, L, I) @ (I, E) -> (B, L, E)
    y = h + f  # F20: (B, L, E)
    values.update(h=h, xhat2=xhat2, n2=n2, u=u, gl=gl, f=f, y=y, loss=float((y * d_y).sum()))  # F21
    c.update(P=P, d_y=d_y, xhat1_value=xhat1, xhat2_value=xhat2)
    cache = dict(x=x, d_y=d_y, num_heads=num_heads, scale=scale, eps=EPS, **P, **values)
    return cache, c


def _affine_grads(g: dict, d_out: np.ndarray, xhat: np.ndarray, gamma: np.ndarray, i: int) -> np.ndarray:
    """← out = xhat * gamma + beta: fills g[f"gamma{i}"], g[f"beta{i}"] (E,) and returns d_xhat (B, L, E)."""
    g[f"gamma{i}"] = (d_out * xhat).sum(axis=(0, 1))  # (E,)
    g[f"beta{i}"] = d_out.sum(axis=(0, 1))  # (E,)
    return d_out * gamma


def block_reference(c: dict) -> dict:
    """d loss / d every name of ``BLOCK_GRADS`` from the library's backward pairs (``c``: block_forward's 2nd dict)."""
    P, g = c["P"], {}
    g["y"] = c["d_y"]  # ← F21
    g["h"], g["f"] = LY.add_backward(g["y"])  # ← F20: the skip and the feed-forward path
    g["gl"], g["W_2"], g["b_2"] = F.linear_backward(g["f"], c["f"])  # ← F19
    g["u"] = LY.gelu_backward(g["gl"], c["gl"])  # ← F18
    g["n2"], g["W_1"], g["b_1"] = F.linear_backward(g["u"], c["u"])  # ← F17
    g["xhat2"] = _affine_grads(g, g["n2"], c["xhat2_value"], P["gamma2"], 2)  # ← F16
    g["h"] = g["h"] + LY.layer_norm_backward(g["xhat2"], c["xhat2"])[0]  # ← F15: the skip plus the norm's path
    d_x_skip, g["a"] = LY.add_backward(g["h"])  # ← F14
    g["n1"] = C.attention_grads(g, c)  # ← F13 ... F3: the three paths q, k, v
    g["xhat1"] = _affine_grads(g, g["n1"], c["xhat1_value"], P["gamma1"], 1)  # ← F2
    g["x"] = d_x_skip + LY.layer_norm_backward(g["xhat1"], c["xhat1"])[0]  # ← F1: the skip plus the norm's path
    return {name: g[name] for name in BLOCK_GRADS}


def block_case(seed: int = 0, B: int = 2, L: int = 3, E: int = 4, H: int = 2, inner: int = 8) -> tuple[dict, dict]:
    """A cache of ``block_forward`` on random x, d_y and parameters (L, E and I distinct: a transposed gradient has
    the wrong shape)."""
    rng = np.random.default_rng(seed)
    P = block_params(E, H, inner, rng)
    x = rng.standard_normal((B, L, E))
    d_y = rng.standard_normal((B, L, E))
    return block_forward(P, x, d_y, H)


BLOCK_CASES = ({"seed": 0}, {"seed": 1, "B": 1, "L": 4, "E": 6, "H": 3, "inner": 12})

# --------------------------------------------------------------------------- catalogued bugs of the block


def _rstd(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + EPS)  # (B, L, 1)


def _norm_path(x, d_xhat, terms: str) -> np.ndarray:
    """The LayerNorm backward from x̂ to x with the mean terms of ``terms`` ("both", "none", "mean", "xhat")."""
    rstd = _rstd(x)
    xhat = (x - x.mean(axis=-1, keepdims=True)) * rstd
    out = d_xhat.copy()
    if terms in ("both", "mean"):
        out = out - d_xhat.mean(axis=-1, keepdims=True)
    if terms in ("both", "xhat"):
        out = out - xhat * (d_xhat * xhat).mean(axis=-1, keepdims=True)
    return rstd * out


def _gelu_cdf(u: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))


def _norm_bugs(name: str, inp: str, d_xhat: str, skip) -> tuple:
    """The LayerNorm mistakes at ``name`` (the norm's input ``inp``, whose gradient also has the skip ``skip``)."""
    return (
        CapstoneBug(f"ln_no_mean_terms_{name}", name, "the LayerNorm backward without either mean term",
                    f"d_{name} = rstd * d_{d_xhat}",
                    "each row of the norm's part of the gradient must sum to 0 and be orthogonal to x̂",
                    lambda c, g: skip(c, g) + _norm_path(c[inp], g[d_xhat], "none")),
        CapstoneBug(f"ln_no_xhat_term_{name}", name, "the LayerNorm backward without the x̂·mean(d x̂ · x̂) term",
                    f"d_{name} = rstd * (d_{d_xhat} - mean(d_{d_xhat}))",
                    "the variance depends on x too: its term is x̂ · mean(d x̂ · x̂)",
                    lambda c, g: skip(c, g) + _norm_path(c[inp], g[d_xhat], "mean")),
        CapstoneBug(f"ln_no_mean_term_{name}", name, "the LayerNorm backward without the mean(d x̂) term",
                    f"d_{name} = rstd * (d_{d_xhat} - xhat * mean(d_{d_xhat} * xhat))",
                    "the mean depends on every x_i: its term is mean(d x̂)",
                    lambda c, g: skip(c, g) + _norm_path(c[inp], g[d_xhat], "xhat")),
        CapstoneBug(f"skip_missing_{name}", name, f"the residual's skip path missing from d_{name}",
                    f"d_{name} = (the norm's path only)",
                    f"{name} feeds the residual and the LayerNorm: its gradient is the sum of both",
                    lambda c, g: _norm_path(c[inp], g[d_xhat], "both")),
    )  # fmt: skip


BLOCK_BUGS = (
    *_norm_bugs("h", "h", "xhat2", lambda c, g: g["y"]),
    *_norm_bugs("x", "x", "xhat1", lambda c, g: g["h"]),
    CapstoneBug("gamma_not_summed", "gamma2", "the LayerNorm weight's gradient not summed over the tokens",
                "d_gamma2 = d_n2 * xhat2", "gamma has shape (E,): sum d_n2 * xhat2 over every leading axis",
                lambda c, g: g["n2"] * c["xhat2"]),
    CapstoneBug("gelu_no_product_rule", "u", "the GELU backward without the product rule",
                "d_u = d_gl * Phi(u)", "gl = u · Φ(u): its derivative is Φ(u) + u · Φ'(u)",
                lambda c, g: g["gl"] * _gelu_cdf(c["u"])),
    CapstoneBug("dw1_transposed", "W_1", "the weight gradient transposed", "d_W_1 = n2_2d.T @ d_u_2d",
                "W_1 is (I, E) in PyTorch's layout: d_W_1 = d_u_2dᵀ @ n2_2d, of the same shape",
                lambda c, g: g["W_1"].T),
    *(bug for bug in C.MODEL_BUGS if bug.name in ("ctx", "vh", "scores", "qh", "kh", "q")),
)  # fmt: skip


def block_paths(name: str, cache: dict, g: dict) -> dict | None:
    """The paths into a gradient that sums several: d_x and d_h (the residual's skip, the LayerNorm's, and the
    LayerNorm's own three: through x̂, the mean's, the variance's), d_n1 (n1 → q, k, v), d_u (GELU's product rule:
    Φ(u) and u · Φ'(u)), d_scores (the softmax's two terms); None for any other gradient."""
    if name in ("x", "h"):
        through, residual, norm, d_xhat = {"x": ("h", "F14", "F1", "xhat1"), "h": ("y", "F20", "F15", "xhat2")}[name]
        x = cache[name]
        rstd = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + EPS)  # (B, L, 1)
        xhat = (x - x.mean(axis=-1, keepdims=True)) * rstd
        d = g[d_xhat]
        return {f"{residual}'s skip (the residual)": g[through], f"{norm}'s LayerNorm": g[name] - g[through],
                f"{norm}'s direct path through x̂ (rstd · dx̂)": rstd * d,
                f"{norm}'s mean path (−rstd · mean(dx̂))": -rstd * d.mean(axis=-1, keepdims=True),
                f"{norm}'s variance path (−rstd · x̂ · mean(dx̂ ∘ x̂))":
                -rstd * xhat * (d * xhat).mean(axis=-1, keepdims=True)}  # fmt: skip
    if name == "n1":
        return {f"F{i} (n1 → {p})": g[p] @ cache[f"W_{p}"] for i, p in ((3, "q"), (4, "k"), (5, "v"))}
    if name == "u":
        u, c = cache["u"], np.sqrt(2 / np.pi)
        t = np.tanh(c * (u + 0.044715 * u**3))
        d_cdf = 0.5 * (1 - t * t) * c * (1 + 3 * 0.044715 * u**2)  # Φ'(u) of the tanh form
        return {"the Φ(u) term of gl = u · Φ(u)": g["gl"] * 0.5 * (1 + t),
                "the u · Φ'(u) term of gl = u · Φ(u) (the product rule's second)": g["gl"] * u * d_cdf}  # fmt: skip
    if name == "scores":
        return C.softmax_paths(cache["weights"], g["weights"])
    return None


BLOCK = Capstone(BLOCK_BACKWARD, BLOCK_STEPS, block_case, block_reference, BLOCK_CASES, BLOCK_BUGS, block_paths)
