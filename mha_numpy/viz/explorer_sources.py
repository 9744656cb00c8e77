"""Explorer pages for what mha_numpy computes: one ``MultiHeadAttention`` cache, a BERT sentence, the toy model.

Each builder reads only the documented parts of an attention cache: ``cache.Q`` (B, H, Lq, d) and
``cache.K``, ``cache.V`` (B, Hkv, Lk, d), after RoPE and before the grouped-query repeat;
``cache.attn_weights`` (B, H, Lq, Lk); ``cache.attention.scores`` (B, H, Lq, Lk) = q·kᵀ × scale plus every
additive score term and change, before the mask; and the output projection
``mha.params["W_o"]``. Query head h reads key/value head h // (H / Hkv). The terms a module has are
``mha.alibi`` (ALiBi) and ``"rel_bias" in mha.params`` (a relative-position bias); a float mask is one more,
taken from the ``mask`` given. The gradient view's dP (``weight_grads``) reads ``cache.V``, ``cache.attn_weights``
and ``W_o`` too. Each builder returns an ``ExplorerPage`` (see ``mha_numpy.viz.explorer``).

The newer options, read from the module's ``config`` by name (``getattr`` with a default, so a module without the
option is one that does not have it):

- ``sinks``: a row's weights sum to less than 1; the rest went to the sink, shown as one more key column
  "⟨sink⟩" holding 1 - the row's sum, whose neuron-view score is the sink's logit ``params["sinks"][h]`` (its k is
  0, its value nothing: ``value_norms`` and ``weight_grads`` are 0 there).
- ``softcap``, ``head_temperature``: ``cache.attention.scores`` are after them; the neuron view adds one term named
  after them, what they did to each score (e.g. "soft-cap" = cap · tanh(s / cap) - s); what an option this module
  does not name did is the term "other score changes" (ALiBi and the relative bias are always made exactly).
- ``diff_attention``: the H maps are two layers of H/2 heads, "map 1" (A_p) and "map 2" (A_{p+H/2}, subtracted
  × λ); the gradient view goes back through the pair's RMSNorm (``cache.steps["diff_combine"]``); the values are
  a pair's, so there is no per-head value size (the value-weighted switch is off).
- latent attention (MLA, a ``config.kv_lora_rank``): its per-head maps from ``cache.attn_weights`` only, the head
  and model views (a ``d_output`` is refused: the gradient view is not drawn for it).
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import masks
from .explorer import ExplorerPage, explorer_html


def _per_head(x: np.ndarray, H: int) -> np.ndarray:
    """(B, Hkv, L, d) -> (B, H, L, d): grouped K/V heads repeated for the query heads that share them."""
    return x if x.shape[1] == H else np.repeat(x, H // x.shape[1], axis=1)


def _option(mha, name: str, default=None):
    """The module's option ``name`` (its ``config``'s attribute), or ``default`` for a module without it."""
    return getattr(getattr(mha, "config", None), name, default)


def value_norms(mha, cache) -> np.ndarray | None:
    """(B, H, Lk) ||v_j W_o,hᵀ||: the size of what key j's value adds to the output through head h.

    W_o (E, E) in PyTorch layout reads the merged context, whose columns h·d .. (h+1)·d are head h's.
    None for differential attention: a pair's two maps read one 2d-wide value through an RMSNorm of their
    difference, so no head has a value size of its own.
    """
    if _option(mha, "diff_attention", False):
        return None
    V = _per_head(np.asarray(cache.V, dtype=np.float64), mha.num_heads)  # (B, H, Lk, d)
    B, H, Lk, d = V.shape
    W_o = np.asarray(mha.params["W_o"], dtype=np.float64)  # (E, E)
    W_h = W_o.reshape(W_o.shape[0], H, d).transpose(1, 0, 2)  # (E, H, d) -> (H, E, d)
    out = np.einsum("bhjd,hed->bhje", V, W_h)  # (B, H, Lk, d) x (H, E, d) -> (B, H, Lk, E)
    return np.linalg.norm(out, axis=-1)  # (B, H, Lk)


def weight_grads(mha, cache, d_output: np.ndarray) -> np.ndarray:
    """(B, H, Lq, Lk) dP = d⟨d_output, output⟩/d(attention weights): what the backward hands the softmax.

    The backward's first steps, reversed from the output: the output projection (dC = d_output W_o, the
    bias adds nothing), the head merge (``merge_heads_backward``) and the weighted sum
    (``attention_context_backward``: dP = dC_h V_hᵀ), with V repeated per query head. With differential
    attention the merge is of the H/2 pairs (2d wide each) and ``diff_combine_backward`` (``cache.steps
    ["diff_combine"]``) takes dC back to the H maps before the weighted sum.
    d_output: (B, Lq, E) the upstream gradient of the module's output. Reads ``cache.V``,
    ``cache.attn_weights`` and ``mha.params["W_o"]`` only (a recompute cache recomputes them).
    """
    P = np.asarray(cache.attn_weights, dtype=np.float64)  # (B, H, Lq, Lk)
    V = _per_head(np.asarray(cache.V, dtype=np.float64), mha.num_heads)  # (B, H, Lk, d)
    W_o = np.asarray(mha.params["W_o"], dtype=np.float64)  # (E, H·d) in PyTorch layout
    B, H, Lq, _ = P.shape
    d_output = np.asarray(d_output, dtype=np.float64)
    if d_output.shape != (B, Lq, W_o.shape[0]):
        raise ValueError(f"d_output must be (B, Lq, E) = {(B, Lq, W_o.shape[0])}, got shape {d_output.shape}")
    d_merged = d_output @ W_o  # (B, Lq, E) @ (E, H·d) -> (B, Lq, H·d), the gradient of the merged context
    if _option(mha, "diff_attention", False):  # V: (B, H, Lk, 2d), the pair's values; H/2 merged heads of 2d
        d_pairs = F.merge_heads_backward(d_merged, (B, H // 2, Lq, V.shape[-1]))  # -> (B, H/2, Lq, 2d)
        d_context = F.diff_combine_backward(d_pairs, cache.steps["diff_combine"])[0]  # -> (B, H, Lq, 2d)
    else:
        d_context = F.merge_heads_backward(d_merged, (B, H, Lq, V.shape[-1]))  # (B, Lq, H·d) -> (B, H, Lq, d)
    dP, _ = F.attention_context_backward(d_context, (P, V))  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    return dP


def random_upstream(mha, cache, seed: int = 0) -> np.ndarray:
    """A N(0, 1) upstream gradient of the module's output, (B, Lq, E): a random direction, not all ones."""
    B, _, Lq, _ = np.shape(cache.attn_weights)
    return np.random.default_rng(seed).standard_normal((B, Lq, mha.params["W_o"].shape[0]))


