"""Explorer pages for what mha_numpy computes: one ``MultiHeadAttention`` cache, a BERT sentence, the toy model.

Each builder takes the per-head q, k, v from the attention caches (``cache.Q``, ``cache.K``,
``cache.V``: (B, H, L, d)) and the output projection ``mha.params["W_o"]`` for the neuron view, and
returns an ``ExplorerPage`` (see ``mha_numpy.viz.explorer``).
"""

from __future__ import annotations

import numpy as np

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


def _scale(mha) -> float:
    return float(getattr(mha, "scale", None) or 1.0 / np.sqrt(mha.head_dim))


def _neuron_arrays(pairs, batch: int) -> dict:
    """[(mha, cache) per layer] -> the explorer's attentions, queries, keys, value_norms (lists per layer)."""
    return {
        "attentions": [c.attn_weights[batch] for _, c in pairs],
        "queries": [c.Q[batch] for _, c in pairs],
        "keys": [_per_head(c.K, m.num_heads)[batch] for m, c in pairs],
        "value_norms": np.stack([value_norms(m, c)[batch] for m, c in pairs]),
        "scale": _scale(pairs[0][0]),
    }


def explore_attention(
    mha, cache, query_tokens=None, key_tokens=None, *, mask=None, batch: int = 0, title: str | None = None
) -> ExplorerPage:
    """The explorer of one ``MultiHeadAttention.forward``: ``cache`` is what it returned, ``mask`` what it was
    given (drawn as masked); ``batch`` picks the sequence. Tokens default to q0.., k0..."""
    B, H, Lq, Lk = cache.attn_weights.shape
    if not 0 <= batch < B:
        raise ValueError(f"batch={batch} out of range for a cache with batch size {B}")
    qt = [f"q{i}" for i in range(Lq)] if query_tokens is None else query_tokens
    kt = [f"k{j}" for j in range(Lk)] if key_tokens is None else key_tokens
    return explorer_html(
        **_neuron_arrays([(mha, cache)], batch),
        tokens=qt,
        key_tokens=kt,
        masks=mask,
        batch=batch,
        title=title or f"MultiHeadAttention(E={mha.embed_dim}, H={H}): sequence {batch}",
    )


def bert_caches(model, inputs) -> tuple[object, list]:
    """Run ``model`` (a ``BertModel``) on ``inputs`` (BertInputs) -> (BertOutput, one attention cache per layer)."""
    out, cache = model.forward(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    return out, [layer.attention for layer in cache.layers]  # each layer's MHACache


def explore_bert(model, text: str, *, title: str | None = None) -> ExplorerPage:
    """The explorer of a ``BertModel`` on one sentence: every layer and head, with the neuron view."""
    inputs = model.tokenize(text)
    _, caches = bert_caches(model, inputs)
    pairs = [(layer.attention, c) for layer, c in zip(model.layers, caches)]
    return explorer_html(
        **_neuron_arrays(pairs, 0),
        tokens=inputs.tokens[0],
        masks=masks.padding_mask(attention_mask=inputs.attention_mask),
        title=title or f"BERT ({len(model.layers)} layers x {model.config.num_attention_heads} heads): {text}",
    )


def explore_tiny(model, tokens, *, title: str | None = None) -> ExplorerPage:
    """The explorer of a ``TinyAttentionModel`` (e.g. ``mha_numpy.train(...).model``) on one sequence of
    token ids (L,); the tokens are labelled ``position:id``."""
    ids = np.asarray(tokens)
    if ids.ndim != 1:
        raise ValueError(f"tokens must be one sequence of token ids (L,), got shape {ids.shape}")
    _, cache = model.forward(ids[None, :])
    labels = [f"{i}:{t}" for i, t in enumerate(ids.tolist())]
    return explore_attention(model.mha, cache.attention, labels, labels, title=title or f"{model}")
