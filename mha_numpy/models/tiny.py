"""A tiny attention model trained end to end with the hand-written backward.

    tokens (B, L) ──embedding tok_emb──► tok (B, L, E) ─┐
    positions (B, L) ─embedding pos_emb─► pos (B, L, E) ─┴─ add ──► x (B, L, E)
    x ──MultiHeadAttention(x, x, x)──► a (B, L, E)                  self-attention
    x, a ──add──► h (B, L, E)                                        the residual
    h ──linear W_out, b_out──► logits (B, L, V)                      a read-out at every position
    logits, targets ──softmax cross-entropy──► loss (mean over the B·L tokens)

Every piece is a forward/backward pair (``models.layers`` and ``functional``); the attention is
``MultiHeadAttention``. Trained by ``mha_numpy.train``.

With ``block="post"`` or ``"pre"`` the attention + residual is replaced by a full Transformer block
(``models.block.Block``: attention, residual, LayerNorm, feed-forward with GELU, residual, LayerNorm; post- or
pre-norm), the same ``MultiHeadAttention`` inside:

    x ──Block──► h (B, L, E)                 params named as in BERT: 'block.attention.self.query.weight', ...
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import as_generator, as_int
from ..attention import MHACache, MultiHeadAttention
from .bert_layer import BERT_NAMES
from .block import Block
from .layers import (
    add_backward,
    add_forward,
    check_ids,
    embedding_backward,
    embedding_forward,
    softmax_cross_entropy_backward,
    softmax_cross_entropy_forward,
)

# --------------------------------------------------------------------------- the model


@dataclass
class ModelCache:
    """Intermediates of ``TinyAttentionModel.forward``; ``attention.attn_weights`` is (B, H, L, L)."""

    x: np.ndarray  # (B, L, E) token + position embedding, the attention's input
    attention: MHACache
    _caches: dict

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, L, L) attention weights after softmax: row i = where position i reads from."""
        return self.attention.attn_weights


