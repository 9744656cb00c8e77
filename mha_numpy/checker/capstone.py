"""The backprop-ninja capstone (exercises 9 and 10): the whole backward of a model, one intermediate at a time.

The forward is given, cut into the steps F1 ... of ``MODEL_STEPS`` (the tiny model of notebook 07: embeddings,
one multi-head self-attention, the residual, the read-out, the cross-entropy). ``model_forward`` runs them with
the library's pairs and returns every intermediate by name. The student writes

    capstone_model_backward(cache) -> {name: d loss / d name}

for every intermediate and every parameter, in plain NumPy. ``compare`` prints a table in the order the backward
meets them (F-label, name, exact, approximate, max diff: Karpathy's backprop-ninja ``cmp``), with the reference
gradients from the library's backward pairs; ``first_wrong`` names the first one that is wrong, which is where the
bug is (the rows after it computed from it inherit the error; a parameter's gradient passes on nothing), and
``diagnose`` names the catalogued bug it matches, computed from the *correct* gradient of that step's output.
``train`` trains notebook 07's task with the student's backward.

The course checker grades ``capstone_model_backward`` on ``MODEL.cases`` (``checker.runner.check_capstone``), in a
notebook and from ``python -m mha_numpy check``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import functional as F
from ..models import layers as LY
from ..models.tiny import TinyAttentionModel
from ..optim import Adam, clip_grad_norm
from ..train import evaluate, make_batch, one_blas_thread
from . import pair_hints, relations
from .diagnose import RTOL, scale_of

MODEL_BACKWARD = "capstone_model_backward"
PARAMS = ("tok_emb", "pos_emb", "W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o", "W_out", "b_out")

# (label, the forward line, the names whose gradients this line's backward yields), in the forward's order
MODEL_STEPS = (
    ("F1", "tok = tok_emb[tokens]                         (B, L, E)", ("tok_emb",)),
    ("F2", "pos = pos_emb[positions]                      (B, L, E)  positions = 0 ... L-1", ("pos_emb",)),
    ("F3", "x = tok + pos                                 (B, L, E)", ("tok", "pos")),
    ("F4", "q = x @ W_q.T + b_q                           (B, L, E)", ("W_q", "b_q", "x")),
    ("F5", "k = x @ W_k.T + b_k                           (B, L, E)", ("W_k", "b_k")),
    ("F6", "v = x @ W_v.T + b_v                           (B, L, E)", ("W_v", "b_v")),
    ("F7", "qh = q.reshape(B, L, H, D).transpose(0, 2, 1, 3)   (B, H, L, D)", ("q",)),
    ("F8", "kh = k.reshape(B, L, H, D).transpose(0, 2, 1, 3)   (B, H, L, D)", ("k",)),
    ("F9", "vh = v.reshape(B, L, H, D).transpose(0, 2, 1, 3)   (B, H, L, D)", ("v",)),
    ("F10", "scores = qh @ kh.swapaxes(-1, -2) * scale    (B, H, L, L)  scale = 1/sqrt(D)", ("qh", "kh")),
    ("F11", "weights = softmax(scores, axis=-1)           (B, H, L, L)", ("scores",)),
    ("F12", "ctx = weights @ vh                           (B, H, L, D)", ("weights", "vh")),
    ("F13", "merged = ctx.transpose(0, 2, 1, 3).reshape(B, L, E)", ("ctx",)),
    ("F14", "a = merged @ W_o.T + b_o                     (B, L, E)", ("merged", "W_o", "b_o")),
    ("F15", "h = x + a                                    (B, L, E)  the residual", ("a",)),
    ("F16", "logits = h @ W_out.T + b_out                 (B, L, V)", ("h", "W_out", "b_out")),
    ("F17", "loss = mean(-log softmax(logits)[targets])   ()  over the N = B*L tokens", ("logits",)),
)


def backward_order(steps) -> tuple[tuple[str, str], ...]:
    """(label, name) of every gradient in the order a backward meets them: the last forward line first."""
    return tuple((label, name) for label, _, names in reversed(steps) for name in reversed(names))


def step_outputs(steps) -> frozenset[str]:
    """The names the forward lines compute (left of ``=``): their gradients are read by the rows after them in the
    backward's order. The others (parameters, embedding tables) are leaves: no row is computed from their gradient."""
    return frozenset(line.split("=", 1)[0].strip() for _, line, _ in steps)


