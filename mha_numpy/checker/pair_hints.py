"""What ``relations`` needs to know of a graded pair's case: the paths each gradient sums, and the parts of it a bug
may be confined to, for every pair of the course (exercises 1-8 and 11-14).

``hints(pair_name, case, name, d_out) -> (paths, parts)``: ``paths`` {what the path is: its contribution to
d``name``} for ``relations.missing_path`` (a path missing, or one path's part scaled or of the wrong sign);
``parts`` {what the part is, and where to look: bool, True on it} for ``relations.wrong_on_part``; ``axes(...)``
{a reduction over another axis: the gradient so computed} for ``relations.wrong_axis`` (softmax, LayerNorm). All
computed from the case's inputs and the upstream gradient with the library's pairs, only when a gradient is
wrong; a pair or a gradient with none gives empty dicts. The paths of a gradient sum to it:

    softmax, sink softmax   dx = p ∘ dp − p ∘ Σ(p ∘ dp)                    the weights' path, the normaliser's
    attention (6, 13)       dq = (p ∘ dp) K · s − (p ∘ Σ(p ∘ dp)) K · s      the same two, through the scores
    flash attention (13)    dq = Σ over the key blocks of dS_j K_j · s       one a tile (dk, dv: a tile's keys a part)
    self-attention          dx = via the query + via the key + via the value
    cross-entropy           dlogits = p / N − onehot / N
    layer norm              dx = rstd·dx̂ − rstd·mean(dx̂) − rstd·x̂·mean(dx̂ ∘ x̂)   the direct, the mean's, the variance's
    repeat_kv               dx = Σ over the group's copies
    rope                    dx = d_out · cos − rotate_half(d_out) · sin
    soft-cap                dscores = d_out − tanh²(s / cap) · d_out
    delta rule              dk = the write's (β dS u) + the read's (−S̃ du);  dβ = through v_t + through −S̃ᵀk;
                            dk, dv, dβ, dg = token t's own + what the later tokens carried back (through time)
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import functional as F
from . import delta_rule as DR

WEIGHTS = "the p ∘ dp term (the weights' own path)"
NORMALISER = "the −p ∘ Σ(p ∘ dp) term (the softmax normaliser's path)"
BLOCKED = "the blocked entries (score −inf): their weight is 0 whatever the score, so their gradient is 0"


def _softmax_terms(p, dp) -> dict:
    return {WEIGHTS: p * dp, NORMALISER: -p * (p * dp).sum(axis=-1, keepdims=True)}


def _softmax(a, d_out, name):
    if name != "x":
        return {}, {}
    p = F.softmax_forward(a["x"])[0]
    return _softmax_terms(p, d_out), {BLOCKED: np.isneginf(a["x"])}


def _sink_softmax(a, d_out, name):
    if name != "x":
        return {}, {}
    p = F.sink_softmax_forward(a["x"], a["sink"])[0]
    return _softmax_terms(p, d_out), {BLOCKED: np.isneginf(a["x"])}


def _attention(a, d_out, name):
    """dq and dk of exercise 6's and 13's attention, each as the softmax's two terms through the scores; for
    exercise 13 (``block``), the key blocks as parts of dk and dv."""
    q, k, v, mask = a["q"], a["k"], a["v"], a.get("mask")
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = F.softmax_forward(s)[0]  # (B, H, Lq, Lk), 0 on a fully masked row
    terms = _softmax_terms(p, d_out @ v.swapaxes(-1, -2))  # dp: (B, H, Lq, dv) @ (B, H, dv, Lk)
    paths = {}
    if name == "q":
        paths = {f"{t}, through the scores": ds / np.sqrt(q.shape[-1]) @ k for t, ds in terms.items()}  # (Lq, d)
    elif name == "k":
        paths = {f"{t}, through the scores": ds.swapaxes(-1, -2) / np.sqrt(q.shape[-1]) @ q for t, ds in terms.items()}
    parts = {}
    block, Lk = a.get("block"), k.shape[-2]
    if not isinstance(block, int) or block < 1:
        return paths, parts
    ds = sum(terms.values()) / np.sqrt(q.shape[-1])  # (B, H, Lq, Lk): the scores' gradient
    for j in range(0, Lk, block):
        last = ", the last and partial one" if j + block > Lk else ""
        tile = f"key block {j // block} (keys {j} to {min(j + block, Lk) - 1}{last})"
        if name == "q":  # dq sums one contribution a tile
            paths[f"{tile}'s tile"] = ds[..., j : j + block] @ k[..., j : j + block, :]  # (Lq, bk) @ (bk, d)
        else:
            keys = np.zeros((Lk, 1), dtype=bool)
            keys[j : j + block] = True
            parts[f"{tile}: look at that tile"] = keys
    return paths, parts


def _self_attention(a, d_out, name, forward):
    if name != "x":
        return {}, {}
    mha, mha_cache = forward()[1]
    grads = mha.backward(d_out, mha_cache)
    return {f"the {p} path (x used as the {p})": grads[p] for p in ("query", "key", "value")}, {}


def _apply_mask(a, d_out, name):
    mask = a.get("mask")
    if name != "scores" or not isinstance(mask, np.ndarray) or mask.dtype != bool:
        return {}, {}
    return {}, {"the blocked entries (mask False): there the score is replaced by −inf, so its gradient is 0": ~mask}


def _dropout(a, d_out, name):
    keep = a.get("keep_mask")
    if name != "x" or keep is None:
        return {}, {}
    return {}, {
        "the dropped entries (keep_mask False): their output is 0 whatever x, so their gradient is 0": ~keep,
        "the kept entries (keep_mask True): there the gradient is d_out / (1 − p)": keep,
    }


def _embedding(a, d_out, name):
    ids, table = np.asarray(a["ids"]), a["table"]
    counts = np.bincount(ids.ravel(), minlength=table.shape[0])[:, None]  # (V, 1)
    return {}, {
        "the rows of ids that occur more than once: each occurrence's row of d_out adds up (np.add.at)": counts > 1,
        "the rows of ids that never occur: their gradient is 0": counts == 0,
    }


def _cross_entropy(a, d_out, name):
    logits, targets = a["logits"], np.asarray(a["targets"])
    N = targets.size
    p = F.softmax_forward(logits)[0]  # (..., V)
    onehot = np.eye(logits.shape[-1])[targets]  # (..., V)
    paths = {
        "the p / N term (the softmax's)": d_out * p / N,
        "the −onehot / N term (at the targets)": -d_out * onehot / N,
    }
    return paths, {"the targets' entries (the one-hot's −1)": onehot.astype(bool)}


def _layer_norm(a, d_out, name):
    if name != "x":
        return {}, {}
    x = a["x"]
    rstd = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + a["eps"])  # (..., 1)
    xhat = (x - x.mean(axis=-1, keepdims=True)) * rstd
    dxhat = d_out * a["gamma"]
    return {
        "the direct path through x̂ (rstd · dx̂)": rstd * dxhat,
        "the mean's path (−rstd · mean(dx̂))": -rstd * dxhat.mean(axis=-1, keepdims=True),
        "the variance's path (−rstd · x̂ · mean(dx̂ ∘ x̂))": -rstd * xhat * (dxhat * xhat).mean(axis=-1, keepdims=True),
    }, {}


def _repeat_kv(a, d_out, name):
    n = a["n_rep"]
    B, H, L, d = a["x"].shape
    copies = d_out.reshape(B, H, n, L, d)  # (B, Hkv·n_rep, L, d) -> (B, Hkv, n_rep, L, d): head h <- h // n_rep
    return {f"copy {r} of each group (query head h·n_rep + {r})": copies[:, :, r] for r in range(n)}, {}


def _rope(a, d_out, name, forward):
    cos, sin = forward()[1]
    return {
        "the cos term (d_out · cos)": d_out * cos,
        "the sin term (−rotate_half(d_out) · sin)": -F.rotate_half(d_out) * sin,
    }, {}


def _soft_cap(a, d_out, name):
    t = np.tanh(a["scores"] / a["cap"])
    return {"d_out itself (the 1 of 1 − tanh²)": d_out, "the −tanh²(s / cap) · d_out term": -(t * t) * d_out}, {}


def _relative_position_bias(a, d_out, name):
    """The table's two end columns: every distance beyond ±R is clipped onto them, so they collect many pairs."""
    table = a["table"]
    ends = np.zeros((1, table.shape[1]), dtype=bool)
    ends[0, [0, -1]] = True
    return {}, {"the table's end columns (distances clipped to ±R: every pair farther apart adds there too)": ends}