class TinyAttentionModel:
    """Embeddings, one self-attention layer with a residual, a read-out to the vocabulary.

    vocab_size V, max_length L (rows of the position table), embed_dim E, num_heads H.
    ``params`` holds tok_emb (V, E), pos_emb (L, E), the attention's W_q ... b_o (the same arrays
    as ``mha.params``), W_out (V, E) and b_out (V,). Optimizers update them in place.
    Initialization as in torch: embeddings N(0, 1), read-out U(±1/sqrt(E)), attention as
    ``MultiHeadAttention``. ``block``: None (as above) or "post" / "pre": a full Transformer block, whose
    parameters are named as in BERT under 'block.' (FFN inner size 4E, LayerNorm eps 1e-5, no dropout).
    """

    def __init__(
        self,
        vocab_size: int,
        max_length: int,
        embed_dim: int = 32,
        num_heads: int = 1,
        bias: bool = True,
        dtype=np.float64,
        rng: int | np.random.Generator | None = None,
        block: str | None = None,
    ) -> None:
        if block not in (None, "post", "pre") or (block and not bias):
            raise ValueError(f"block must be None, 'post' or 'pre' (and needs bias=True), got {block!r}, bias={bias}")
        vocab_size, max_length = (
            as_int(vocab_size, "vocab_size", minimum=1),
            as_int(max_length, "max_length", minimum=1),
        )
        rng = as_generator(rng)
        self.mha = MultiHeadAttention(embed_dim, num_heads, bias=bias, dtype=dtype, rng=rng)
        self.vocab_size, self.max_length, self.dtype = vocab_size, max_length, self.mha.dtype
        E, bound = embed_dim, 1 / np.sqrt(embed_dim)
        self.params: dict[str, np.ndarray] = {
            "tok_emb": rng.standard_normal((vocab_size, E)).astype(dtype),
            "pos_emb": rng.standard_normal((max_length, E)).astype(dtype),
            **(self.mha.params if block is None else _block_params(self.mha, rng)),
            "W_out": rng.uniform(-bound, bound, (vocab_size, E)).astype(dtype),
            "b_out": rng.uniform(-bound, bound, vocab_size).astype(dtype),
        }
        self.block = None
        if block is not None:  # self.mha now holds the arrays of params['block.attention.self.query.weight'], ...
            self.block = Block(self.mha, self.params, BERT_NAMES, "block.", norm_position=block, norm="layer_norm",
                               eps=1e-5, ffn="gelu")  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"TinyAttentionModel(vocab_size={self.vocab_size}, max_length={self.max_length}, "
            f"embed_dim={self.mha.embed_dim}, num_heads={self.mha.num_heads}, dtype={self.dtype.name})"
        )

    def forward(self, tokens: np.ndarray) -> tuple[np.ndarray, ModelCache]:
        """tokens (B, L) integers in [0, V), L <= max_length -> logits (B, L, V), cache."""
        tokens = check_ids(tokens, "tokens", self.vocab_size)
        if tokens.ndim != 2 or not 0 < tokens.shape[1] <= self.max_length:
            raise ValueError(f"tokens must have shape (B, L) with 0 < L <= {self.max_length}, got {tokens.shape}")
        P = self.params
        B, L = tokens.shape
        positions = np.broadcast_to(np.arange(L), (B, L))  # (B, L): 0, 1, ..., L-1 in every row

        tok, c_tok = embedding_forward(tokens, P["tok_emb"])  # F1: (B, L, E)
        pos, c_pos = embedding_forward(positions, P["pos_emb"])  # F2: (B, L, E)
        x, _ = add_forward(tok, pos)  # F3: (B, L, E)
        if self.block is None:
            a, c_att = self.mha.forward(x, x, x)  # F4: (B, L, E) self-attention: x is query, key and value
            h, c_blk = add_forward(x, a)  # F5: (B, L, E) the residual
        else:
            h, c_blk = self.block.forward(x, None)  # F4, F5: (B, L, E) a full Transformer block
            c_att = c_blk.attention
        logits, c_out = F.linear_forward(h, P["W_out"], P["b_out"])  # F6: (B, L, V) the read-out
        return logits, ModelCache(x=x, attention=c_att, _caches=dict(tok=c_tok, pos=c_pos, out=c_out, block=c_blk))

    __call__ = forward

    def backward(self, d_logits: np.ndarray, cache: ModelCache) -> dict[str, np.ndarray]:
        """d_logits (B, L, V) -> one gradient per ``params`` key, with that parameter's shape."""
        c = cache._caches
        g: dict[str, np.ndarray] = {}
        d_h, g["W_out"], g["b_out"] = F.linear_backward(d_logits, c["out"])  # ← F6: (B, L, E)
        if self.block is None:
            d_x_skip, d_a = add_backward(d_h)  # ← F5: (B, L, E) each, the residual copies the gradient
            ga = self.mha.backward(d_a, cache.attention)  # ← F4: "query", "key", "value" (B, L, E), W_q ...
            # x fed four paths (F5's skip, F4's query, key and value); its gradient is their sum
            d_x = d_x_skip + ga["query"] + ga["key"] + ga["value"]  # (B, L, E)
            g.update({name: ga[name] for name in self.mha.params})
        else:
            d_x, g_block = self.block.backward(d_h, c["block"])  # ← F5, F4: (B, L, E), the block's 16 tensors
            g.update(g_block)
        d_tok, d_pos = add_backward(d_x)  # ← F3: (B, L, E) each
        g["tok_emb"] = embedding_backward(d_tok, c["tok"])  # ← F1: (V, E)
        g["pos_emb"] = embedding_backward(d_pos, c["pos"])  # ← F2: (L, E), summed over the batch
        return {name: g[name] for name in self.params}  # same order as params

    def loss_and_grads(self, tokens: np.ndarray, targets: np.ndarray):
        """One forward and backward: -> (loss, logits (B, L, V), grads dict, cache)."""
        logits, cache = self.forward(tokens)
        loss, c_loss = softmax_cross_entropy_forward(logits, targets)
        d_logits = softmax_cross_entropy_backward(1.0, c_loss)  # (B, L, V)
        return loss, logits, self.backward(d_logits, cache), cache


def _block_params(mha: MultiHeadAttention, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A Transformer block's parameters under BERT's names: the attention from ``mha``'s initialisation,
    LayerNorms 1 / 0, the feed-forward as torch.nn.Linear initialises (U(±1/sqrt(fan_in)))."""
    E, dtype = mha.embed_dim, mha.dtype
    out = {"block." + name: mha.params[role] for role, name in BERT_NAMES.items() if role in mha.params}
    for role in ("norm1", "norm2"):
        out[f"block.{BERT_NAMES[role + '.weight']}"] = np.ones(E, dtype)
        out[f"block.{BERT_NAMES[role + '.bias']}"] = np.zeros(E, dtype)
    for role, shape, fan_in in zip(("W_1", "b_1", "W_2", "b_2"), ((4 * E, E), (4 * E,), (E, 4 * E), (E,)),
                                   (E, E, 4 * E, 4 * E)):  # fmt: skip
        out["block." + BERT_NAMES[role]] = rng.uniform(-(fan_in**-0.5), fan_in**-0.5, shape).astype(dtype)
    return out
