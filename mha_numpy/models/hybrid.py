"""A hybrid decoder: softmax attention and linear-attention layers stacked in the order of a ``layer_types`` list, as
Qwen3-Next's config writes it (three Gated DeltaNet layers, then one attention layer, ...), every layer the one
generic ``Block`` with its token mixer swapped (``models.mixers``). Forward and backward by hand through the whole
stack; decoding token by token with each layer's own cache.

    input_ids (B, L) ──embed_tokens──► x (B, L, E)                                   F1
    for each layer i, of kind layer_types[i] (a Block: pre-norm, RMSNorm, SwiGLU):   F2
        x = x + mixer_i(rms_norm(x))       "full_attention": causal softmax attention, RoPE, GQA
                                           "linear_attention": Gated DeltaNet (recurrent.qwen3_next)
                                           "mamba": Mamba-2's mixer (recurrent.mamba2)
        x = x + swiglu(rms_norm(x))
    h = rms_norm(x)                        the final norm                            F3
    logits = h W_lmᵀ                       the LM head, (B, L, V)                    F4

A layer kind is one entry of ``LAYER_KINDS``: how to build its mixer from the config, and its parameters' names
inside a layer (Qwen3-Next's: ``layers.{i}.self_attn.q_proj.weight``, ``layers.{i}.linear_attn.in_proj_qkvz.weight``,
...; Bamba's for Mamba-2: ``layers.{i}.mamba.in_proj.weight``, ...). The kind's decoding cache is its mixer's: a
``KVCache`` for attention (it grows by one key and value a token), a ``RecurrentCache`` for a recurrent layer (the
conv window and the state matrix, a fixed size).

Spelling. Qwen3-Next's ``layer_types`` says "linear_attention" (Gated DeltaNet) and "full_attention". transformers
5 spells every linear layer "linear_attention" (Jamba's, Bamba's and Nemotron-H's Mamba layers too, which their
configs once called "mamba": ``configuration_utils._LEGACY_LAYER_TYPE_REMAP``); one stack holding two linear kinds
needs two names, so here "linear_attention" is Qwen3-Next's Gated DeltaNet and a Mamba-2 layer keeps the legacy
"mamba". What is not Qwen3-Next's: the norms are Llama's (w·x̂, not 1 + w), the MLP a dense SwiGLU (not its
mixture of experts), and the attention Llama's (full RoPE, no output gate, no QK-norm).

    model = HybridModel.random(HybridConfig(vocab_size=12, hidden_size=16, intermediate_size=32,
                                            layer_types=("linear_attention", "full_attention")))
    logits, cache = model.forward(input_ids)              # (B, L, V)
    grads = model.backward(d_logits, cache)               # one gradient per params entry, by name
    caches = model.new_caches()                           # decoding: one cache a layer, each of its kind
    logits_t, _ = model.forward(input_ids[:, t : t + 1], caches=caches)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import functional as F
from .. import masks
from .._checks import as_float_dtype, as_generator, as_int, check_like
from ..attention import MultiHeadAttention
from ..recurrent.mamba2 import Mamba2Mixer
from ..recurrent.qwen3_next import GatedDeltaNet
from . import layers as LY
from .block import Block, BlockCache
from .mixers import AttentionMixer, RecurrentMixer, TokenMixer

# the block's norm and feed-forward roles -> names inside a layer (Qwen3-Next's and Llama's)
BLOCK_NAMES = {
    "W_gate": "mlp.gate_proj.weight",
    "W_up": "mlp.up_proj.weight",
    "W_down": "mlp.down_proj.weight",
    "norm1.weight": "input_layernorm.weight",
    "norm2.weight": "post_attention_layernorm.weight",
}


@dataclass(frozen=True)
class HybridConfig:
    """The fields of a transformers ``Qwen3NextConfig`` the hybrid uses (same names), the layers from ``layer_types``.

    head_dim None: hidden_size / num_attention_heads. The linear_* fields size Gated DeltaNet (Qwen3-Next's names),
    the mamba_* fields Mamba-2 (Bamba's names; mamba_d_head None: mamba_expand · hidden_size / mamba_n_heads, as
    Bamba's "auto"). chunk_size: the recurrent cores' (their outputs do not depend on it, to rounding).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int | None = None
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 2
    linear_key_head_dim: int = 8
    linear_value_head_dim: int = 8
    linear_conv_kernel_dim: int = 4
    mamba_n_heads: int = 2
    mamba_d_head: int | None = None
    mamba_expand: int = 2
    mamba_d_state: int = 8
    mamba_n_groups: int = 1
    mamba_d_conv: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    chunk_size: int = 64

    def __post_init__(self) -> None:
        types = self.layer_types
        if isinstance(types, str) or not isinstance(types, (list, tuple)) or not types:
            raise ValueError(f"layer_types must be a non-empty list of {sorted(LAYER_KINDS)}, got {types!r:.80}")
        for i, kind in enumerate(types):
            if kind not in LAYER_KINDS:
                raise ValueError(
                    f"layer_types[{i}] = {kind!r} is not a layer kind; the kinds are {sorted(LAYER_KINDS)}"
                )
        object.__setattr__(self, "layer_types", tuple(types))
        for name in ("vocab_size", "hidden_size", "intermediate_size"):
            as_int(getattr(self, name), name, minimum=1)

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)


# --------------------------------------------------------------------------- the layer kinds: one entry each


@dataclass(frozen=True)
class LayerKind:
    """One kind of layer: ``build(config, dtype, rng)`` -> its token mixer (random weights from ``rng``, which the
    model then points at its own arrays); ``names``: the mixer's roles -> names inside a layer; ``causal_mask``:
    whether the mixer takes the stack's causal mask (attention) or is causal by itself (a recurrence)."""

    build: Callable[[HybridConfig, np.dtype, np.random.Generator], TokenMixer]
    names: dict[str, str]
    causal_mask: bool = False


def _full_attention(c: HybridConfig, dtype, rng) -> TokenMixer:
    """Llama's attention: no biases, GQA, RoPE (transformers' LlamaAttention)."""
    options = {} if c.head_dim is None else {"head_dim": c.head_dim}
    return AttentionMixer(MultiHeadAttention(c.hidden_size, c.num_attention_heads, bias=False, dtype=dtype, rng=rng,
                                             num_kv_heads=c.num_key_value_heads, rope_theta=c.rope_theta,
                                             **options))  # fmt: skip


def _gated_deltanet(c: HybridConfig, dtype, rng) -> TokenMixer:
    """Qwen3-Next's Gated DeltaNet (``recurrent.qwen3_next.GatedDeltaNet``)."""
    return RecurrentMixer(GatedDeltaNet(c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads,
                                        c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim,
                                        c.rms_norm_eps, rng=rng, dtype=dtype, chunk_size=c.chunk_size))  # fmt: skip


def _mamba2(c: HybridConfig, dtype, rng) -> TokenMixer:
    """Mamba-2's layer (``recurrent.mamba2.Mamba2Mixer``, transformers' ``Mamba2Mixer``)."""
    d_head = c.mamba_d_head or c.mamba_expand * c.hidden_size // c.mamba_n_heads
    return RecurrentMixer(Mamba2Mixer(c.hidden_size, c.mamba_n_heads, d_head, c.mamba_d_state, c.mamba_n_groups,
                                      c.mamba_d_conv, c.rms_norm_eps, rng=rng, dtype=dtype,
                                      chunk_size=c.chunk_size))  # fmt: skip


LAYER_KINDS: dict[str, LayerKind] = {
    "full_attention": LayerKind(
        _full_attention,
        {
            "W_q": "self_attn.q_proj.weight",
            "W_k": "self_attn.k_proj.weight",
            "W_v": "self_attn.v_proj.weight",
            "W_o": "self_attn.o_proj.weight",
        },  # fmt: skip
        causal_mask=True,
    ),
    "linear_attention": LayerKind(
        _gated_deltanet,
        {
            "W_qkvz": "linear_attn.in_proj_qkvz.weight",
            "W_ba": "linear_attn.in_proj_ba.weight",
            "conv_weight": "linear_attn.conv1d.weight",
            "dt_bias": "linear_attn.dt_bias",
            "A_log": "linear_attn.A_log",
            "norm_weight": "linear_attn.norm.weight",
            "W_out": "linear_attn.out_proj.weight",
        },  # fmt: skip
    ),
    "mamba": LayerKind(
        _mamba2,
        {
            "W_in": "mamba.in_proj.weight",
            "conv_weight": "mamba.conv1d.weight",
            "conv_bias": "mamba.conv1d.bias",
            "dt_bias": "mamba.dt_bias",
            "A_log": "mamba.A_log",
            "D": "mamba.D",
            "norm_weight": "mamba.norm.weight",
            "W_out": "mamba.out_proj.weight",
        },  # fmt: skip
    ),
}
"""layer type -> LayerKind (names as Qwen3-Next's and Bamba's checkpoints). conv1d.weight is ours (C, K), theirs
(C, 1, K)."""


def _mixers(c: HybridConfig, dtype, rng=0) -> list[TokenMixer]:
    gen = as_generator(rng)
    return [LAYER_KINDS[kind].build(c, dtype, gen) for kind in c.layer_types]


def _shapes(c: HybridConfig, mixers: list[TokenMixer]) -> dict[str, tuple[int, ...]]:
    E, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
    block = {"W_gate": (I, E), "W_up": (I, E), "W_down": (E, I), "norm1.weight": (E,), "norm2.weight": (E,)}
    shapes = {"embed_tokens.weight": (V, E)}
    for i, (kind, mixer) in enumerate(zip(c.layer_types, mixers)):
        names = LAYER_KINDS[kind].names
        shapes.update({f"layers.{i}.{names[role]}": p.shape for role, p in mixer.params.items()})
        shapes.update({f"layers.{i}.{BLOCK_NAMES[role]}": s for role, s in block.items()})
    shapes["norm.weight"] = (E,)
    shapes["lm_head.weight"] = (V, E)
    return shapes


def param_shapes(config: HybridConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of the hybrid by name (Qwen3-Next's layout of names, ``LAYER_KINDS``), with its shape."""
    return _shapes(config, _mixers(config, np.float64))


# --------------------------------------------------------------------------- the model


@dataclass
class HybridCache:
    """What ``HybridModel.backward`` needs: the embedding, layer, final-norm and head caches, the model that made it."""

    owner: object
    shape: tuple[int, int, int]  # (B, L, V) of the logits
    embedding: tuple
    layers: list[BlockCache]
    norm: tuple
    head: tuple
    decoding: bool = False
    hidden: list = field(default_factory=list)  # the embeddings and every layer's output, (B, L, E) each


class HybridModel:
    """Embeddings, one ``Block`` a ``config.layer_types`` entry (its mixer of that kind), a final RMSNorm, an LM head.

    ``weights`` maps the names of ``param_shapes(config)`` to arrays, copied into ``params`` in ``dtype``.
    """

    def __init__(self, config: HybridConfig, weights: dict[str, np.ndarray], dtype=np.float64) -> None:
        if not isinstance(config, HybridConfig):
            raise ValueError(f"config must be a HybridConfig, got {type(config).__name__}")
        dtype = as_float_dtype(dtype)
        self.config, self.dtype = config, dtype
        mixers = _mixers(config, dtype)
        self.params: dict[str, np.ndarray] = LY.checked_params(weights, _shapes(config, mixers), dtype)
        self.layers = [
            Block(mixer, self.params, {**LAYER_KINDS[kind].names, **BLOCK_NAMES}, f"layers.{i}.",
                  norm_position="pre", norm="rms_norm", eps=config.rms_norm_eps, ffn="swiglu")
            for i, (kind, mixer) in enumerate(zip(config.layer_types, mixers))
        ]  # fmt: skip
        self._token = object()  # identifies this model's caches

    @classmethod
    def random(cls, config: HybridConfig, dtype=np.float64, rng=0, std: float = 0.02) -> HybridModel:
        """Embeddings, MLPs and the head N(0, std²), norms 1, each mixer its own module's start (``rng``)."""
        gen = as_generator(rng)
        mixers = _mixers(config, np.float64, gen)
        weights = {n: np.ones(s) if n.endswith("norm.weight") or n.endswith("layernorm.weight") else
                   gen.normal(0.0, std, s) for n, s in _shapes(config, mixers).items()}  # fmt: skip
        for i, (kind, mixer) in enumerate(zip(config.layer_types, mixers)):
            weights.update({f"layers.{i}.{LAYER_KINDS[kind].names[r]}": p for r, p in mixer.params.items()})
        return cls(config, weights, dtype=dtype)

    def __repr__(self) -> str:
        c = self.config
        return f"HybridModel(layer_types={list(c.layer_types)}, hidden={c.hidden_size}, dtype={self.dtype.name})"

    def new_caches(self) -> list:
        """Empty decoding caches, one a layer, each of its layer's kind (a KVCache, a RecurrentCache)."""
        return [layer.mixer.new_cache() for layer in self.layers]

    def __call__(self, input_ids, caches=None) -> np.ndarray:
        """As ``forward``, the logits only."""
        return self.forward(input_ids, caches)[0]

    def forward(self, input_ids: np.ndarray, caches: list | None = None) -> tuple[np.ndarray, HybridCache]:
        """input_ids (B, L) ints -> logits (B, L, V), cache.

        caches: ``new_caches()`` (or the caches of earlier calls), for decoding (forward only): each call continues
        the text by its L tokens, every layer reading and updating its own cache.
        """
        ids = self._check_inputs(input_ids, caches)
        P, L = self.params, ids.shape[1]
        causal = masks.causal_mask(L) if caches is None else None  # (L, L); a KV cache adds its own
        x, c_emb = LY.embedding_forward(ids, P["embed_tokens.weight"])  # F1: (B, L, E)
        hidden, layer_caches = [x], []
        for i, (kind, layer) in enumerate(zip(self.config.layer_types, self.layers)):
            mask = causal if LAYER_KINDS[kind].causal_mask else None
            x, c = layer.forward(x, mask, kv_cache=None if caches is None else caches[i])  # F2: (B, L, E)
            hidden.append(x)
            layer_caches.append(c)
        h, c_norm = LY.rms_norm_forward(x, P["norm.weight"], self.config.rms_norm_eps)  # F3: (B, L, E)
        logits, c_head = F.linear_forward(h, P["lm_head.weight"])  # F4: (B, L, E) @ (E, V) -> (B, L, V)
        cache = HybridCache(self._token, logits.shape, c_emb, layer_caches, c_norm, c_head, caches is not None, hidden)
        return logits, cache

    def backward(self, d_logits: np.ndarray, cache: HybridCache) -> dict[str, np.ndarray]:
        """d_logits (B, L, V) -> a gradient for every entry of ``params`` (same names, shapes, dtype, order)."""
        if not isinstance(cache, HybridCache) or cache.owner is not self._token:
            raise ValueError("cache must come from this model's forward (it was made by another model or is not one)")
        if cache.decoding:
            raise ValueError("cache comes from a forward with caches: decoding is forward only (a cache is state)")
        d = check_like(d_logits, "d_logits", cache.shape, self.dtype, "logits")
        g: dict[str, np.ndarray] = {}
        d, g["lm_head.weight"], _ = F.linear_backward(d, cache.head)  # ← F4: (B, L, V) @ (V, E) -> (B, L, E)
        d, g["norm.weight"] = LY.rms_norm_backward(d, cache.norm)  # ← F3: (B, L, E)
        for layer, c in zip(reversed(self.layers), reversed(cache.layers)):
            d, g_layer = layer.backward(d, c)  # ← F2: (B, L, E)
            g.update(g_layer)
        g["embed_tokens.weight"] = LY.embedding_backward(d, cache.embedding)  # ← F1: scatter-add, (V, E)
        return {name: g[name] for name in self.params}

    def loss_and_grads(self, input_ids, targets, positions=slice(None)) -> tuple[float, np.ndarray, dict]:
        """Mean cross-entropy of ``logits[:, positions]`` against ``targets`` (B, len) ints, and its gradients:
        -> (loss, logits (B, L, V), grads by name). ``positions`` a slice of the sequence (default all)."""
        logits, cache = self.forward(input_ids)
        loss, c_loss = LY.softmax_cross_entropy_forward(logits[:, positions], targets)
        d_logits = np.zeros_like(logits)
        d_logits[:, positions] = LY.softmax_cross_entropy_backward(1.0, c_loss)  # the other positions: no loss
        return loss, logits, self.backward(d_logits, cache)

    def generate(self, prompt: np.ndarray, num_tokens: int) -> np.ndarray:
        """Greedy decoding with every layer's cache: the prompt (B, P) in one call, then one token a call
        -> the ``num_tokens`` new tokens (B, num_tokens)."""
        num_tokens = as_int(num_tokens, "num_tokens", minimum=0)
        caches = self.new_caches()
        logits = self.forward(prompt, caches=caches)[0]  # (B, P, V): the prefill
        out = []
        for _ in range(num_tokens):
            token = logits[:, -1].argmax(axis=-1)[:, None]  # (B, 1): the most likely next token
            out.append(token)
            logits = self.forward(token, caches=caches)[0]  # (B, 1, V)
        return np.concatenate(out, axis=1) if out else np.zeros((np.shape(prompt)[0], 0), np.int64)

    def _check_inputs(self, input_ids, caches) -> np.ndarray:
        """-> ids (B, L), or ValueError naming the argument (before any arithmetic)."""
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or 0 in ids.shape:
            raise ValueError(f"input_ids must be a non-empty integer array (B, L), got shape {ids.shape}")
        ids = LY.check_ids(ids, "input_ids", self.config.vocab_size)
        if caches is None:
            return ids
        if not isinstance(caches, (list, tuple)) or len(caches) != len(self.layers):
            raise ValueError(f"caches must be a list of {len(self.layers)} caches (one a layer, model.new_caches())")
        for i, (kind, layer, cache) in enumerate(zip(self.config.layer_types, self.layers, caches)):
            if not layer.mixer.accepts(cache):
                want = layer.mixer.describe_cache(layer.mixer.new_cache())
                raise ValueError(f"caches[{i}] is a {layer.mixer.describe_cache(cache)}, but layer {i} is {kind!r}: "
                                 f"it needs a {want} (model.new_caches())")  # fmt: skip
        for i, (layer, cache) in enumerate(zip(self.layers, caches)):
            held = layer.mixer.cache_batch(cache)
            if held not in (None, ids.shape[0]):
                raise ValueError(f"caches[{i}] holds a batch of {held} sequences, input_ids has {ids.shape[0]}")
        lengths = {len(cache) for cache in caches}
        if len(lengths) != 1:
            raise ValueError(f"caches must all hold the same number of tokens, got lengths {[len(c) for c in caches]}")
        return ids