def listing(steps) -> str:
    """A capstone's forward, one line per step, as the notebook shows it."""
    rows = [re.split(r"\s{2,}", line, maxsplit=1) + [""] for _, line, _ in steps]  # [code, shape and note]
    width = max(len(code) for code, *_ in rows)
    return "\n".join(f"{label:>4}  {code:<{width}}  {rest}".rstrip() for (label, *_), (code, rest, *_) in
                     zip(steps, rows))  # fmt: skip


MODEL_ORDER = backward_order(MODEL_STEPS)
MODEL_GRADS = tuple(name for _, name in MODEL_ORDER)


def forward_listing() -> str:
    """The model capstone's forward (exercise 9)."""
    return listing(MODEL_STEPS)


# --------------------------------------------------------------------------- the forward, and the reference backward


def model_params(vocab_size: int, max_length: int, embed_dim: int, num_heads: int, seed: int = 0) -> dict:
    """Parameters of a ``TinyAttentionModel`` (the same initialisation), float64, by name."""
    model = TinyAttentionModel(vocab_size, max_length, embed_dim, num_heads, rng=np.random.default_rng(seed))
    return {name: model.params[name].copy() for name in PARAMS}


def model_forward(params: dict, tokens: np.ndarray, targets: np.ndarray, num_heads: int) -> tuple[dict, dict]:
    """tokens, targets (B, L) -> (cache: every intermediate, parameter and input by name, the library's caches).

    The cache is what the student's backward reads: tokens, targets, positions, num_heads, scale, the parameters
    and tok ... loss of ``MODEL_STEPS``. The second dict holds the pairs' own caches (the reference backward's).
    """
    P = params
    B, L = tokens.shape
    E = P["W_q"].shape[0]
    D = E // num_heads
    scale = 1.0 / np.sqrt(D)
    positions = np.broadcast_to(np.arange(L), (B, L))  # (B, L)
    c: dict = {}
    tok, c["tok"] = LY.embedding_forward(tokens, P["tok_emb"])  # F1: (B, L, E)
    pos, c["pos"] = LY.embedding_forward(positions, P["pos_emb"])  # F2: (B, L, E)
    x = tok + pos  # F3: (B, L, E)
    values = dict(tok=tok, pos=pos, x=x, **attention_forward(x, P, num_heads, scale, c))  # F4 ... F14
    h = x + values["a"]  # F15: (B, L, E)
    logits, c["logits"] = F.linear_forward(h, P["W_out"], P["b_out"])  # F16: (B, L, E) @ (E, V) -> (B, L, V)
    loss, c["loss"] = LY.softmax_cross_entropy_forward(logits, targets)  # F17: ()
    values.update(h=h, logits=logits, loss=loss)
    cache = dict(tokens=tokens, targets=targets, positions=positions, num_heads=num_heads, scale=scale)
    cache.update({name: p for name, p in P.items()}, **values)
    return cache, c