def _delta_rule(a, d_out, name):
    """dk: the write's and the read's paths; dβ: through v_t and through the read; and dk, dv, dβ, dg each as token
    t's own part and the part the state's gradient carried back from the later tokens brings (through time)."""
    if name not in ("k", "v", "beta", "g"):
        return {}, {}
    _, cache = DR.delta_rule_recurrent_forward(*(a[n] for n in ("q", "k", "v", "g", "beta", "initial_state")))
    part: dict = {}
    grads = dict(zip(("q", "k", "v", "g", "beta"), DR.delta_backward_with()(d_out, cache, part)))
    carried = part[{"k": "k_carried", "v": "v_carried", "beta": "b_carried", "g": "g_carried"}[name]]
    paths = {
        "the gradient of the state carried back from the later tokens (through time, ← R1 of token t + 1)": carried,
        "token t's own q_t do_tᵀ (through time)": grads[name] - carried,
    }
    if name == "k":
        paths = {"the write's path (β_t dS u_t, ← R3)": part["k_write"], "the read's path (−S̃_t du_t, ← R2)":
                 part["k_read"], **paths}  # fmt: skip
    if name == "beta":
        paths = {"the v_t of the error u_t (← R3)": part["b_v"], "the read −S̃_tᵀ k_t of the error u_t (← R3, R2)":
                 part["b_r"], **paths}  # fmt: skip
    return paths, {}


