"""A Llama-style decoder in pure NumPy: every layer is the generic ``Block`` configured as Llama's.

    input_ids (B, L) ──embed_tokens──► x (B, L, E)                                   F1
    for each of the N layers (a Block: pre-norm, RMSNorm, SwiGLU, no biases):        F2
        x = x + attention(rms_norm(x))     causal, RoPE, H query heads on Hkv key/value heads
        x = x + swiglu(rms_norm(x))
    last_hidden_state = rms_norm(x)        the final norm                            F3

The parameters are named as in a transformers ``LlamaModel`` state dict (``embed_tokens.weight``,
``layers.{i}.self_attn.q_proj.weight``, ..., ``layers.{i}.mlp.gate_proj.weight``, ..., ``norm.weight``): the
layer's part is the table ``LLAMA_NAMES``, not code. ``forward`` takes Hugging Face's ``attention_mask``
(1 = keep) and converts it at the edge; ``kv_caches`` (one ``KVCache`` per layer) decodes token by token.
Import from transformers and the cross-check against ``LlamaModel``: ``mha_numpy.interop.llama_model``.

    model = DecoderModel.random(DecoderConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, intermediate_size=24))
    out, cache = model.forward(input_ids)                 # out.last_hidden_state (B, L, E)
    grads = model.backward(d_last_hidden_state, cache)    # one gradient per params entry, by name
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import masks
from .._checks import as_float_dtype, as_generator, check_like
from ..attention import MultiHeadAttention
from ..kv_cache import KVCache
from . import layers as LY
from .block import Block, BlockCache

# the block's role -> the checkpoint name inside a Llama layer (PyTorch layout on both sides)
LLAMA_NAMES = {
    "W_q": "self_attn.q_proj.weight",
    "W_k": "self_attn.k_proj.weight",
    "W_v": "self_attn.v_proj.weight",
    "W_o": "self_attn.o_proj.weight",
    "W_gate": "mlp.gate_proj.weight",
    "W_up": "mlp.up_proj.weight",
    "W_down": "mlp.down_proj.weight",
    "norm1.weight": "input_layernorm.weight",
    "norm2.weight": "post_attention_layernorm.weight",
}


@dataclass(frozen=True)
class DecoderConfig:
    """The fields of a Hugging Face ``LlamaConfig`` the decoder uses (head_dim = hidden_size / heads)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    pad_token_id: int | None = None  # as nn.Embedding's padding_idx: that row of embed_tokens gets no gradient