def attention_forward(x: np.ndarray, P: dict, num_heads: int, scale: float, c: dict, causal: bool = False) -> dict:
    """Self-attention as the capstones cut it (q ... a; F4-F14 of the model, F1-F11 of the block), with the library's
    pairs: x (B, L, E) -> {name: value}; each pair's cache goes into ``c`` under the name of its output.

    causal=True (exercise 15's GPT) sets the scores above the diagonal to -1e30 before the softmax: their weights
    are exactly 0, so the softmax's backward already gives them no gradient and the backward is unchanged."""
    q, c["q"] = F.linear_forward(x, P["W_q"], P["b_q"])  # (B, L, E) @ (E, E) -> (B, L, E)
    k, c["k"] = F.linear_forward(x, P["W_k"], P["b_k"])  # (B, L, E)
    v, c["v"] = F.linear_forward(x, P["W_v"], P["b_v"])  # (B, L, E)
    qh, c["qh"] = F.split_heads_forward(q, num_heads)  # (B, L, E) -> (B, L, H, D) -> (B, H, L, D)
    kh, c["kh"] = F.split_heads_forward(k, num_heads)  # (B, H, L, D)
    vh, c["vh"] = F.split_heads_forward(v, num_heads)  # (B, H, L, D)
    scores, c["scores"] = F.attention_scores_forward(qh, kh, scale)  # (B, H, L, D) @ (B, H, D, L) -> (B, H, L, L)
    if causal:
        L = x.shape[1]
        scores = np.where(np.tri(L, dtype=bool), scores, -1e30)  # (L, L) lower triangle kept: key j <= query i
    weights, c["weights"] = F.softmax_forward(scores)  # (B, H, L, L)
    ctx, c["ctx"] = F.attention_context_forward(weights, vh)  # (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)
    merged, c["merged"] = F.merge_heads_forward(ctx)  # (B, H, L, D) -> (B, L, H, D) -> (B, L, E)
    a, c["a"] = F.linear_forward(merged, P["W_o"], P["b_o"])  # (B, L, E) @ (E, E) -> (B, L, E)
    return dict(q=q, k=k, v=v, qh=qh, kh=kh, vh=vh, scores=scores, weights=weights, ctx=ctx, merged=merged, a=a)


def attention_grads(g: dict, c: dict) -> np.ndarray:
    """The reference backward of ``attention_forward``: from g["a"], fills ``g`` (merged ... q, W_q ... b_o) with the
    library's backward pairs and returns the attention's part of d_x (the three paths q, k, v), (B, L, E)."""
    g["merged"], g["W_o"], g["b_o"] = F.linear_backward(g["a"], c["a"])  # (B, L, E)
    g["ctx"] = F.merge_heads_backward(g["merged"], c["merged"])  # (B, H, L, D)
    g["weights"], g["vh"] = F.attention_context_backward(g["ctx"], c["ctx"])  # (B, H, L, L), (B, H, L, D)
    g["scores"] = F.softmax_backward(g["weights"], c["weights"])  # p * (dp - sum(p * dp))
    g["qh"], g["kh"] = F.attention_scores_backward(g["scores"], c["scores"])  # (B, H, L, D) each
    d_x = 0.0
    for name in ("v", "k", "q"):
        g[name] = F.split_heads_backward(g[name + "h"], c[name + "h"])  # (B, L, E)
        d_path, g[f"W_{name}"], g[f"b_{name}"] = F.linear_backward(g[name], c[name])
        d_x = d_x + d_path  # (B, L, E)
    return d_x


def reference_grads(c: dict) -> dict:
    """d loss / d every name of ``MODEL_GRADS``, from the library's backward pairs (``c``: model_forward's 2nd dict)."""
    g: dict = {}
    g["logits"] = LY.softmax_cross_entropy_backward(1.0, c["loss"])  # ← F17: (B, L, V)
    g["h"], g["W_out"], g["b_out"] = F.linear_backward(g["logits"], c["logits"])  # ← F16
    d_x_skip, g["a"] = LY.add_backward(g["h"])  # ← F15: the residual copies the gradient to both terms
    d_x_attention = attention_grads(g, c)  # ← F14 ... F4
    g["x"] = d_x_skip + d_x_attention  # x fed four paths (F15's skip, F4, F5, F6): their sum
    g["tok"], g["pos"] = LY.add_backward(g["x"])  # ← F3
    g["pos_emb"] = LY.embedding_backward(g["pos"], c["pos"])  # ← F2: summed over the batch
    g["tok_emb"] = LY.embedding_backward(g["tok"], c["tok"])  # ← F1: repeated tokens add up
    return {name: g[name] for name in MODEL_GRADS}