GRAD_NOTE = (
    "dL/dα for L = ⟨G, output⟩ with {what}: the gradient the backward hands the softmax (dP = (G W_o)_h Vᵀ, "
    "before the softmax's own backward). Red: raising α_ij raises L; blue: lowers it; per head, scaled by its "
    "largest |dL/dα|. Masked cells (hatched) have α fixed at 0."
)


def _scale(mha) -> float:
    return float(1.0 / np.sqrt(mha.head_dim) if mha.scale is None else mha.scale)  # the module's scale


def _appended(mha) -> int:
    """The keys the module appends after the sequence's (add_bias_kv, add_zero_attn): no score term reaches them."""
    return int(bool(_option(mha, "add_bias_kv", False))) + int(bool(_option(mha, "add_zero_attn", False)))


def _exact_terms(mha, shape: tuple) -> dict[str, np.ndarray]:
    """{"ALiBi", "relative bias"} as the module's steps make them, (1, H, Lq, Lk) float64 each, 0 on the keys it
    appends. shape: (B, H, Lq, Lk) of the scores."""
    H, Lq, Lk = shape[1:]
    n = Lk - _appended(mha)  # the keys the terms reach: every cached or given one
    out = {}
    if _option(mha, "alibi", False):
        out["ALiBi"] = F.alibi_bias(H, Lq, n, offset=n - Lq)  # (1, H, Lq, n), as the Alibi step
    if "rel_bias" in mha.params:
        out["relative bias"] = F.relative_position_bias_forward(mha.params["rel_bias"], Lq, n)[0]  # (1, H, Lq, n)
    pad = ((0, 0), (0, 0), (0, 0), (0, Lk - n))
    return {name: np.pad(t.astype(np.float64), pad) for name, t in out.items()}


SCORE_CHANGES = (("head_temperature", "head temperature"), ("softcap", "soft-cap"))  # (option, term name)
OTHER_TOLERANCE = 1e-4  # what is left of the scores beyond every named term, relative to max(1, max |score|)


