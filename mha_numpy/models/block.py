"""One Transformer block with a hand-written backward: attention, then a feed-forward, each with a residual and a
norm. BERT's layer, the tiny model's block and a Llama decoder layer are configurations of it.

    post-norm (BERT):                              pre-norm (GPT-2, Llama):
    a = attn(x)                      F1            a = attn(n1), n1 = norm1(x)           F1
    h = norm1(x + drop(a))           F2, F3        h = x + drop(a)                       F2
    f = ffn(h)                       F4            f = ffn(n2), n2 = norm2(h)            F4
    y = norm2(h + drop(f))           F5, F6        y = h + drop(f)                       F5

    norm: "layer_norm" (weight and bias) or "rms_norm" (weight only)
    ffn:  "gelu"   f = W_2 gelu(W_1 n + b_1) + b_2          (``approximate``: "none" erf, "tanh" GPT-2's)
          "swiglu" f = W_down (silu(W_gate n) ⊙ W_up n)      (Llama's, no biases)

The attention is a ``MultiHeadAttention`` built by the caller (BERT's with biases; Llama's with ``bias=False``,
``num_kv_heads`` and ``rope_theta``), or any token mixer of ``models.mixers`` (a recurrent layer: Gated DeltaNet,
...; the hybrid stack of ``models.hybrid``); the block only calls its ``forward`` and ``backward``. Causality is the
caller's mask (or the KV cache's). The weights live in the model's ``params`` dict under checkpoint names;
``names`` maps the block's roles to them, so BERT's and Llama's names are two tables, not code:

    roles: the attention's own parameter names (W_q, b_q, ..., W_o, b_o: whatever ``attention.params`` holds),
           norm1.weight, norm2.weight (+ norm1.bias, norm2.bias for layer_norm),
           W_1, b_1, W_2, b_2 (gelu) or W_gate, W_up, W_down (swiglu)

The block reads them by name at every forward, so an optimizer that updates (or replaces) ``params`` entries is
seen at once; the attention module holds the same arrays. Derivation: docs/derivation.md, section 19.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import check_probability
from ..attention import MHACache, MultiHeadAttention
from . import layers as LY
from .mixers import TokenMixer, as_mixer

NORM_POSITIONS = ("post", "pre")
NORM_ROLES = {"layer_norm": ("weight", "bias"), "rms_norm": ("weight",)}
FFN_ROLES = {"gelu": ("W_1", "b_1", "W_2", "b_2"), "swiglu": ("W_gate", "W_up", "W_down")}
# the block's dropout sites: the attention weights, and the two residual branches
DROPOUT_ROLES = ("attention", "attention_output", "ffn_output")


@dataclass
class BlockCache:
    """Intermediates of ``Block.forward``; ``attention.attn_weights`` is (B, H, Lq, Lk)."""

    attention: MHACache
    _caches: dict


class Block:
    """A Transformer block: ``attention`` (a MultiHeadAttention, self-attention, or a ``mixers.TokenMixer``) and a
    feed-forward, with residuals.

    params: the model's dict by checkpoint name; ``names`` maps each role (module docstring) to a name in it under
    ``prefix`` (e.g. 'encoder.layer.0.'). norm_position "post" | "pre"; norm "layer_norm" | "rms_norm" with
    ``eps``; ffn "gelu" (with ``approximate`` "none" | "tanh") | "swiglu". ``dropout`` is the p of the two
    residual-branch dropouts; the attention weights' p is the attention module's own ``dropout``.
    """

    def __init__(
        self,
        attention: MultiHeadAttention | TokenMixer,
        params: dict[str, np.ndarray],
        names: Mapping[str, str],
        prefix: str = "",
        *,
        norm_position: str,
        norm: str,
        eps: float,
        ffn: str,
        approximate: str = "none",
        dropout: float = 0.0,
    ) -> None:
        for arg, value, allowed in (
            ("norm_position", norm_position, NORM_POSITIONS),
            ("norm", norm, tuple(NORM_ROLES)),
            ("ffn", ffn, tuple(FFN_ROLES)),
        ):
            if value not in allowed:
                raise ValueError(f"{arg} must be one of {allowed}, got {value!r}")
        mixer = as_mixer(attention)  # the first sublayer, attention or another token mixer; ValueError if neither
        if approximate not in LY.GELU_APPROXIMATIONS:
            raise ValueError(f"approximate must be one of {LY.GELU_APPROXIMATIONS}, got {approximate!r}")
        check_probability(dropout, "dropout")
        self.attention, self.mixer, self.params, self.prefix = attention, mixer, params, prefix
        self.norm_position, self.norm, self.eps, self.ffn = norm_position, norm, eps, ffn
        self.approximate, self.dropout = approximate, float(dropout)
        self.norm_roles = [f"norm{i}.{w}" for i in (1, 2) for w in NORM_ROLES[norm]]
        self.ffn_roles = list(FFN_ROLES[ffn])
        self.roles = [*mixer.params, *self.norm_roles, *self.ffn_roles]
        self.names = dict(names)
        self._check_names()
        self._sync()

    def __repr__(self) -> str:
        ffn = self.ffn + (f"({self.approximate})" if self.ffn == "gelu" and self.approximate != "none" else "")
        return (
            f"Block({self.norm_position}-norm, {self.norm}, {ffn}, prefix={self.prefix!r}, "
            f"attention={self.attention!r})"
        )

    def _check_names(self) -> None:
        """Every role named, every name in ``params``, norm and attention shapes matching E (before any arithmetic)."""
        missing, extra = set(self.roles) - set(self.names), set(self.names) - set(self.roles)
        if missing or extra:
            raise ValueError(
                f"names must map exactly the roles {self.roles}; missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        absent = [self.prefix + self.names[r] for r in self.roles if self.prefix + self.names[r] not in self.params]
        if absent:
            raise ValueError(f"params lacks {len(absent)} of the block's tensors, e.g. {absent[:3]}")
        E = self.mixer.embed_dim
        expected = {role: p.shape for role, p in self.mixer.params.items()}
        expected.update({role: (E,) for role in self.norm_roles})
        for role, shape in expected.items():
            if self._p(role).shape != shape:
                raise ValueError(f"params[{self.prefix + self.names[role]!r}] has shape {self._p(role).shape}, "
                                 f"but the block ({role}) needs {shape}")  # fmt: skip

    def _p(self, role: str) -> np.ndarray:
        return self.params[self.prefix + self.names[role]]

    def _sync(self) -> None:
        """Point the attention module (the mixer) at the current arrays of ``params`` (no copy)."""
        for role in self.mixer.params:
            self.mixer.params[role] = self._p(role)

    # ------------------------------------------------------------------ the sublayers, by kind

    def _norm_forward(self, x: np.ndarray, i: int):
        if self.norm == "rms_norm":
            return LY.rms_norm_forward(x, self._p(f"norm{i}.weight"), self.eps)
        return LY.layer_norm_forward(x, self._p(f"norm{i}.weight"), self._p(f"norm{i}.bias"), self.eps)

    def _norm_backward(self, d: np.ndarray, cache, i: int, g: dict) -> np.ndarray:
        """-> d_x; the norm's gradients go into ``g`` by checkpoint name."""
        d, *grads = (LY.rms_norm_backward if self.norm == "rms_norm" else LY.layer_norm_backward)(d, cache)
        g.update({self.prefix + self.names[f"norm{i}.{w}"]: gw for w, gw in zip(NORM_ROLES[self.norm], grads)})
        return d

    def _ffn_forward(self, x: np.ndarray):
        weights = [self._p(role) for role in self.ffn_roles]
        if self.ffn == "swiglu":
            return LY.swiglu_forward(x, *weights)  # (B, L, E) -> (B, L, I) -> (B, L, E)
        return LY.feed_forward_forward(x, *weights, approximate=self.approximate)  # (B, L, E) -> (B, L, I) -> ...

    def _ffn_backward(self, d: np.ndarray, cache, g: dict) -> np.ndarray:
        d, *grads = (LY.swiglu_backward if self.ffn == "swiglu" else LY.feed_forward_backward)(d, cache)
        g.update({self.prefix + self.names[role]: gw for role, gw in zip(self.ffn_roles, grads)})
        return d

    def _drop(self, x: np.ndarray, keep: np.ndarray | None):
        """Residual-branch dropout with a given keep-mask, or the identity (eval) when ``keep`` is None."""
        return (x, None) if keep is None else F.dropout_forward(x, self.dropout, keep_mask=keep)

    # ------------------------------------------------------------------ forward / backward

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None, dropout: dict | None = None,
                positions: np.ndarray | None = None, kv_cache=None):  # fmt: skip
        """x (B, L, E) -> y (B, L, E), BlockCache.

        mask: the attention's (bool True = may attend, or float added), broadcastable to (B, H, L, Lk).
        dropout: None (eval) or keep-masks by role: 'attention' (B, H, L, L), 'attention_output' and 'ffn_output'
        (B, L, E), all bool. positions (RoPE) and kv_cache (decoding, forward only) go to the attention.
        """
        if dropout is not None and not set(dropout) <= set(DROPOUT_ROLES):
            raise ValueError(f"dropout keep-masks are named {DROPOUT_ROLES}, got {sorted(dropout)}")
        self._sync()
        d = dropout or {}
        pre = self.norm_position == "pre"
        n1, c_n1 = self._norm_forward(x, 1) if pre else (x, None)  # F1: (B, L, E)
        a, c_att = self.mixer.forward(
            n1, mask=mask, training=dropout is not None, dropout_mask=d.get("attention"), positions=positions,
            cache=kv_cache,
        )  # F1: (B, L, E) self-attention (or another token mixer)  # fmt: skip
        a, c_da = self._drop(a, d.get("attention_output"))  # F2: (B, L, E)
        h, _ = LY.add_forward(x, a)  # F2: (B, L, E) residual
        h, c_h = (h, None) if pre else self._norm_forward(h, 1)  # F3: (B, L, E)
        n2, c_n2 = self._norm_forward(h, 2) if pre else (h, None)  # F4: (B, L, E)
        f, c_ffn = self._ffn_forward(n2)  # F4: (B, L, E)
        f, c_df = self._drop(f, d.get("ffn_output"))  # F5: (B, L, E)
        y, _ = LY.add_forward(h, f)  # F5: (B, L, E) residual
        y, c_y = (y, None) if pre else self._norm_forward(y, 2)  # F6: (B, L, E)
        caches = dict(n1=c_n1, da=c_da, h=c_h, n2=c_n2, ffn=c_ffn, df=c_df, y=c_y)
        return y, BlockCache(attention=c_att, _caches=caches)

    __call__ = forward

    def backward(self, d_y: np.ndarray, cache: BlockCache) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """d_y (B, L, E) -> d_x (B, L, E), gradients by checkpoint name (every tensor of the block)."""
        c, g = cache._caches, {}
        d_y = self._norm_backward(d_y, c["y"], 2, g) if c["y"] is not None else d_y  # ← F6: (B, L, E)
        d_h, d_f = LY.add_backward(d_y)  # ← F5: the skip path and the feed-forward path
        d_f = F.dropout_backward(d_f, c["df"])  # ← F5
        d_n2 = self._ffn_backward(d_f, c["ffn"], g)  # ← F4: (B, L, E)
        d_h = d_h + (self._norm_backward(d_n2, c["n2"], 2, g) if c["n2"] is not None else d_n2)  # ← F4: both paths
        d_h = self._norm_backward(d_h, c["h"], 1, g) if c["h"] is not None else d_h  # ← F3: (B, L, E)
        d_x, d_a = LY.add_backward(d_h)  # ← F2
        d_a = F.dropout_backward(d_a, c["da"])  # ← F2
        d_n1, ga = self.mixer.backward(d_a, cache.attention)  # ← F1: self-attention's three paths summed (B, L, E)
        g.update({self.prefix + self.names[role]: ga[role] for role in self.mixer.params})
        d_x = d_x + (self._norm_backward(d_n1, c["n1"], 1, g) if c["n1"] is not None else d_n1)  # ← F1: skip + attn
        return d_x, g