def model_case(seed: int = 0, B: int = 2, L: int = 4, E: int = 6, H: int = 2, V: int = 7) -> dict:
    """A cache of ``model_forward`` on random tokens and freshly initialised parameters (repeated tokens on purpose:
    V small, B·L large enough). The defaults give distinct sizes (L, E, V), so a transposed gradient has the wrong
    shape."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, size=(B, L))
    targets = rng.integers(0, V, size=(B, L))
    return model_forward(model_params(V, L, E, H, seed=seed), tokens, targets, H)


CASES = ({"seed": 0}, {"seed": 1, "B": 3, "L": 3, "E": 4, "H": 1, "V": 5})

# --------------------------------------------------------------------------- the comparison table


@dataclass
class Line:
    """One row of the table: the gradient of ``name`` (F-line ``label``) against the library's."""

    label: str
    name: str
    exact: bool
    approximate: bool
    max_diff: float
    problem: str = ""  # why it is not approximate (missing, a shape, NaN); "" when it is


def compare_grads(got, expected: dict, order=MODEL_ORDER) -> list[Line]:
    """One Line per gradient of ``order`` ((label, name) pairs), judged against the largest reference gradient of
    the case."""
    scale = scale_of(list(expected.values()))
    lines = []
    for label, name in order:
        want = np.asarray(expected[name], dtype=np.float64)
        have = got.get(name) if isinstance(got, dict) else None
        problem = ""
        if have is None:
            problem = "missing from the returned dict"
        else:
            have = np.asarray(have)
            if have.shape != want.shape:
                problem = f"shape {have.shape}, expected {want.shape}"
            elif not np.issubdtype(have.dtype, np.number):
                problem = f"dtype {have.dtype}, expected a float array"
        if problem:
            lines.append(Line(label, name, False, False, float("inf"), problem))
            continue
        with np.errstate(invalid="ignore"):
            diff = np.abs(have.astype(np.float64) - want)
        max_diff = float(np.nanmax(diff)) if diff.size and not np.isnan(diff).all() else 0.0
        if np.isnan(diff).any():
            lines.append(Line(label, name, False, False, float("nan"), "NaN in the gradient"))
            continue
        lines.append(Line(label, name, bool(np.array_equal(have, want)), max_diff <= RTOL * scale, max_diff))
    return lines


def table(lines: list[Line]) -> str:
    """The ninja's ``cmp`` for every gradient, with our F-labels."""
    head = "d loss / d"
    width = max(len(head), *(len(line.name) for line in lines))
    rows = [f"  {'':4} {head:<{width}}  exact  approx  max diff"]
    for line in lines:
        note = f"  {line.problem}" if line.problem else ""
        rows.append(f"  {line.label:>4} {line.name:<{width}}  {str(line.exact):<5}  {str(line.approximate):<6}  "
                    f"{line.max_diff:.1e}{note}")  # fmt: skip
    return "\n".join(rows)


def first_wrong(lines: list[Line]) -> Line | None:
    """The first gradient (in the backward's order) that is not approximately right: the bug is in its step."""
    return next((line for line in lines if not line.approximate), None)


# --------------------------------------------------------------------------- catalogued bugs of the capstone


@dataclass(frozen=True)
class CapstoneBug:
    """A classic mistake at the step that yields ``name``: ``variant(cache, g)`` is what the student's gradient of
    ``name`` is when the step is written that way, ``g`` being the correct gradients."""

    key: str
    name: str
    title: str
    wrote: str
    see: str
    variant: Callable

    def diagnosis(self) -> str:
        return f"{self.title}. You probably wrote {self.wrote}. How to see it: {self.see}"


def _onehot(cache) -> np.ndarray:
    V = cache["logits"].shape[-1]
    return np.eye(V)[cache["targets"]]  # (B, L, V)


def _probs(cache) -> np.ndarray:
    e = np.exp(cache["logits"] - cache["logits"].max(axis=-1, keepdims=True))  # (B, L, V)
    return e / e.sum(axis=-1, keepdims=True)


def _assign_rows(shape, ids, d) -> np.ndarray:
    out = np.zeros(shape)
    out[ids] = d  # the bug: with repeated ids only one write is kept
    return out


def _x_paths(cache, g) -> dict:
    """The four paths into x: the residual's skip, and through W_q, W_k, W_v."""
    return dict(skip=g["h"], q=g["q"] @ cache["W_q"], k=g["k"] @ cache["W_k"], v=g["v"] @ cache["W_v"])