def score_terms(mha, cache, Q: np.ndarray, K: np.ndarray) -> dict[str, np.ndarray]:
    """{name: (B, H, Lq, Lk)} the additive score terms of one call besides q·kᵀ × scale: "ALiBi" (``alibi``) and
    "relative bias" (``"rel_bias" in mha.params``), made as their steps make them (0 on the keys add_bias_kv and
    add_zero_attn append); then what the options that change the scores themselves did, as one term named after
    them (``head_temperature``: scores × exp(t_h); ``softcap``: cap · tanh(s / cap)), e.g. "soft-cap" =
    cap · tanh(s / cap) - s; {} when the module has none.

    Q (B, H, Lq, d), K (B, H, Lk, d) float64 (K repeated per query head). The terms sum to what the kernel made of
    q·kᵀ × scale, ``cache.attention.scores`` - Q Kᵀ × scale (the scores before the mask, after every change). Should
    more be left than rounding (``OTHER_TOLERANCE``) with no option to name it (an option this explorer does not
    know), it is the term "other score changes": the neuron view's softmax stays the module's weights.
    """
    changes = [name for option, name in SCORE_CHANGES if _option(mha, option) not in (None, False)]
    S = np.asarray(cache.attention.scores, dtype=np.float64)  # (B, H, Lq, Lk) with every term, before the mask
    rest = S - (Q * _scale(mha)) @ K.swapaxes(-1, -2)  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    terms = {n: np.broadcast_to(t, S.shape) for n, t in _exact_terms(mha, S.shape).items()}  # (B, H, Lq, Lk)
    for t in terms.values():
        rest = rest - t
    if changes:
        terms[" + ".join(changes)] = rest
    elif np.abs(rest).max(initial=0.0) > OTHER_TOLERANCE * max(1.0, np.abs(S).max(initial=0.0)):
        terms["other score changes"] = rest
    return terms


def _neuron_arrays(pairs, batch: int, d_outputs=None) -> dict:
    """[(mha, cache) per layer] -> the explorer's attentions, queries, keys, biases, value_norms and weight_grads
    (one per layer); d_outputs: one upstream gradient per layer (B, Lq, E), default N(0, 1) of seed = the layer.

    Each attribute is read once: a recompute cache recomputes it on every read.
    """
    layers, grads = [], []
    for n, (m, c) in enumerate(pairs):
        A = c.attn_weights  # (B, H, Lq, Lk)
        if not 0 <= batch < A.shape[0]:
            raise ValueError(f"batch={batch} out of range for a cache with batch size {A.shape[0]}")
        G = random_upstream(m, c, n) if d_outputs is None else d_outputs[n]
        grads.append(weight_grads(m, c, G)[batch])
        Q = np.asarray(c.Q, dtype=np.float64)  # (B, H, Lq, d)
        K = _per_head(np.asarray(c.K, dtype=np.float64), m.num_heads)  # (B, H, Lk, d)
        vn = value_norms(m, c)
        layers.append((A[batch], Q[batch], K[batch], score_terms(m, c, Q, K), None if vn is None else vn[batch]))
    names = list(dict.fromkeys(n for *_, terms, _ in layers for n in terms))  # every term of any layer, in order
    A0 = layers[0][0]  # (H, Lq, Lk)
    biases = {n: [t[n][batch] if n in t else np.zeros(A0.shape) for *_, t, _ in layers] for n in names}
    norms = [vn for *_, vn in layers]
    return {
        "attentions": [a for a, *_ in layers],
        "queries": [q for _, q, *_ in layers],
        "keys": [k for _, _, k, *_ in layers],
        "biases": biases or None,
        "value_norms": None if any(vn is None for vn in norms) else np.stack(norms),
        "scale": _scale(pairs[0][0]),
        "weight_grads": grads,
    }


SINK_TOKEN = "⟨sink⟩"  # the key column of the weight that went to the attention sink


def _full_mask(mask, shape: tuple, appended: int = 0) -> np.ndarray | None:
    """The mask given to the call -> (B, H, Lq, Lk), the cache's shape (None stays None). ``appended``: the keys the
    module appends after the sequence (add_bias_kv, add_zero_attn), which the mask does not cover and every query
    may attend to (the module's ``append_keys``): a mask over the Lk - appended keys gets them as allowed columns."""
    if mask is None:
        return None
    m = np.asarray(mask)
    if appended and m.ndim >= 1 and m.shape[-1] == shape[-1] - appended:
        tail = np.full((*m.shape[:-1], appended), True if m.dtype == np.bool_ else 0.0, dtype=m.dtype)
        m = np.concatenate([m, tail], axis=-1)  # (..., Lk): the appended keys allowed
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ValueError(f"mask with shape {m.shape} does not broadcast to the cache's {shape}") from None


