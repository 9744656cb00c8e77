"""The interactive attention explorer: one self-contained HTML page (head, model, neuron and gradient views).

``explorer_html(attentions, tokens, ...)`` checks the arrays, rounds them, and inlines them with the
page's script (``explorer.js``) and style (``explorer.css``, both package data next to this file)
into one HTML string: no network access of any kind, no build step. ``write_explorer(path, ...)``
writes it. The returned ``ExplorerPage`` is a ``str`` that also displays itself in a notebook
(``_repr_html_``: the page in an ``iframe``, so its script and style stay apart from the notebook's).
``explorer_sets_html({name: page, ...})`` puts several attention sets (an encoder–decoder's encoder, decoder
and cross-attention) on one page, with a select between them.

Numbers on the page (the sizes keep a 6-layer, 12-head map of 64 tokens under about 2 MB):
- attention weights in thousandths (an int 0..1000 each);
- q and k vectors per (layer, head) as ints -2047..2047 times that head's ``max |q|`` / 2047 (and the
  same for k), each int written as two characters of the base-64 alphabet (``B64``; int + 2048 =
  64·first + second): 12 bits, about 3.5 significant digits of the largest entry. The neuron view
  multiplies these rounded vectors, so its score differs from the exact one by this rounding only;
- ``value_norms`` (layer, head, key) = ||v_j W_o,hᵀ||, the size of what key j's value adds to the
  output through head h; the neuron view's switch shows alpha_ij·||v_j W_o,hᵀ|| (normalised per query);
- the additive score terms (``biases``: ALiBi, a relative-position bias, ...; a float mask's finite values) as
  floats of 8 significant digits, each distinct (Lq, Lk) map once. The neuron view's score is
  q·k × scale + every term, and its weights their softmax: ``page_data`` checks that this softmax is the
  ``attentions`` it was given (within ``WEIGHT_ATOL``), so the neuron view cannot show other weights.
- ``weight_grads`` (a gradient of the weights, e.g. dP from the backward) packed as q and k are (12 bits of
  each head's largest |value|); 0 where the mask blocks.

Text (tokens, title, layer names) is made well-formed first (``well_formed``: a lone surrogate, which is no
character, becomes U+FFFD), then reaches the page only inside the JSON data, which is pure ASCII with
``<``, ``>`` and ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026`` (so nothing in it can end, comment out or open
a ``<script>``), and in ``<title>``, HTML-escaped; the script puts it into the page as text nodes and
attribute values only (``textContent``, ``setAttribute``), never as HTML.

Masks follow mha_numpy's convention (bool True = may attend, float -inf = blocked). Blocked (query,
key) pairs are drawn as masked; a query whose keys are all blocked (a fully masked row, zero weights)
is drawn as such.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from ._layout import blocked_cells

ROW_SUM_ATOL = 2e-3  # float32 softmax rows sum to 1 within ~1e-6; this only catches arrays that are no weights
WEIGHT_ATOL = 1e-3  # float32 weights are the float64 softmax within ~1e-6; a missing score term moves them ~0.1
SWAMPING_MASK = 1e6  # a finite mask value from which float32 (ulp 0.06 there) loses the scores added to it


class ExplorerPage(str):
    """The explorer's HTML (a ``str``). In a notebook it displays inline; ``.save(path)`` writes it; ``.data`` is
    what it draws (``page_data``'s dict), which ``explorer_sets_html`` puts beside other pages' on one page."""

    def __repr__(self) -> str:  # short: a notebook stores it next to the HTML
        return f"<ExplorerPage: {len(self)} characters of HTML; .save(path) writes it>"

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self, quote=True)}" style="width:100%;height:760px;border:0" '
            'sandbox="allow-scripts"></iframe>'
        )

    def save(self, path) -> Path:
        return _write(path, self)


# --------------------------------------------------------------------------- checks


def _per_layer(x, name: str, batch: int, last: int | None = None) -> np.ndarray:
    """A list of (H, L, n) or (B, H, L, n) arrays (one per layer), or one (H, L, n) / (layers, H, L, n)
    array -> float64 (layers, H, L, n). ``last``: the required size of the last axis, if any."""
    if isinstance(x, np.ndarray) or not isinstance(x, Sequence):
        a = np.asarray(x)
        if a.ndim not in (3, 4):
            raise ValueError(f"{name} must be (H, L, n) for one layer or (layers, H, L, n), got shape {a.shape}")
        layers = [a] if a.ndim == 3 else list(a)
    else:
        layers = []
        for i, item in enumerate(x):
            a = np.asarray(item)
            if a.ndim == 4:
                if not 0 <= batch < a.shape[0]:
                    raise ValueError(f"batch={batch} out of range for {name}[{i}] with shape {a.shape}")
                a = a[batch]
            if a.ndim != 3:
                raise ValueError(f"{name}[{i}] must be (H, L, n) or (B, H, L, n), got shape {np.shape(item)}")
            layers.append(a)
    if not layers:
        raise ValueError(f"{name} is empty (no layers): there is nothing to show")
    if any(a.shape != layers[0].shape for a in layers):
        raise ValueError(f"every layer of {name} must have the same shape, got {[a.shape for a in layers]}")
    out = np.stack(layers).astype(np.float64)  # (layers, H, L, n)
    if last is not None and out.shape[-1] != last:
        raise ValueError(f"{name} with shape {out.shape}: the last axis must have length {last}")
    return out


def _check_not_empty(shape: tuple[int, int, int, int]) -> None:
    """(layers, H, Lq, Lk) of the attentions: every axis holds something, or there is nothing to draw."""
    for n, what in zip(shape[1:], ("heads (H = 0)", "queries (Lq = 0)", "keys (Lk = 0)")):
        if n == 0:
            raise ValueError(f"attentions (layers, H, Lq, Lk) = {shape} has no {what}: there is nothing to show")


def well_formed(text) -> str:
    """``str(text)`` as Unicode text: a surrogate pair as its character, a lone surrogate (no character; e.g. a
    byte-level token's half, or a file name's undecodable byte) as U+FFFD, as for ``<title>``. Every text of the
    page (tokens, title, layer and set names, the gradient's note) goes through it, so the page holds only text
    that can be written as UTF-8 and that every browser API takes."""
    return str(text).encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def tick_labels(tokens, n: int, name: str) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(n)]
    labels = [well_formed(t) for t in tokens]
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} entries but the attention has length {n} on that axis")
    return labels


def _each_layer(x, name: str, shape: tuple[int, int, int, int], batch: int) -> list[np.ndarray]:
    """One array for every layer, or a list with one per layer, each broadcastable to (B, H, Lq, Lk) (a batch
    axis longer than 1 is indexed by ``batch``) -> one array per layer, broadcastable to (H, Lq, Lk)."""
    nl = shape[0]
    per_layer = list(x) if isinstance(x, (list, tuple)) else [x] * nl
    if len(per_layer) != nl:
        raise ValueError(f"{name} has {len(per_layer)} entries but the attention has {nl} layers")
    out = []
    for m in per_layer:
        m = np.asarray(m)
        if m.ndim == 4 and m.shape[0] > 1:  # (B, H|1, Lq|1, Lk): this sequence's array
            if not 0 <= batch < m.shape[0]:
                raise ValueError(f"batch={batch} out of range for {name} with shape {m.shape}")
            m = m[batch]
        elif m.ndim == 4:
            m = m[0]
        out.append(m)
    return out


def _masks(masks, shape: tuple[int, int, int, int], batch: int) -> tuple[np.ndarray, np.ndarray]:
    """masks: None, one mask for every layer, or a list with one mask per layer -> (blocked, added): bool
    (layers, H, Lq, Lk) True where the mask blocks, and float64 (layers, H, Lq, Lk) the finite values a float
    mask adds to the scores (0 where it blocks, and everywhere for a bool mask)."""
    if masks is None:
        return np.zeros(shape, dtype=bool), np.zeros(shape)
    blocked, added = [], []
    for m in _each_layer(masks, "masks", shape, batch):
        b = blocked_cells(m, shape[1:])  # (H, Lq, Lk)
        a = np.zeros(shape[1:]) if m.dtype == np.bool_ else np.where(b, 0.0, np.broadcast_to(m, shape[1:]))
        if not np.isfinite(a).all():
            raise ValueError(f"masks must be bool or float with finite values or -inf, got NaN or +inf ({m.shape})")
        blocked.append(b)
        added.append(a)
    return np.stack(blocked), np.stack(added)


def _biases(biases, shape: tuple[int, int, int, int], batch: int) -> dict[str, np.ndarray]:
    """{name: term} (each term as ``_each_layer`` takes it, float) -> {name: float64 (layers, H, Lq, Lk)}."""
    if biases is None:
        return {}
    if not isinstance(biases, dict):
        raise ValueError(f"biases must be a dict {{name: additive score term}}, got {type(biases).__name__}")
    out = {}
    for name, term in biases.items():
        what = f"biases[{name!r}]"
        layers = []
        for t in _each_layer(term, what, shape, batch):
            if not np.issubdtype(t.dtype, np.floating) or not np.isfinite(t).all():
                raise ValueError(f"{what} must hold finite floats, got dtype {t.dtype} with shape {t.shape}")
            try:
                layers.append(np.broadcast_to(t, shape[1:]).astype(np.float64))
            except ValueError:
                raise ValueError(
                    f"{what} with shape {t.shape} does not broadcast to (H, Lq, Lk) = {shape[1:]}"
                ) from None
        out[well_formed(name)] = np.stack(layers)  # (layers, H, Lq, Lk)
    return out


def _check_rows(A: np.ndarray, blocked: np.ndarray) -> None:
    """Each row of weights sums to 1, or to 0 where the mask blocks every key; blocked cells hold 0."""
    if not np.isfinite(A).all() or (A < 0).any():
        raise ValueError("attentions must hold finite weights >= 0 (after softmax)")
    sums = A.sum(axis=-1)  # (layers, H, Lq)
    full = blocked.all(axis=-1)  # (layers, H, Lq) fully masked rows
    bad = np.where(full, np.abs(sums) > ROW_SUM_ATOL, np.abs(sums - 1) > ROW_SUM_ATOL)
    if bad.any():
        l, h, i = (int(v) for v in np.argwhere(bad)[0])
        why = "a fully masked row must be 0" if full[l, h, i] else "and masks does not block all its keys"
        raise ValueError(
            f"attentions rows must sum to 1 (after softmax): layer {l}, head {h}, query {i} sums to "
            f"{sums[l, h, i]:.6g} ({why})"
        )
    if (A[blocked] > ROW_SUM_ATOL).any():
        l, h, i, j = (int(v) for v in np.argwhere(blocked & (A > ROW_SUM_ATOL))[0])
        raise ValueError(f"masks blocks layer {l}, head {h}, query {i}, key {j} but attentions has weight there")


def _check_softmax(A, Q, K, scale: float, terms: dict, added: np.ndarray, blocked: np.ndarray) -> None:
    """The neuron view's weights, softmax(q·kᵀ × scale + every term + the mask), are the given attentions.

    A, blocked, added: (layers, H, Lq, Lk); Q (layers, H, Lq, d), K (layers, H, Lk, d); terms {name: A's shape}.
    """
    S = scale * (Q @ K.swapaxes(-1, -2)) + added  # (layers, H, Lq, d) @ (layers, H, d, Lk) -> (layers, H, Lq, Lk)
    for t in terms.values():
        S = S + t
    S = np.where(blocked, -np.inf, S)
    top = S.max(axis=-1, keepdims=True)  # (layers, H, Lq, 1)
    e = np.exp(S - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    P = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # a fully masked row: 0
    err = np.abs(P - A)
    if err.max() > WEIGHT_ATOL:
        l, h, i, j = (int(v) for v in np.unravel_index(np.argmax(err), err.shape))
        named = "".join(f" + {n}" for n in terms) + (" + mask" if added.any() else "")
        hint = "Give every additive score term the model used (biases=, a float mask in masks=) and its scale"
        if np.abs(added[l, h, i]).max() >= SWAMPING_MASK:
            hint = "A finite mask this large swamps q·k in float32 (the model lost it): block with -inf or a bool mask"
        raise ValueError(
            f"attentions are not softmax(q·kᵀ × scale{named}) of queries and keys (scale = {scale:.6g}): layer {l}, "
            f"head {h}, query {i}, key {j} has weight {A[l, h, i, j]:.6g}, the softmax {P[l, h, i, j]:.6g}. {hint}"
        )


# --------------------------------------------------------------------------- the page


def _ints(a: np.ndarray, scale: float) -> list[int]:
    return np.rint(a / scale).astype(np.int64).ravel().tolist()


B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
VECTOR_MAX = 2047  # the largest |int| of a q or k entry


def _packed(a: np.ndarray, step: float) -> str:
    """Ints round(a / step) in -2047..2047 as two base-64 characters each (int + 2048 = 64·hi + lo)."""
    n = np.clip(np.rint(a / step), -VECTOR_MAX, VECTOR_MAX).astype(np.int64).ravel() + 2048
    return "".join(B64[v >> 6] + B64[v & 63] for v in n.tolist())


def _vectors(x: np.ndarray) -> tuple[list, list]:
    """(layers, H, L, d) -> ([layer][head] -> packed row-major (L, d) ints, [layer][head] -> step)."""
    steps = np.abs(x).max(axis=(2, 3)) / VECTOR_MAX  # (layers, H)
    steps = np.where(steps > 0, steps, 1.0)
    steps = np.array([[float(f"{s:.8g}") for s in row] for row in steps])  # the steps as the page has them
    packed = [[_packed(x[l, h], steps[l, h]) for h in range(x.shape[1])] for l in range(x.shape[0])]
    return packed, steps.tolist()


def _distinct(x: np.ndarray, encode) -> tuple[list, list]:
    """(layers, H, Lq, Lk) -> (each distinct (Lq, Lk) map that is not all zero, ``encode``d once;
    [layer][head] -> its index in that list, or -1 where the map is all zero)."""
    found: list = []
    seen: dict[bytes, int] = {}
    index = []
    for l in range(x.shape[0]):
        row = []
        for h in range(x.shape[1]):
            m = x[l, h]  # (Lq, Lk)
            if not m.any():
                row.append(-1)
                continue
            key = m.tobytes()
            if key not in seen:
                seen[key] = len(found)
                found.append(encode(m))
            row.append(seen[key])
        index.append(row)
    return found, index


def _term(x: np.ndarray) -> dict:
    """(layers, H, Lq, Lk) float term -> {"maps": distinct row-major (Lq, Lk) lists of floats, "index": [l][h]}."""
    maps, index = _distinct(x, lambda m: [float(f"{v:.8g}") for v in m.ravel().tolist()])
    return {"maps": maps, "index": index}


def _finite(x: np.ndarray, name: str) -> np.ndarray:
    if not np.isfinite(x).all():
        raise ValueError(f"{name} must be finite, got NaN or inf in shape {x.shape}")
    return x


def _indices(x, n: int, name: str) -> list[int]:
    """None (all of 0..n-1) or distinct ints in 0..n-1, in the order given."""
    if x is None:
        return list(range(n))
    if isinstance(x, (int, np.integer)) or isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be a list of indices in 0..{n - 1}, got {x!r}")
    out = [int(i) for i in x]
    if not out or len(set(out)) != len(out) or not all(0 <= i < n for i in out):
        raise ValueError(f"{name} must be distinct indices in 0..{n - 1} (at least one), got {list(x)!r}")
    return out


def _position(x, shown: list[int], name: str, among: str) -> int:
    """The position of index ``x`` among the ``shown`` ones (0 for None)."""
    if x is None:
        return 0
    if int(x) not in shown:
        raise ValueError(f"{name}={x!r} is not among the {among} shown ({shown})")
    return shown.index(int(x))


DEFAULT_HEADS_MAX = 4  # up to this many heads are all drawn at first; with more, the head view starts with the first


def _grads(weight_grads, A: np.ndarray, batch: int, blocked: np.ndarray) -> np.ndarray:
    """d(something)/d(attention weights) in the forms of ``attentions`` -> float64 (layers, H, Lq, Lk), the shape
    of ``A``, 0 where ``blocked`` (a blocked weight is fixed at 0: nothing flows through it)."""
    G = _finite(_per_layer(weight_grads, "weight_grads", batch), "weight_grads")  # (layers, H, Lq, Lk)
    if G.shape != A.shape:
        raise ValueError(f"weight_grads must have the shape of attentions {A.shape}, got {G.shape}")
    return np.where(blocked, 0.0, G)


def page_data(
    attentions,
    tokens,
    *,
    key_tokens=None,
    masks=None,
    queries=None,
    keys=None,
    value_norms=None,
    biases=None,
    scale: float | None = None,
    batch: int = 0,
    layer_names: Sequence[str] | None = None,
    title: str = "Attention explorer",
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    sentence_b_start: int | None = None,
    weight_grads=None,
    grad_note: str | None = None,
) -> dict:
    """The checked, rounded data the page draws (see ``explorer_html`` for the arguments)."""
    A = _per_layer(attentions, "attentions", batch)  # (layers, H, Lq, Lk)
    _check_not_empty(A.shape)
    nl, H, Lq, Lk = A.shape
    qtok = tick_labels(tokens, Lq, "tokens")
    ktok = qtok if key_tokens is None and Lq == Lk else tick_labels(key_tokens, Lk, "key_tokens")
    blocked, added = _masks(masks, A.shape, batch)  # (layers, H, Lq, Lk) each
    _check_rows(A, blocked)
    names = [f"layer {i}" for i in range(nl)] if layer_names is None else [well_formed(n) for n in layer_names]
    if len(names) != nl:
        raise ValueError(f"layer_names has {len(names)} entries but attentions has {nl} layers")
    keep_l = _indices(include_layers, nl, "include_layers")
    keep_h = _indices(include_heads, H, "include_heads")
    init_layer = _position(layer, keep_l, "layer", "layers (include_layers)")
    if heads is None:  # positions among the heads shown
        init_heads = list(range(len(keep_h))) if len(keep_h) <= DEFAULT_HEADS_MAX else [0]
    else:
        init_heads = [_position(h, keep_h, "heads", "heads (include_heads)") for h in _indices(heads, H, "heads")]
    if sentence_b_start is not None:
        b = int(sentence_b_start)
        if Lq != Lk or qtok != ktok or not 0 < b < Lq:
            raise ValueError(
                f"sentence_b_start={sentence_b_start!r} needs self-attention over one token list (Lq = Lk, key_tokens "
                f"the tokens) and 0 < sentence_b_start < {Lq}; got Lq = {Lq}, Lk = {Lk}"
            )

    def pick(x: np.ndarray) -> np.ndarray:  # (layers, H, ...) -> the layers and heads shown
        return x[keep_l][:, keep_h]

    grads = None
    if weight_grads is not None:
        g_ints, g_steps = _vectors(pick(_grads(weight_grads, A, batch, blocked)))  # packed as q and k are
        grads = {"note": "" if grad_note is None else well_formed(grad_note), "g": g_ints, "step": g_steps}
    elif grad_note is not None:
        raise ValueError("grad_note describes weight_grads, which was not given")
    A_all, blocked_all, added_all = A, blocked, added  # every layer and head: the neuron view's check reads them
    A, blocked = pick(A), pick(blocked)
    patterns, mask_index = _distinct(blocked, lambda m: "".join("1" if b else "0" for b in m.ravel().tolist()))

    data = {
        "title": well_formed(title),
        "qtok": qtok,
        "ktok": ktok,
        "layers": [names[l] for l in keep_l],
        "heads": len(keep_h),
        "headNames": [str(h) for h in keep_h],
        "initLayer": init_layer,
        "initHeads": init_heads,
        "sentenceB": None if sentence_b_start is None else int(sentence_b_start),
        "attn": [[_ints(A[l, h], 1e-3) for h in range(A.shape[1])] for l in range(A.shape[0])],
        "masks": patterns,  # distinct masks as strings of '0'/'1' (1 = blocked), row-major (Lq, Lk)
        "maskIndex": mask_index,
        "neuron": None,
        "grad": grads,
    }
    if (queries is None) != (keys is None):
        raise ValueError("queries and keys come together (the neuron view needs both), got only one of them")
    if queries is not None:
        Q = _finite(_per_layer(queries, "queries", batch), "queries")  # (layers, H, Lq, d)
        d = Q.shape[-1]
        K = _finite(_per_layer(keys, "keys", batch, last=d), "keys")  # (layers, H, Lk, d)
        if Q.shape[:3] != (nl, H, Lq) or K.shape[:3] != (nl, H, Lk) or d == 0:
            raise ValueError(
                f"queries {Q.shape} and keys {K.shape} must be (layers, H, Lq, d) and (layers, H, Lk, d) "
                f"with (layers, H, Lq, Lk) = {A.shape} of attentions and d > 0"
            )
        scale = float(1 / np.sqrt(d) if scale is None else scale)
        if not np.isfinite(scale):
            raise ValueError(f"scale must be a finite number, got {scale}")
        terms = _biases(biases, A_all.shape, batch)  # {name: (layers, H, Lq, Lk)}
        _check_softmax(A_all, Q, K, scale, terms, added_all, blocked_all)
        q_ints, q_steps = _vectors(pick(Q))
        k_ints, k_steps = _vectors(pick(K))
        neuron = {"d": d, "scale": scale}
        neuron.update(q=q_ints, qStep=q_steps, k=k_ints, kStep=k_steps, vnorm=None)
        neuron["terms"] = [{"name": name, **_term(pick(t))} for name, t in terms.items()]
        neuron["mask"] = _term(pick(added_all)) if added_all.any() else None  # a float mask's finite values
        if value_norms is not None:
            vn = _finite(np.asarray(value_norms, dtype=np.float64), "value_norms")
            if vn.shape != (nl, H, Lk):
                raise ValueError(f"value_norms must be (layers, H, Lk) = {(nl, H, Lk)}, got shape {vn.shape}")
            vn = pick(vn)
            neuron["vnorm"] = [[[float(f"{v:.4g}") for v in vn[l, h]] for h in range(vn.shape[1])]
                               for l in range(vn.shape[0])]  # fmt: skip
        data["neuron"] = neuron
    elif value_norms is not None or biases is not None:
        raise ValueError("value_norms and biases need queries and keys (they are shown in the neuron view)")
    return data


def _script_json(data: dict) -> str:
    """``data`` as JSON that is inert inside ``<script>``: ASCII only (U+2028, U+2029 and emoji as
    \\u escapes), ``<``, ``>``, ``&`` as \\u003c, \\u003e, \\u0026 (they occur only inside JSON strings, where
    the escape means the same character), so no ``</script>``, ``<!--`` or ``<script`` can form; no NaN."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _html_text(text: str) -> str:
    """Text for an HTML element such as ``<title>``: escaped, lone surrogates (not encodable) as U+FFFD."""
    return html.escape(well_formed(text), quote=True)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def explorer_html(attentions, tokens=None, **options) -> ExplorerPage:
    """One self-contained HTML page with the head, model, neuron and gradient views of these attention maps.

    attentions: a list with one (H, Lq, Lk) or (B, H, Lq, Lk) array per layer (as BertOutput.attentions
        or Hugging Face's ``output_attentions``; ``batch`` picks the sequence), or one array (H, Lq, Lk)
        (one layer) or (layers, H, Lq, Lk). Rows sum to 1, or are 0 where ``masks`` blocks every key.
    tokens: the Lq query tokens (default 0 .. Lq-1); key_tokens: the Lk keys (default: tokens).
    masks: None, one mask for all layers, or one per layer, in our convention (bool True = may attend,
        float -inf = blocked), broadcastable to (B, H, Lq, Lk).
    queries / keys: (layers, H, Lq, d) / (layers, H, Lk, d) per-head q and k (same forms as attentions)
        for the neuron view; scale: the factor of q·k (default 1/sqrt(d)).
    biases: {name: term} the additive score terms besides q·k × scale (e.g. {"ALiBi": ..., "relative bias":
        ...}), each one float array for every layer or a list with one per layer, broadcastable to
        (B, H, Lq, Lk). A float mask's finite values are a term too (from ``masks``). The neuron view shows
        each term and the softmax of their sum; these weights must be ``attentions`` (ValueError otherwise).
    value_norms: (layers, H, Lk) ||v_j W_o,hᵀ|| for the neuron view's value-weighted switch.
    include_layers / include_heads: the layers and heads to put on the page (default all; as bertviz's
        ``include_layers``, they keep a long input's page small and quick); the page names them by their index.
    layer: the layer shown first (default the first included); heads: the heads the head view draws first
        (default every head when there are at most 4, else the first: twelve at once are a hairball).
    sentence_b_start: the index of sentence B's first token for a sentence pair (self-attention): the head
        view then offers A→A, B→B, A→B and B→A beside all (as bertviz's head view does).
    weight_grads: d(something)/d(attention weights), the shape of ``attentions`` (same forms), e.g. dP from the
        backward for an upstream gradient (``explore_attention`` computes it): the gradient view draws it per head;
        grad_note: one sentence on the page saying what it is the gradient of.
    batch (default 0), layer_names (default "layer 0", ...), title: the rest. Every option is keyword-only and
    is ``page_data``'s (its signature lists them with their defaults); an unknown one raises TypeError.
    Returns an ``ExplorerPage`` (a str; displays inline in a notebook). Raises ValueError naming the
    argument on wrong ranks, an empty axis (no layer, head, query or key: nothing to show), token counts that
    do not match, rows that are not attention weights, or weights that are not the softmax of the scores.
    """
    data = page_data(attentions, tokens, **options)  # the keyword options above, checked there
    return _page(data, data["title"])


def explorer_sets_html(sets: dict, *, title: str = "Attention explorer") -> ExplorerPage:
    """One page of several attention sets and a select between them, as bertviz's ``encoder_attention``,
    ``decoder_attention`` and ``cross_attention``: e.g. an encoder–decoder's
    ``{"encoder": explore_attention(enc_mha, enc_cache, src, src), "decoder": ..., "cross": explore_attention(
    cross_mha, cross_cache, tgt, src)}``. Each value is an ``ExplorerPage`` (from ``explorer_html`` or an
    ``explore_*`` builder) or a dict of ``explorer_html``'s arguments; each set keeps its own tokens (query tokens
    ≠ key tokens for cross-attention), layers, heads, masks and views."""
    if not isinstance(sets, dict) or not sets:
        raise ValueError(
            f"sets must be a non-empty dict {{name: ExplorerPage or explorer_html arguments}}, got {sets!r}"
        )
    out = []
    for name, value in sets.items():
        if isinstance(value, ExplorerPage) and hasattr(value, "data"):
            data = dict(value.data)
        elif isinstance(value, dict):
            data = page_data(**{"tokens": None, **value})
        else:
            raise ValueError(f"sets[{name!r}] must be an ExplorerPage or a dict of explorer_html's arguments")
        out.append({**data, "name": well_formed(name), "title": well_formed(title)})
    return _page({"title": well_formed(title), "sets": out}, well_formed(title))


def _page(data: dict, title: str) -> ExplorerPage:
    """The HTML of ``data`` (one set's, or {title, sets}) with the script and the style inlined."""
    payload = _script_json(data)  # never ends, comments out or opens a <script>
    page = ExplorerPage(
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{_html_text(title)}</title>\n<style>\n{_asset('explorer.css')}</style>\n</head>\n"
        f"<body>\n<script id='explorer-data' type='application/json'>{payload}</script>\n"
        f"<script>\n{_asset('explorer.js')}</script>\n</body>\n</html>\n"
    )
    page.data = data  # what the page draws: explorer_sets_html combines pages from it
    return page


def _write(path, page: str) -> Path:
    path = Path(path)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise ValueError(f"path {str(path)!r} is not writable: {e.strerror or e}") from None
    return path


def write_explorer(path, attentions, tokens=None, **kwargs) -> Path:
    """Write ``explorer_html(attentions, tokens, **kwargs)`` to ``path`` (ValueError if not writable)."""
    return _write(path, explorer_html(attentions, tokens, **kwargs))