HINTS = {
    "softmax": _softmax,
    "sink_softmax": _sink_softmax,
    "scaled_dot_product_attention": _attention,
    "flash_attention": _attention,
    "apply_mask": _apply_mask,
    "dropout": _dropout,
    "embedding": _embedding,
    "softmax_cross_entropy": _cross_entropy,
    "layer_norm": _layer_norm,
    "repeat_kv": _repeat_kv,
    "soft_cap": _soft_cap,
    "relative_position_bias": _relative_position_bias,
    "delta_rule_recurrent": _delta_rule,
}
NEEDS_FORWARD = {"self_attention": _self_attention, "rope": _rope}  # read the reference forward's cache


def factor_arrays(pair, case, name: str) -> dict:
    """{what A is: A} for ``relations.elementwise_factor``: the arrays a chain rule multiplies d``name`` by entry by
    entry (the softmax's weights p, LayerNorm's rstd, the delta rule's decay a_t = exp(g_t) in dg)."""
    a = dict(case.args)
    if pair.name == "softmax" and name == "x":
        return {"p (the weights)": F.softmax_forward(a["x"])[0]}
    if pair.name == "sink_softmax" and name == "x":
        return {"p (the weights)": F.sink_softmax_forward(a["x"], a["sink"])[0]}
    if pair.name == "layer_norm" and name == "x":
        x = a["x"]
        return {"rstd = 1/√(var + eps)": 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + a["eps"])}
    if pair.name == "delta_rule_recurrent" and name == "g":
        return {"a_t = exp(g_t)": np.exp(a["g"])}
    return {}


AXIS_NAMES = {  # the course's layouts, by the number of axes
    3: ("the batch", "the positions", "the features"),
    4: ("the batch", "the heads", "the queries", "the keys"),
}


def _axis(ndim: int, axis: int) -> str:
    """Axis ``axis`` of an array of ``ndim`` axes, said with what it holds in the course's layouts."""
    words = AXIS_NAMES.get(ndim)
    return f"axis {axis - ndim if axis == ndim - 1 else axis}" + (f" ({words[axis]})" if words else "")