def _with_sink(arrays: dict, mask, mha) -> tuple[dict, np.ndarray | None]:
    """One more key column, the sink: each row's weight that went to no key, 1 - the row's sum.

    attentions (H, Lq, Lk) -> (H, Lq, Lk + 1); the mask (B, H, Lq, Lk) never blocks the sink (True, or 0 added);
    with the neuron view, the sink's k is 0 and its score the term "sink logit" (the sink's logit per head, 0 on
    the keys); it has no value (value_norms, weight_grads 0 there).
    """

    def column(a, value=0.0):  # (..., Lk) -> (..., Lk + 1)
        return np.concatenate([a, np.full((*a.shape[:-1], 1), value, dtype=a.dtype)], axis=-1)

    out = dict(arrays)
    out["attentions"] = [np.concatenate([A, np.maximum(1.0 - A.sum(-1, keepdims=True), 0.0)], -1)
                         for A in arrays["attentions"]]  # fmt: skip  # (H, Lq, Lk + 1)
    if "keys" in arrays:
        out["keys"] = [np.concatenate([K, np.zeros((K.shape[0], 1, K.shape[2]))], axis=1) for K in arrays["keys"]]
        biases = {n: [column(t) for t in ts] for n, ts in (arrays["biases"] or {}).items()}
        logit = np.asarray(mha.params["sinks"], dtype=np.float64)  # (H,)
        sink = np.zeros(out["attentions"][0].shape)  # (H, Lq, Lk + 1)
        sink[..., -1] = logit[:, None]
        out["biases"] = {**biases, "sink logit": [sink] * len(arrays["attentions"])}
        out["value_norms"] = None if arrays["value_norms"] is None else column(arrays["value_norms"])
        out["weight_grads"] = [column(G) for G in arrays["weight_grads"]]
    if mask is not None:
        mask = column(mask, True if mask.dtype == np.bool_ else 0.0)  # (B, H, Lq, Lk + 1)
    return out, mask


def _diff_layers(arrays: dict, mask, lam: float) -> tuple[dict, list | None, list[str]]:
    """Differential attention's H maps as two layers of H/2 heads: head p's map 1 (A_p) and map 2 (A_{p+H/2}),
    its pair, which is subtracted × λ. Each per-layer entry (H, ...) -> two (H/2, ...); the mask too."""
    half = arrays["attentions"][0].shape[0] // 2

    def split(x):  # one layer, [(H, ...)] or (1, H, ...) -> [(H/2, ...), (H/2, ...)]
        return [x[0][:half], x[0][half:]]

    out = {k: (split(v) if k in ("attentions", "queries", "keys", "weight_grads") else v) for k, v in arrays.items()}
    if arrays.get("biases"):
        out["biases"] = {n: split(ts) for n, ts in arrays["biases"].items()}
    if arrays.get("value_norms") is not None:
        out["value_norms"] = np.stack(split(arrays["value_norms"]))
    masks = None if mask is None else [mask[:, :half], mask[:, half:]]
    names = ["map 1: A_p", f"map 2: A_(p+H/2), subtracted × λ = {lam:.4g}"]
    return out, masks, names