MODEL_BUGS = (
    CapstoneBug("ce_no_mean", "logits", "cross-entropy gradient without the 1/N of the mean",
                "d_logits = probs - onehot", "d_logits sums (over everything) to 0 either way; its size is N times "
                "too large: compare one entry with a finite difference of the mean loss",
                lambda c, g: _probs(c) - _onehot(c)),
    CapstoneBug("ce_no_onehot", "logits", "cross-entropy gradient without the -1 at the target",
                "d_logits = probs / N", "each row of d_logits must sum to 0 (the softmax's rows sum to 1)",
                lambda c, g: _probs(c) / c["targets"].size),
    CapstoneBug("ce_sign", "logits", "cross-entropy gradient with the wrong sign", "d_logits = (onehot - probs) / N",
                "the target's entry of d_logits must be negative: raising its logit lowers the loss",
                lambda c, g: -g["logits"]),
    CapstoneBug("bias_not_summed_out", "b_out", "the bias gradient not summed over the tokens", "d_b_out = d_logits",
                "a bias has shape (V,): its gradient sums d_logits over every leading axis",
                lambda c, g: g["logits"]),
    CapstoneBug("dw_out_transposed", "W_out", "the weight gradient transposed", "d_W_out = h2d.T @ dlogits2d",
                "W_out is (V, E) in PyTorch's layout: d_W_out = d_logits2dᵀ @ h2d, of the same shape",
                lambda c, g: g["W_out"].T),
    CapstoneBug("merge_no_transpose", "ctx", "the head merge undone without its transpose",
                "d_ctx = d_merged.reshape(B, H, L, D)",
                "F13 transposed before reshaping, so its backward reshapes to (B, L, H, D) and then transposes",
                lambda c, g: g["merged"].reshape(c["ctx"].shape)),
    CapstoneBug("dv_untransposed", "vh", "d_vh without the transposed weights", "d_vh = weights @ d_ctx",
                "ctx = weights @ vh, so d_vh = weightsᵀ @ d_ctx (keys on the rows)",
                lambda c, g: c["weights"] @ g["ctx"]),
    CapstoneBug("softmax_diagonal", "scores", "only the diagonal of the softmax Jacobian",
                "d_scores = weights * (1 - weights) * d_weights",
                "each row of d_scores must sum to 0 (adding a constant to a row of scores changes nothing)",
                lambda c, g: c["weights"] * (1 - c["weights"]) * g["weights"]),
    CapstoneBug("softmax_wrong_axis", "scores", "the softmax backward's sum over the wrong axis",
                "sum(weights * d_weights, axis=-2)",
                "the sum runs over the keys (axis -1), the axis the softmax normalised",
                lambda c, g: c["weights"] * (g["weights"] - (c["weights"] * g["weights"]).sum(-2, keepdims=True))),
    CapstoneBug("scale_forgotten", "qh", "the scale forgotten in the scores' backward", "d_qh = d_scores @ kh",
                "d_qh is sqrt(D) times too large: F10 multiplied by scale, so its backward does too",
                lambda c, g: g["scores"] @ c["kh"]),
    CapstoneBug("scale_divided", "qh", "dividing by the scale instead of multiplying",
                "d_qh = d_scores @ kh / scale",
                "d_qh is D times too large: the backward multiplies by scale = 1/sqrt(D)",
                lambda c, g: g["scores"] @ c["kh"] / c["scale"]),
    CapstoneBug("dk_untransposed", "kh", "d_kh without the transposed d_scores", "d_kh = d_scores @ qh * scale",
                "scores[i, j] = q_i · k_j: key j collects column j of d_scores, d_kh = d_scoresᵀ @ qh · scale",
                lambda c, g: g["scores"] @ c["qh"] * c["scale"]),
    CapstoneBug("split_no_transpose", "q", "the head split undone without its transpose",
                "d_q = d_qh.reshape(B, L, E)", "F7 reshaped then transposed: its backward transposes back first",
                lambda c, g: g["qh"].reshape(c["q"].shape)),
    CapstoneBug("x_skip_missing", "x", "the residual's skip path missing from d_x",
                "d_x = d_x_q + d_x_k + d_x_v", "x is used four times (F4, F5, F6 and F15's skip): add all four",
                lambda c, g: (lambda p: p["q"] + p["k"] + p["v"])(_x_paths(c, g))),
    CapstoneBug("x_only_query", "x", "only the query's path through the attention in d_x",
                "d_x = d_h + d_q @ W_q",
                "self-attention uses x as query, key and value: the three paths (and the skip) add up",
                lambda c, g: (lambda p: p["skip"] + p["q"])(_x_paths(c, g))),
    CapstoneBug("x_only_skip", "x", "d_x from the residual alone", "d_x = d_h",
                "x also feeds the attention (F4-F6): its gradient is the skip plus three paths",
                lambda c, g: g["h"]),
    CapstoneBug("pos_not_summed", "pos_emb", "the position table's gradient taken from one sequence",
                "d_pos_emb = d_pos[0]", "every sequence of the batch uses the same rows: sum d_pos over the batch",
                lambda c, g: g["pos"][0]),
    CapstoneBug("embedding_assign", "tok_emb", "the embedding backward by assignment, so repeated tokens overwrite",
                "d_tok_emb[tokens] = d_tok (or += on fancy indexing)",
                "a token that appears twice must collect both rows: np.add.at(d_tok_emb, tokens, d_tok)",
                lambda c, g: _assign_rows(c["tok_emb"].shape, c["tokens"], g["tok"])),
)  # fmt: skip