def axes(pair, case, name: str, d_out) -> dict:
    """{which reduction over which axis instead of which: d``name`` computed so} for ``relations.wrong_axis``: the
    softmax backward's row sum Σ(p ∘ dp) and LayerNorm's two means over each other axis (keepdims), repeat_kv's sum
    over the k/v heads instead of the copies (of another shape; np.tile's grouping is the catalogue's), from the
    case's inputs with the library's formulas. Empty for the other pairs and gradients."""
    a = dict(case.args)
    out = {}
    if pair.name in ("softmax", "sink_softmax") and name == "x":
        p = F.softmax_forward(a["x"])[0] if pair.name == "softmax" else F.sink_softmax_forward(a["x"], a["sink"])[0]
        for ax in range(p.ndim - 1):
            said = f"the row sum Σ(p ∘ dp) taken over {_axis(p.ndim, ax)} instead of {_axis(p.ndim, p.ndim - 1)}"
            out[said] = p * (d_out - (p * d_out).sum(axis=ax, keepdims=True))
    if pair.name == "layer_norm" and name == "x":
        x = a["x"]
        rstd = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + a["eps"])  # (..., 1)
        xhat, g, last = (x - x.mean(axis=-1, keepdims=True)) * rstd, d_out * a["gamma"], _axis(x.ndim, x.ndim - 1)
        for ax in range(x.ndim - 1):
            mean, var = g.mean(axis=ax, keepdims=True), (g * xhat).mean(axis=ax, keepdims=True)
            right_mean, right_var = g.mean(axis=-1, keepdims=True), (g * xhat).mean(axis=-1, keepdims=True)
            where = f"taken over {_axis(x.ndim, ax)} instead of {last}"
            out[f"the mean's path mean(dx̂) {where}"] = rstd * (g - mean - xhat * right_var)
            out[f"the variance's path mean(dx̂ ∘ x̂) {where}"] = rstd * (g - right_mean - xhat * var)
            out[f"both means of the backward {where}"] = rstd * (g - mean - xhat * var)
    if pair.name == "repeat_kv" and name == "x":
        (B, Hkv, L, d), n = a["x"].shape, a["n_rep"]
        if n > 1 and Hkv > 1:
            right = "over axis 2 of the (B, Hkv, n_rep, L, d) view, each group's copies (head h to h // n_rep)"
            said = (f"the sum over axis 1 of the (B, Hkv, n_rep, L, d) view, the k/v heads, instead of {right}: "
                    f"its shape (B, n_rep, L, d) = {(B, n, L, d)}, not (B, Hkv, L, d)")  # fmt: skip
            out[said] = d_out.reshape(B, Hkv, n, L, d).sum(axis=1)  # (B, Hkv·n_rep, L, d) -> (B, n_rep, L, d)
    return out


SELF_ATTENTION_PATHS = {"query": "W_q", "key": "W_k", "value": "W_v"}


def transposed_weights(pair, case, name: str, d_out) -> dict:
    """{which paths take their weight transposed: d``name`` computed so} for ``relations.transposed_weight``:
    self-attention's dx with the query, key or value path (or several) through W_qᵀ, W_kᵀ, W_vᵀ where the forward's
    x @ Wᵀ gives back d @ W. A path's own d is read back from its contribution d @ W (W square and well
    conditioned: otherwise no variant). Empty for the other pairs and gradients."""
    if pair.name != "self_attention" or name != "x":
        return {}
    params = dict(case.args)["params"]
    paths = _self_attention(dict(case.args), d_out, "x", lambda: pair.forward(*case.values()))[0]
    turned = []
    for (path, weight), part in zip(SELF_ATTENTION_PATHS.items(), paths.values()):
        W = np.asarray(params[weight], dtype=np.float64)
        if W.ndim != 2 or W.shape[0] != W.shape[1] or np.linalg.cond(W) > 1e8:
            return {}
        d = part @ np.linalg.inv(W)  # (B, L, E) @ (E, E): the path's d, from its contribution d @ W
        turned.append((f"the {path}", weight, part, d @ W.T))  # (B, L, E) @ (E, E): the path through Wᵀ
    return with_weights_transposed(turned, 0.0, "x used as the ")