def param_shapes(c: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of the decoder, by Hugging Face LlamaModel name and in its state dict's order, with its shape
    (W in PyTorch layout (out, in))."""
    E, I, d = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    Ekv = c.num_key_value_heads * d
    layer = {"W_q": (E, E), "W_k": (Ekv, E), "W_v": (Ekv, E), "W_o": (E, E), "W_gate": (I, E), "W_up": (I, E),
             "W_down": (E, I), "norm1.weight": (E,), "norm2.weight": (E,)}  # fmt: skip
    shapes = {"embed_tokens.weight": (c.vocab_size, E)}
    for i in range(c.num_hidden_layers):
        shapes.update({f"layers.{i}.{LLAMA_NAMES[role]}": shape for role, shape in layer.items()})
    shapes["norm.weight"] = (E,)
    return shapes


@dataclass
class DecoderOutput:
    """last_hidden_state (B, L, E), after the final norm; hidden_states: the embeddings and each layer's output
    (N + 1 arrays (B, L, E), before the final norm; transformers' tuple ends with the normed one instead);
    attentions: one (B, H, L, Lk) per layer, after softmax (Lk counts cached positions)."""

    last_hidden_state: np.ndarray
    hidden_states: tuple[np.ndarray, ...]
    attentions: tuple[np.ndarray, ...]


@dataclass
class DecoderCache:
    """What ``DecoderModel.backward`` needs: the embedding, layer and final-norm caches and the model that made it."""

    owner: object
    shape: tuple[int, int, int]  # (B, L, E) of last_hidden_state
    embedding: tuple
    layers: list[BlockCache]
    norm: tuple


class DecoderModel:
    """Token embeddings, ``config.num_hidden_layers`` Llama blocks, a final RMSNorm. Causal, no biases.

    ``weights`` maps LlamaModel state-dict names (``param_shapes``) to arrays; they are copied into ``params`` in
    ``dtype`` (float32 or float64), so updating ``params`` never touches the caller's arrays.
    """

    def __init__(self, config: DecoderConfig, weights: dict[str, np.ndarray], dtype=np.float64) -> None:
        dtype = as_float_dtype(dtype)
        c = config
        if c.hidden_size % c.num_attention_heads:
            raise ValueError(
                f"hidden_size={c.hidden_size} is not divisible by num_attention_heads={c.num_attention_heads}"
            )
        self.config, self.dtype = c, dtype
        self.params: dict[str, np.ndarray] = LY.checked_params(weights, param_shapes(c), dtype)
        self.layers = [self._layer(f"layers.{i}.") for i in range(c.num_hidden_layers)]
        self._token = object()  # identifies this model's caches

    def _layer(self, prefix: str) -> Block:
        c = self.config
        attention = MultiHeadAttention(c.hidden_size, c.num_attention_heads, bias=False, dtype=self.dtype, rng=0,
                                       num_kv_heads=c.num_key_value_heads, rope_theta=c.rope_theta)  # fmt: skip
        return Block(attention, self.params, LLAMA_NAMES, prefix, norm_position="pre", norm="rms_norm",
                     eps=c.rms_norm_eps, ffn="swiglu")  # fmt: skip

    @classmethod
    def random(cls, config: DecoderConfig, dtype=np.float64, rng=0, std: float = 0.02) -> DecoderModel:
        """Weights as transformers initialises a LlamaModel: N(0, std²) (its initializer_range), norms 1."""
        gen = as_generator(rng)
        weights = {n: np.ones(s) if n.endswith("norm.weight") else gen.normal(0.0, std, s)
                   for n, s in param_shapes(config).items()}  # fmt: skip
        return cls(config, weights, dtype=dtype)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"DecoderModel(layers={c.num_hidden_layers}, heads={c.num_attention_heads}, "
            f"kv_heads={c.num_key_value_heads}, hidden={c.hidden_size}, dtype={self.dtype.name})"
        )

    def __call__(self, input_ids, attention_mask=None, positions=None, kv_caches=None) -> DecoderOutput:
        """As ``forward``, the output only."""
        return self.forward(input_ids, attention_mask, positions, kv_caches)[0]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        positions: np.ndarray | None = None,
        kv_caches: list[KVCache] | None = None,
    ) -> tuple[DecoderOutput, DecoderCache]:
        """input_ids (B, L) ints -> DecoderOutput, cache.

        attention_mask: Hugging Face style (B, Lk), 1 = keep, 0 = padding, Lk = cached + L positions (default: all
        kept); combined with the causal mask. positions: RoPE positions (L,) or (B, L) (default cached + 0, 1, ...).
        kv_caches: one ``KVCache`` per layer, for decoding (forward only): each call appends its L tokens.
        """
        ids, mask = self._check_inputs(input_ids, attention_mask, kv_caches)
        P = self.params
        x, c_emb = LY.embedding_forward(ids, P["embed_tokens.weight"])  # F1: (B, L, E)
        hidden_states, attentions, layer_caches = [x], [], []
        for i, layer in enumerate(self.layers):
            kv = None if kv_caches is None else kv_caches[i]
            x, c = layer.forward(x, mask, positions=positions, kv_cache=kv)  # F2: (B, L, E), one per layer
            hidden_states.append(x)
            attentions.append(c.attention.attn_weights)  # (B, H, L, Lk)
            layer_caches.append(c)
        y, c_norm = LY.rms_norm_forward(x, P["norm.weight"], self.config.rms_norm_eps)  # F3: (B, L, E)
        out = DecoderOutput(y, tuple(hidden_states), tuple(attentions))
        return out, DecoderCache(self._token, y.shape, c_emb, layer_caches, c_norm)

    def backward(
        self, d_last_hidden_state: np.ndarray, cache: DecoderCache, return_hidden_grads: bool = False
    ) -> dict[str, np.ndarray]:
        """d_last_hidden_state (B, L, E) -> a dict: a gradient for every entry of ``params`` (same names, shapes,
        dtype), in ``params``' order.

        return_hidden_grads=True adds the gradients of ``hidden_states`` under "hidden_states.0" (the embeddings)
        ... "hidden_states.N", after the parameters (one return type either way).
        A forward with ``kv_caches`` has no backward (the attention refuses it: a cache is state).
        """
        if not isinstance(cache, DecoderCache) or cache.owner is not self._token:
            raise ValueError("cache must come from this model's forward (it was made by another model or is not one)")
        d = check_like(d_last_hidden_state, "d_last_hidden_state", cache.shape, self.dtype, "last_hidden_state")
        g: dict[str, np.ndarray] = {}
        d, g["norm.weight"] = LY.rms_norm_backward(d, cache.norm)  # ← F3: (B, L, E)
        d_hidden = [d]
        for layer, c in zip(reversed(self.layers), reversed(cache.layers)):
            d, g_layer = layer.backward(d, c)  # ← F2: (B, L, E)
            g.update(g_layer)
            d_hidden.append(d)
        g["embed_tokens.weight"] = LY.embedding_backward(d, cache.embedding)  # ← F1: scatter-add, (V, E)
        if self.config.pad_token_id is not None:
            g["embed_tokens.weight"][self.config.pad_token_id] = 0.0  # the padding row is frozen, as in torch
        grads = {name: g[name] for name in self.params}
        if return_hidden_grads:
            grads.update({f"hidden_states.{i}": d_h for i, d_h in enumerate(reversed(d_hidden))})
        return grads

    def _check_inputs(self, input_ids, attention_mask, kv_caches):
        """-> (ids (B, L), our mask: bool, True = may attend), or ValueError naming the argument (before arithmetic)."""
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or 0 in ids.shape:
            raise ValueError(f"input_ids must be a non-empty integer array (B, L), got shape {ids.shape}")
        ids = LY.check_ids(ids, "input_ids", self.config.vocab_size)
        B, L = ids.shape
        cached = 0
        if kv_caches is not None:
            if not isinstance(kv_caches, (list, tuple)) or len(kv_caches) != len(self.layers):
                raise ValueError(f"kv_caches must be a list of {len(self.layers)} KVCache (one per layer)")
            lengths = {len(kv) if isinstance(kv, KVCache) else -1 for kv in kv_caches}
            if len(lengths) != 1 or -1 in lengths:
                raise ValueError(f"kv_caches must be KVCache objects of one length, got lengths {sorted(lengths)}")
            cached = lengths.pop()
        causal = None if kv_caches is not None else masks.causal_mask(L)  # (L, L); a KV cache adds its own
        if attention_mask is None:
            return ids, causal
        if np.shape(attention_mask) != (B, cached + L):
            raise ValueError(
                f"attention_mask with shape {np.shape(attention_mask)} must be (B, cached + L) = {(B, cached + L)}"
            )
        padding = masks.from_hf_attention_mask(attention_mask)  # HF 1 = keep -> ours (B, 1, 1, Lk), True = attend
        return ids, masks.combine_masks(causal, padding)  # (B, 1, L, Lk)