def diagnose(got: dict, cache: dict, expected: dict, line: Line, catalogue=MODEL_BUGS) -> CapstoneBug | None:
    """The catalogued bug at ``line``'s step that the student's gradient reproduces (and that differs from the
    correct one on this case), or None."""
    scale = scale_of(list(expected.values()))
    have = got.get(line.name) if isinstance(got, dict) else None
    if have is None:
        return None
    have = np.asarray(have, dtype=np.float64)
    for bug in catalogue:
        if bug.name != line.name:
            continue
        with np.errstate(all="ignore"):
            variant = np.asarray(bug.variant(cache, expected), dtype=np.float64)
        if variant.shape == have.shape and _close(have, variant, scale) and not _close(expected[bug.name], variant,
                                                                                        scale):  # fmt: skip
            return bug
    return None


def relation(capstone: Capstone, got, cache: dict, expected: dict, line: Line) -> str:
    """``relations.explain`` for the first wrong gradient ``line``: its F-line, the factors worth naming (√D, the
    scale, N = B·L, B, L, H) and the paths into it that ``capstone.paths`` knows."""
    have = got.get(line.name) if isinstance(got, dict) else None
    B, L = cache["x"].shape[:2]
    shapes = {"N (the tokens, B·L)": B * L, "the batch size": B, "L (the positions)": L,
              "the number of heads": cache["num_heads"], "E (the width)": cache["x"].shape[-1]}  # fmt: skip
    names = relations.factor_names(shapes, d=int(round(cache["scale"] ** -2)), scale=cache["scale"])
    paths = capstone.paths(line.name, cache, expected) if capstone.paths else None
    parts = capstone.parts(line.name, cache) if capstone.parts else None
    code = next(text for label, text, _ in capstone.steps if label == line.label).split("  ")[0]
    where = f"at {line.label}: {code}"
    arrays = {"p (the weights)": cache["weights"]} if line.name == "scores" else None
    weights = _x_weights_transposed(cache, expected) if capstone.paths is model_paths and line.name == "x" else None
    return relations.explain(f"d_{line.name}", where, have, expected[line.name], scale_of(list(expected.values())),
                             names=names, paths=paths, parts=parts, arrays=arrays, weights=weights)  # fmt: skip


def _x_weights_transposed(cache, g) -> dict:
    """d_x with F4's, F5's or F6's path (or several) through W_qᵀ, W_kᵀ, W_vᵀ where F4-F6's x @ Wᵀ gives back
    d @ W, for ``relations.transposed_weight``."""
    turned = [(f"{line}'s {p}", f"W_{p}", g[p] @ cache[f"W_{p}"], g[p] @ cache[f"W_{p}"].T)  # (B, L, E) @ (E, E)
              for line, p in (("F4", "q"), ("F5", "k"), ("F6", "v"))]  # fmt: skip
    return pair_hints.with_weights_transposed(turned, g["h"], "x → ")