def with_weights_transposed(turned: list, rest, used: str = "") -> dict:
    """{which paths use which weights transposed: the gradient so computed} from ``turned`` [(the path's name, its
    weight's, its right contribution d @ W, its contribution d @ Wᵀ)] and ``rest`` (the other paths' sum): each path
    and each set of them (at most 2³ − 1 for self-attention's three)."""
    out = {}
    for r in range(1, len(turned) + 1):
        for chosen in itertools.combinations(range(len(turned)), r):
            said = " and ".join(turned[i][0] for i in chosen)
            wrong = " and ".join(f"{turned[i][1]}ᵀ" for i in chosen)
            right = " and ".join(turned[i][1] for i in chosen)
            path = "path uses" if r == 1 else "paths use"
            where = f" ({used}{' and '.join(turned[i][0].removeprefix('the ') for i in chosen)})" if used else ""
            out[f"{said} {path} {wrong} where {right} belong{'s' * (r == 1)}{where}"] = rest + sum(
                turned[i][3] if i in chosen else turned[i][2] for i in range(len(turned))
            )
    return out


def forward_variants(pair, case) -> dict:
    """{what a forward did, said whole: its output so computed} for ``relations.known_variant``: the relative bias
    read at the mirrored distance i − j (the table's columns reversed: column R − t where R + t belongs; with
    Lq ≠ Lk it is no transpose). Empty for the other pairs."""
    if pair.name != "relative_position_bias":
        return {}
    a = dict(case.args)
    mirrored = pair.forward(np.asarray(a["table"])[:, ::-1], a["Lq"], a["Lk"])[0]  # (1, H, Lq, Lk)
    return {
        "reads the table in the wrong order, at the mirrored distance i − j where j − i belongs (the column of "
        "distance −t for +t): the distance is the key's position minus the query's": mirrored
    }


def forward_hints(pair, case) -> tuple[dict, dict]:
    """({term: its part of the output}, {part: where}) for ``pair``'s forward on ``case``: the terms a forward adds
    (a bias, a float mask, rope's cos and sin) and the parts an output may be wrong on alone (the blocked or the
    dropped entries)."""
    a = dict(case.args)
    if pair.name == "linear":
        return {"x @ W.T": a["x"] @ a["W"].T, "the bias b": a["b"]}, {}  # (..., in) @ (in, out)
    if pair.name == "layer_norm":
        x = a["x"]
        xhat = (x - x.mean(axis=-1, keepdims=True)) / np.sqrt(x.var(axis=-1, keepdims=True) + a["eps"])
        return {"gamma · x̂": a["gamma"] * xhat, "the bias beta": a["beta"]}, {}
    if pair.name == "rope":
        cos, sin = pair.forward(*case.values())[1]
        return {
            "the cos term (x · cos)": a["x"] * cos,
            "the sin term (rotate_half(x) · sin)": F.rotate_half(a["x"]) * sin,
        }, {}
    if pair.name == "self_attention":
        out = pair.forward(*case.values())[0]
        b_o = a["params"]["b_o"]
        return {"the output projection (merged @ W_o.T)": out - b_o, "the output bias b_o": b_o}, {}
    if pair.name == "apply_mask":
        mask = a["mask"]
        if mask.dtype == bool:
            return {}, {"the blocked entries (mask False): there the score becomes −inf": ~mask}
        return {"the scores": a["scores"], "the float mask (added to the scores)": mask}, {}
    if pair.name == "dropout":
        return _dropout(a, None, "x")
    if pair.name in ("softmax", "sink_softmax"):
        return {}, {BLOCKED: np.isneginf(a["x"])}
    return {}, {}


def hints(pair, case, name: str, d_out) -> tuple[dict, dict]:
    """({path: contribution}, {part: where}) for the gradient ``name`` of ``pair`` on ``case`` (see the module)."""
    args = dict(case.args)
    if pair.name in NEEDS_FORWARD:
        return NEEDS_FORWARD[pair.name](args, d_out, name, lambda: pair.forward(*case.values()))
    find = HINTS.get(pair.name)
    return find(args, d_out, name) if find else ({}, {})
