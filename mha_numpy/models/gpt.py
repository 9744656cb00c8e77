"""A small GPT for the capstone: a decoder-only language model over bytes, every gradient by hand.

    ids (B, L) ──DecoderModel──► h (B, L, E)       embeddings, N pre-norm blocks (causal attention with RoPE,
                                                   RMSNorm, SwiGLU), the final norm: models/decoder.py      F1
    logits = h W_headᵀ                 (B, L, V)   the LM head, untied from the embeddings                  F2
    loss = mean -log softmax(logits)[next id]      softmax_cross_entropy (models/layers.py)                 F3

The blocks are ``models/block.py``'s ``Block`` configured as Llama's (the decoder builds them); the head is the
``linear`` pair. ``params`` holds the decoder's arrays (by their Llama names) and ``lm_head.weight``: the same
arrays, so an optimizer that updates ``params`` in place updates the model. Training: ``mha_numpy.train_gpt``;
the command: ``python -m mha_numpy gpt``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import as_float_dtype, as_generator
from ..kv_cache import KVCache
from . import layers as LY
from .decoder import DecoderConfig, DecoderModel


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes: vocabulary V, context L (the longest sequence trained on), width E, N layers, H heads,
    the feed-forward's inner width I."""

    vocab_size: int = 256
    context: int = 128
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 352

    def decoder(self) -> DecoderConfig:
        return DecoderConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                             num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                             num_key_value_heads=self.num_heads, intermediate_size=self.intermediate_size)  # fmt: skip


class GPT:
    """``DecoderModel`` + an LM head; ``loss_and_grads`` is one training step's forward and backward."""

    def __init__(self, config: GPTConfig, dtype=np.float32, rng=0, std: float = 0.02) -> None:
        for name in ("vocab_size", "context", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            value = getattr(config, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"config.{name} must be a positive integer, got {value!r}")
        gen = as_generator(rng)
        self.config, self.dtype = config, as_float_dtype(dtype)
        self.decoder = DecoderModel.random(config.decoder(), dtype=self.dtype, rng=gen, std=std)
        head = gen.normal(0.0, std, (config.vocab_size, config.hidden_size)).astype(self.dtype)
        self.params: dict[str, np.ndarray] = {**self.decoder.params, "lm_head.weight": head}  # the same arrays

    def __repr__(self) -> str:
        c = self.config
        n = sum(p.size for p in self.params.values())
        return (
            f"GPT(layers={c.num_layers}, heads={c.num_heads}, hidden={c.hidden_size}, context={c.context}, params={n})"
        )

    def logits(self, ids: np.ndarray, kv_caches=None) -> tuple[np.ndarray, tuple]:
        """ids (B, L) -> logits (B, L, V), cache."""
        out, c_dec = self.decoder.forward(ids, kv_caches=kv_caches)  # F1: (B, L, E)
        logits, c_head = F.linear_forward(out.last_hidden_state, self.params["lm_head.weight"])  # F2: (B, L, V)
        return logits, (c_dec, c_head)

    def loss(self, ids: np.ndarray) -> float:
        """ids (B, L + 1): the mean cross-entropy (nats) of predicting ids[:, 1:] from ids[:, :-1]; no gradient."""
        x, y = self._inputs(ids)
        return LY.softmax_cross_entropy_forward(self.logits(x)[0], y)[0]

    def loss_and_grads(self, ids: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """ids (B, L + 1) -> (loss, a gradient for every entry of ``params``, by name)."""
        x, y = self._inputs(ids)
        logits, (c_dec, c_head) = self.logits(x)  # F1, F2
        loss, c_loss = LY.softmax_cross_entropy_forward(logits, y)  # F3
        d_logits = LY.softmax_cross_entropy_backward(1.0, c_loss)  # ← F3: (B, L, V)
        d_h, d_head, _ = F.linear_backward(d_logits, c_head)  # ← F2: (B, L, E), (V, E)
        grads = self.decoder.backward(d_h, c_dec)  # ← F1: every decoder weight
        grads["lm_head.weight"] = d_head
        return loss, {name: grads[name] for name in self.params}

    def _inputs(self, ids) -> tuple[np.ndarray, np.ndarray]:
        ids = LY.check_ids(ids, "ids", self.config.vocab_size)
        if ids.ndim != 2 or ids.shape[1] < 2 or ids.shape[1] > self.config.context + 1:
            raise ValueError(f"ids must be (B, L + 1) with 1 <= L <= context={self.config.context}, got {ids.shape}")
        return ids[:, :-1], ids[:, 1:]  # (B, L) inputs, (B, L) the next token of each

    def generate(self, prompt: np.ndarray, n: int, temperature: float = 1.0, rng=0) -> np.ndarray:
        """prompt (P,) ids, P >= 1 -> (P + n,) ids: n tokens sampled one at a time with a KV cache per layer.

        The context is capped at ``config.context`` positions (RoPE was trained on no more): when the cache is
        full it is rebuilt from the last context // 2 tokens."""
        prompt = LY.check_ids(np.asarray(prompt), "prompt", self.config.vocab_size)
        if prompt.ndim != 1 or prompt.size == 0:
            raise ValueError(f"prompt must be a non-empty 1-D id array, got shape {prompt.shape}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        gen, L = as_generator(rng), self.config.context
        ids = list(prompt[-L:])
        out = list(prompt)
        caches, feed = None, ids
        for _ in range(n):
            if caches is None or len(caches[0]) + len(feed) > L:
                caches, feed = [KVCache() for _ in range(self.config.num_layers)], ids[-(L // 2) :]
            logits, _ = self.logits(np.asarray(feed)[None, :], kv_caches=caches)  # (1, len(feed), V)
            z = logits[0, -1].astype(np.float64) / temperature  # (V,)
            p = np.exp(z - z.max())
            nxt = int(gen.choice(len(p), p=p / p.sum()))
            out.append(nxt)
            ids.append(nxt)
            feed = [nxt]
        return np.asarray(out, dtype=np.int64)