def _close(a, b, scale) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= RTOL * scale))


# --------------------------------------------------------------------------- what the notebook calls


@dataclass(frozen=True)
class Capstone:
    """One capstone: the student's ``function(cache) -> {name: gradient}``, the forward's ``steps`` (label, line,
    names), ``make_case(**case) -> (cache, the pairs' caches)``, ``reference(caches) -> gradients``, the checker's
    ``cases`` (keyword dicts of ``make_case``) and the catalogued ``bugs``; ``paths(name, cache, g)``: the paths
    into the gradient of ``name`` ({what the path is: its contribution}, or None), for ``relations.missing_path``;
    ``parts(name, cache)``: the parts of it a bug may be confined to ({what and where to look: bool}, or None), for
    ``relations.wrong_on_part``."""

    function: str
    steps: tuple
    make_case: Callable
    reference: Callable
    cases: tuple
    bugs: tuple
    paths: Callable | None = None
    parts: Callable | None = None

    @property
    def name(self) -> str:
        """The name ``check_namespace(..., only=[...])`` takes: "capstone_model", "capstone_block"."""
        return self.function.removesuffix("_backward")

    @property
    def order(self) -> tuple[tuple[str, str], ...]:
        return backward_order(self.steps)

    def run(self, got, case: dict):
        """-> (lines, first wrong line or None, its bug or None) of ``got`` against the reference of ``case``."""
        return self.judge(got, case)[:3]

    def judge(self, got, case: dict):
        """``run``'s three, and the relation of the first wrong gradient to the right one (``relation``, or "")."""
        cache, caches = self.make_case(**case)
        expected = self.reference(caches)
        lines = compare_grads(got, expected, self.order)
        wrong = first_wrong(lines)
        if wrong is None:
            return lines, None, None, ""
        said = relation(self, got, cache, expected, wrong)
        return lines, wrong, diagnose(got, cache, expected, wrong, self.bugs), said


@dataclass
class Comparison:
    """The table of one case, the first wrong gradient and its diagnosis; ``str`` is what the notebook prints."""

    function: str
    lines: list[Line]
    wrong: Line | None
    bug: CapstoneBug | None
    not_done: bool = False
    relation: str = ""  # how the first wrong gradient relates to the right one (checker.relations), or ""
    leaf: bool = False  # the first wrong gradient is a parameter's: no later row is computed from it

    def __str__(self) -> str:
        if self.not_done:
            return f"{self.function}: not done yet (it raises NotImplementedError)"
        text = table(self.lines)
        if self.wrong is None:
            return text + "\nevery gradient matches the library's backward"
        if self.leaf:
            why = "a parameter's gradient: no row below is computed from it, so a wrong row below is a bug of its own"
        else:
            why = "the rows below computed from it inherit the error"
        text += f"\nfirst wrong: {self.wrong.label} {self.wrong.name} ({why})"
        text += f"\nrelation: {self.relation}" if self.relation else ""
        return text + (f"\ndiagnosis: {self.bug.diagnosis()}" if self.bug else "")


def compare(backward: Callable, capstone: Capstone | None = None, case: dict | None = None) -> Comparison:
    """Run ``backward(cache)`` on a case of ``capstone`` (default: the model's, its first case) and compare every
    gradient with the reference."""
    capstone = capstone or MODEL
    case = case or capstone.cases[0]
    try:
        got = backward(_copy(capstone.make_case(**case)[0]))
    except NotImplementedError:
        return Comparison(capstone.function, [], None, None, not_done=True)
    lines, wrong, bug, said = capstone.judge(got, case)
    leaf = wrong is not None and wrong.name not in step_outputs(capstone.steps)
    return Comparison(capstone.function, lines, wrong, bug, relation=said, leaf=leaf)


def _copy(cache: dict) -> dict:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in cache.items()}


