"""One BERT encoder layer with a hand-written backward, post-norm (BERT) or pre-norm (GPT-2 and later).

    post-norm (BERT):                              pre-norm:
    a = MHA(x, x, x)                 F1            a = MHA(n1, n1, n1), n1 = LN1(x)      F1
    h = LN1(x + drop(a))             F2, F3        h = x + drop(a)                       F2
    f = FFN(h)                       F4            f = FFN(n2), n2 = LN2(h)              F4
    y = LN2(h + drop(f))             F5, F6        y = h + drop(f)                       F5

The weights are read by checkpoint name from the model's ``params`` dict at every forward, so an optimizer
that updates (or replaces) ``params`` entries is seen at once; the ``MultiHeadAttention`` holds the same arrays.
Derivation: docs/derivation.md, section 18.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from ..attention import MHACache, MultiHeadAttention
from . import layers as LY

# our MultiHeadAttention parameter -> the checkpoint name inside a layer (PyTorch layout on both sides)
ATTENTION_NAMES = {
    "W_q": "attention.self.query.weight",
    "b_q": "attention.self.query.bias",
    "W_k": "attention.self.key.weight",
    "b_k": "attention.self.key.bias",
    "W_v": "attention.self.value.weight",
    "b_v": "attention.self.value.bias",
    "W_o": "attention.output.dense.weight",
    "b_o": "attention.output.dense.bias",
}
LN1, LN2 = "attention.output.LayerNorm", "output.LayerNorm"
FFN = ("intermediate.dense.weight", "intermediate.dense.bias", "output.dense.weight", "output.dense.bias")
NORMS = ("post", "pre")
# the dropout masks of one layer, by the name of the module whose output they drop (as in transformers)
DROPOUT_SITES = ("attention.self", "attention.output", "output")


@dataclass
class BertLayerCache:
    """Intermediates of ``BertLayer.forward``; ``attention.attn_weights`` is (B, H, L, L)."""

    attention: MHACache
    _caches: dict


class BertLayer:
    """Self-attention (our MultiHeadAttention) + residual + LayerNorm, then FFN + residual + LayerNorm.

    ``params``: the model's dict by checkpoint name; ``prefix`` e.g. 'encoder.layer.0.'.
    ``norm``: "post" (BERT) or "pre". ``hidden_dropout`` is the p of the two residual-branch dropouts;
    the attention dropout p lives in ``self.attention.dropout``.
    """

    def __init__(self, config, params: dict[str, np.ndarray], prefix: str, dtype, norm: str = "post") -> None:
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        E, H = config.hidden_size, config.num_attention_heads
        self.params, self.prefix, self.norm, self.eps = params, prefix, norm, config.layer_norm_eps
        self.hidden_dropout = config.hidden_dropout_prob
        self.attention = MultiHeadAttention(
            E, H, bias=True, dropout=config.attention_probs_dropout_prob, dtype=dtype, rng=0
        )
        self._sync()

    def _sync(self) -> None:
        """Point the MultiHeadAttention at the current arrays of ``params`` (no copy)."""
        for ours, name in ATTENTION_NAMES.items():
            self.attention.params[ours] = self.params[self.prefix + name]

    def _ln(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self.params[f"{self.prefix}{name}.weight"], self.params[f"{self.prefix}{name}.bias"]

    def _drop(self, x: np.ndarray, keep: np.ndarray | None):
        """Hidden dropout with a given keep-mask, or the identity (eval) when ``keep`` is None."""
        return (x, None) if keep is None else F.dropout_forward(x, self.hidden_dropout, keep_mask=keep)

    def forward(self, x: np.ndarray, mask: np.ndarray, dropout: dict | None = None):
        """x (B, L, E), mask (B, 1, 1, L) bool (True = may attend) -> y (B, L, E), BertLayerCache.

        dropout: None (eval) or keep-masks by site: 'attention.self' (B, H, L, L), 'attention.output' and
        'output' (B, L, E), all bool.
        """
        self._sync()
        d = dropout or {}
        train = dropout is not None
        W1, b1, W2, b2 = (self.params[self.prefix + n] for n in FFN)
        pre = self.norm == "pre"
        n1, c_n1 = LY.layer_norm_forward(x, *self._ln(LN1), self.eps) if pre else (x, None)  # F1: (B, L, E)
        a, c_att = self.attention.forward(
            n1, n1, n1, mask=mask, training=train, dropout_mask=d.get("attention.self")
        )  # F1: (B, L, E) self-attention
        a, c_da = self._drop(a, d.get("attention.output"))  # F2: (B, L, E)
        h, _ = LY.add_forward(x, a)  # F2: (B, L, E) residual
        h, c_ln1 = (h, None) if pre else LY.layer_norm_forward(h, *self._ln(LN1), self.eps)  # F3: (B, L, E)
        n2, c_n2 = LY.layer_norm_forward(h, *self._ln(LN2), self.eps) if pre else (h, None)  # F4: (B, L, E)
        f, c_ffn = LY.feed_forward_forward(n2, W1, b1, W2, b2)  # F4: (B, L, E) -> (B, L, 4E) -> (B, L, E)
        f, c_df = self._drop(f, d.get("output"))  # F5: (B, L, E)
        y, _ = LY.add_forward(h, f)  # F5: (B, L, E) residual
        y, c_ln2 = (y, None) if pre else LY.layer_norm_forward(y, *self._ln(LN2), self.eps)  # F6: (B, L, E)
        caches = dict(n1=c_n1, da=c_da, ln1=c_ln1, n2=c_n2, ffn=c_ffn, df=c_df, ln2=c_ln2)
        return y, BertLayerCache(attention=c_att, _caches=caches)

    def backward(self, d_y: np.ndarray, cache: BertLayerCache) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """d_y (B, L, E) -> d_x (B, L, E), gradients by checkpoint name (this layer's 16 tensors)."""
        c, p, g = cache._caches, self.prefix, {}

        def ln_backward(d, key, name):
            d, g[f"{p}{name}.weight"], g[f"{p}{name}.bias"] = LY.layer_norm_backward(d, c[key])
            return d

        d_y = ln_backward(d_y, "ln2", LN2) if c["ln2"] is not None else d_y  # ← F6: (B, L, E)
        d_h, d_f = LY.add_backward(d_y)  # ← F5: the skip path and the FFN path
        d_f = F.dropout_backward(d_f, c["df"])  # ← F5
        d_n2, *g_ffn = LY.feed_forward_backward(d_f, c["ffn"])  # ← F4: (B, L, E)
        g.update({p + n: gi for n, gi in zip(FFN, g_ffn)})
        d_h = d_h + (ln_backward(d_n2, "n2", LN2) if c["n2"] is not None else d_n2)  # ← F4: both paths into h
        d_h = ln_backward(d_h, "ln1", LN1) if c["ln1"] is not None else d_h  # ← F3: (B, L, E)
        d_x, d_a = LY.add_backward(d_h)  # ← F2
        d_a = F.dropout_backward(d_a, c["da"])  # ← F2
        ga = self.attention.backward(d_a, cache.attention)  # ← F1: query, key, value, W_q, ...
        g.update({p + name: ga[ours] for ours, name in ATTENTION_NAMES.items()})
        d_n1 = ga["query"] + ga["key"] + ga["value"]  # ← F1: self-attention, three paths (B, L, E)
        d_x = d_x + (ln_backward(d_n1, "n1", LN1) if c["n1"] is not None else d_n1)  # ← F1: skip + attention
        return d_x, g