def explore_attention(
    mha,
    cache,
    query_tokens=None,
    key_tokens=None,
    *,
    mask=None,
    batch: int = 0,
    title: str | None = None,
    d_output=None,
    **options,
) -> ExplorerPage:
    """The explorer of one ``MultiHeadAttention.forward``: ``cache`` is what it returned, ``mask`` what it was
    given (drawn as masked; a float mask's finite values are a score term); ``batch`` picks the sequence.
    Tokens default to q0.., k0... (query and key tokens apart: cross-attention). The neuron view adds the module's
    ALiBi, relative bias, soft-cap and head temperature to q·k × scale. The gradient view shows ``weight_grads`` for
    the upstream gradient ``d_output`` (B, Lq, E) of the output, default N(0, 1) (seed 0). Sinks add a key
    column "⟨sink⟩"; differential attention shows its two maps as two layers of H/2 heads (``heads=``,
    ``include_heads=`` count those); latent attention (MLA) its per-head maps (head and model views; a
    ``d_output`` is refused).
    ``options``: ``explorer_html``'s (``heads=``, ``include_heads=``, ``sentence_b_start=``, ...)."""
    latent = _option(mha, "kv_lora_rank") is not None
    A = np.asarray(cache.attn_weights)  # (B, H, Lq, Lk)
    if not 0 <= batch < A.shape[0]:
        raise ValueError(f"batch={batch} out of range for a cache with batch size {A.shape[0]}")
    B, H, Lq, Lk = A.shape
    if latent:
        if d_output is not None:
            raise ValueError("d_output: latent attention (kv_lora_rank) gets no gradient view, only its per-head maps")
        arrays, what = {"attentions": [A[batch].astype(np.float64)]}, None
    else:
        arrays = _neuron_arrays([(mha, cache)], batch, None if d_output is None else [d_output])
        what = "G ~ N(0, 1) (seed 0), a random upstream gradient" if d_output is None else "G the d_output given"
    full = _full_mask(mask, A.shape, 0 if latent else _appended(mha))
    qt = [f"q{i}" for i in range(Lq)] if query_tokens is None else list(query_tokens)
    kt = [f"k{j}" for j in range(Lk)] if key_tokens is None else list(key_tokens)
    if _option(mha, "sinks", False):
        if options.get("sentence_b_start") is not None:
            raise ValueError("sentence_b_start with sinks is not supported: the sink is a key of neither sentence")
        arrays, full = _with_sink(arrays, full, mha)
        kt = kt + [SINK_TOKEN]
    masks, names = full, None
    if _option(mha, "diff_attention", False):
        vectors = (mha.params[n] for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"))  # (d,) each
        init = _option(mha, "diff_lambda_init", 0.8 - 0.6 * np.exp(-0.3 * _option(mha, "diff_layer_idx", 0)))
        lam, _ = F.diff_lambda_forward(*vectors, init)  # (), as the DiffCombine step
        arrays, masks, names = _diff_layers(arrays, full, float(lam))
    kind = "MultiHeadLatentAttention" if latent else "MultiHeadAttention"
    shown = "" if not latent else " (per-head maps; no neuron or gradient view for latent attention)"
    return explorer_html(
        **arrays,
        tokens=qt,
        key_tokens=kt,
        masks=masks,
        batch=batch,
        layer_names=names,
        title=title or f"{kind}(E={mha.embed_dim}, H={mha.num_heads}): sequence {batch}{shown}",
        grad_note=None if what is None else GRAD_NOTE.format(what=what),
        **options,
    )


def bert_caches(model, inputs) -> tuple[object, list]:
    """Run ``model`` (a ``BertModel``) on ``inputs`` (BertInputs) -> (BertOutput, one attention cache per layer)."""
    out, cache = model.forward(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    return out, [layer.attention for layer in cache.layers]  # each layer's MHACache


def explore_bert(model, text: str, *, title: str | None = None, **options) -> ExplorerPage:
    """The explorer of a ``BertModel`` on one sentence: every layer and head, with the neuron view, and the
    gradient view for a N(0, 1) upstream gradient of each layer's attention output (seed = the layer's index).
    ``options``: ``explorer_html``'s (``include_layers=``, ``heads=``, ``sentence_b_start=``, ...)."""
    inputs = model.tokenize(text)
    _, caches = bert_caches(model, inputs)
    pairs = [(layer.attention, c) for layer, c in zip(model.layers, caches)]
    what = "G ~ N(0, 1) a random upstream gradient of this layer's attention output (seed = the layer)"
    return explorer_html(
        **_neuron_arrays(pairs, 0),
        tokens=inputs.tokens[0],
        masks=masks.padding_mask(attention_mask=inputs.attention_mask),
        title=title or f"BERT ({len(model.layers)} layers x {model.config.num_attention_heads} heads): {text}",
        grad_note=GRAD_NOTE.format(what=what),
        **options,
    )


def explore_tiny(model, tokens, *, title: str | None = None, **options) -> ExplorerPage:
    """The explorer of a ``TinyAttentionModel`` (e.g. ``mha_numpy.train(...).model``) on one sequence of
    token ids (L,); the tokens are labelled ``position:id``. ``options``: ``explore_attention``'s."""
    ids = np.asarray(tokens)
    if ids.ndim != 1:
        raise ValueError(f"tokens must be one sequence of token ids (L,), got shape {ids.shape}")
    _, cache = model.forward(ids[None, :])
    labels = [f"{i}:{t}" for i, t in enumerate(ids.tolist())]
    return explore_attention(model.mha, cache.attention, labels, labels, title=title or f"{model}", **options)