def model_paths(name: str, cache: dict, g: dict) -> dict | None:
    """The paths into a gradient that sums several: d_x (the residual's skip, and x → q, k, v), d_scores (the
    softmax's two terms), d_logits (the cross-entropy's p / N and −onehot / N), d_pos_emb (one per sequence of the
    batch: every sequence reads the same rows); None for any other gradient."""
    if name == "x":
        labels = {"skip": "F15's skip (the residual)", "q": "F4 (x → q)", "k": "F5 (x → k)", "v": "F6 (x → v)"}
        return {labels[p]: part for p, part in _x_paths(cache, g).items()}
    if name == "scores":
        return softmax_paths(cache["weights"], g["weights"])
    if name == "logits":
        N = cache["targets"].size
        return {"the p / N term (the softmax's)": _probs(cache) / N, "the −onehot / N term (at the targets)":
                -_onehot(cache) / N}  # fmt: skip
    if name == "pos_emb":
        return {f"sequence {b} of the batch (it reads the same rows)": g["pos"][b] for b in range(g["pos"].shape[0])}
    return None


def softmax_paths(weights, d_weights) -> dict:
    """d_scores = weights ∘ d_weights − weights ∘ Σ(weights ∘ d_weights): the weights' own path, the normaliser's."""
    return {"the softmax's p ∘ dp term (the weights' own path)": weights * d_weights,
            "the softmax's −p ∘ Σ(p ∘ dp) term (the normaliser's path)":
            -weights * (weights * d_weights).sum(axis=-1, keepdims=True)}  # fmt: skip


def embedding_parts(name: str, cache: dict) -> dict | None:
    """d_tok_emb's rows of the tokens that occur more than once (their rows of d_tok add up) and never (zero)."""
    if name != "tok_emb":
        return None
    counts = np.bincount(cache["tokens"].ravel(), minlength=cache["tok_emb"].shape[0])[:, None]  # (V, 1)
    return {"the rows of tokens that occur more than once: each occurrence's row of d_tok adds up (np.add.at)":
            counts > 1, "the rows of tokens that never occur: their gradient is 0": counts == 0}  # fmt: skip


MODEL = Capstone(
    MODEL_BACKWARD, MODEL_STEPS, model_case, reference_grads, CASES, MODEL_BUGS, model_paths, embedding_parts
)

# --------------------------------------------------------------------------- training with the student's backward


def train(backward: Callable | None, task: str = "reverse", *, length: int = 8, vocab_size: int = 10,
          embed_dim: int = 32, num_heads: int = 1, steps: int = 300, batch_size: int = 64, lr: float = 3e-3,
          max_grad_norm: float = 1.0, seed: int = 0, eval_size: int = 1000):  # fmt: skip
    """Train notebook 07's task as ``mha_numpy.train.train`` does (the same seeds, batches, Adam and clipping),
    with the gradients of ``backward(cache)`` (the student's), or of ``reference_grads`` when ``backward`` is None.

    -> (held-out token accuracy, the list of training losses). NotImplementedError if ``backward`` raises it.
    """

    seq_init, seq_data, seq_eval = np.random.SeedSequence(seed).spawn(3)
    data_rng = np.random.default_rng(seq_data)
    model = TinyAttentionModel(vocab_size, length, embed_dim, num_heads, rng=np.random.default_rng(seq_init))
    opt = Adam(model.params, lr=lr)
    eval_tokens, eval_targets = make_batch(task, np.random.default_rng(seq_eval), eval_size, length, vocab_size)
    losses = []
    with one_blas_thread():
        for _ in range(steps):
            tokens, targets = make_batch(task, data_rng, batch_size, length, vocab_size)
            cache, caches = model_forward(model.params, tokens, targets, num_heads)
            grads = reference_grads(caches) if backward is None else backward(cache)
            grads, _ = clip_grad_norm({name: np.asarray(grads[name]) for name in model.params}, max_grad_norm)
            opt.step(grads)
            losses.append(cache["loss"])
        accuracy = evaluate(model, eval_tokens, eval_targets)[1]
    return accuracy, losses
