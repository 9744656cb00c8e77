"""Explorer pages for what mha_numpy computes: one ``MultiHeadAttention`` cache, a BERT sentence, the toy model.

Each builder reads only the documented parts of an attention cache: ``cache.Q`` (B, H, Lq, d) and
``cache.K``, ``cache.V`` (B, Hkv, Lk, d), after RoPE and before the grouped-query repeat;
``cache.attn_weights`` (B, H, Lq, Lk); ``cache.attention.scores`` (B, H, Lq, Lk) = q·kᵀ × scale plus every
additive score term, before the mask (read only when the module has a term); and the output projection
``mha.params["W_o"]``. Query head h reads key/value head h // (H / Hkv). The terms a module has are
``mha.alibi`` (ALiBi) and ``"rel_bias" in mha.params`` (a relative-position bias); a float mask is one more,
taken from the ``mask`` given. The gradient view's dP (``weight_grads``) reads ``cache.V``, ``cache.attn_weights``
and ``W_o`` too. Each builder returns an ``ExplorerPage`` (see ``mha_numpy.viz.explorer``).
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import masks
from .explorer import ExplorerPage, explorer_html


def _per_head(x: np.ndarray, H: int) -> np.ndarray:
    """(B, Hkv, L, d) -> (B, H, L, d): grouped K/V heads repeated for the query heads that share them."""
    return x if x.shape[1] == H else np.repeat(x, H // x.shape[1], axis=1)


def value_norms(mha, cache) -> np.ndarray:
    """(B, H, Lk) ||v_j W_o,hᵀ||: the size of what key j's value adds to the output through head h.

    W_o (E, E) in PyTorch layout reads the merged context, whose columns h·d .. (h+1)·d are head h's.
    """
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
    (``attention_context_backward``: dP = dC_h V_hᵀ), with V repeated per query head.
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


def score_terms(mha, cache, Q: np.ndarray, K: np.ndarray) -> dict[str, np.ndarray]:
    """{name: (B, H, Lq, Lk)} the additive score terms of one call besides q·kᵀ × scale: "ALiBi" (``mha.alibi``)
    and "relative bias" (``"rel_bias" in mha.params``); {} when the module has neither.

    Q (B, H, Lq, d), K (B, H, Lk, d) float64 (K repeated per query head). Their sum is what the kernel added,
    ``cache.attention.scores`` - Q Kᵀ × scale; with both terms the relative bias is read from its table
    (``functional.relative_position_bias_forward``) and ALiBi is the rest.
    """
    names = (["ALiBi"] if mha.alibi else []) + (["relative bias"] if "rel_bias" in mha.params else [])
    if not names:
        return {}
    S = np.asarray(cache.attention.scores, dtype=np.float64)  # (B, H, Lq, Lk) with every term, before the mask
    extra = S - (Q * _scale(mha)) @ K.swapaxes(-1, -2)  # (B, H, Lq, d) @ (B, H, d, Lk) -> (B, H, Lq, Lk)
    if len(names) == 1:
        return {names[0]: extra}
    rel, _ = F.relative_position_bias_forward(mha.params["rel_bias"], S.shape[2], S.shape[3])  # (1, H, Lq, Lk)
    rel = np.broadcast_to(rel.astype(np.float64), S.shape)  # (B, H, Lq, Lk)
    return {"ALiBi": extra - rel, "relative bias": rel}


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
        layers.append((A[batch], Q[batch], K[batch], score_terms(m, c, Q, K), value_norms(m, c)[batch]))
    names = list(dict.fromkeys(n for *_, terms, _ in layers for n in terms))  # every term of any layer, in order
    A0 = layers[0][0]  # (H, Lq, Lk)
    biases = {n: [t[n][batch] if n in t else np.zeros(A0.shape) for *_, t, _ in layers] for n in names}
    return {
        "attentions": [a for a, *_ in layers],
        "queries": [q for _, q, *_ in layers],
        "keys": [k for _, _, k, *_ in layers],
        "biases": biases or None,
        "value_norms": np.stack([vn for *_, vn in layers]),
        "scale": _scale(pairs[0][0]),
        "weight_grads": grads,
    }


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
    ALiBi and relative bias to q·k × scale. The gradient view shows ``weight_grads`` for the upstream gradient
    ``d_output`` (B, Lq, E) of the output, default N(0, 1) (seed 0). ``options``: ``explorer_html``'s
    (``heads=``, ``include_heads=``, ``sentence_b_start=``, ...)."""
    arrays = _neuron_arrays([(mha, cache)], batch, None if d_output is None else [d_output])
    what = "G ~ N(0, 1) (seed 0), a random upstream gradient" if d_output is None else "G the d_output given"
    Lq, Lk = arrays["attentions"][0].shape[1:]
    qt = [f"q{i}" for i in range(Lq)] if query_tokens is None else query_tokens
    kt = [f"k{j}" for j in range(Lk)] if key_tokens is None else key_tokens
    return explorer_html(
        **arrays,
        tokens=qt,
        key_tokens=kt,
        masks=mask,
        batch=batch,
        title=title or f"MultiHeadAttention(E={mha.embed_dim}, H={mha.num_heads}): sequence {batch}",
        grad_note=GRAD_NOTE.format(what=what),
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
