"""Token mixers: what the generic ``Block`` calls in its first sublayer, one protocol for softmax attention and the
recurrent layers (Gated DeltaNet, Kimi Delta Attention, Mamba-2), so a hybrid stack is one block class
with the mixer swapped ("one module, interchangeable kernels").

    mixer.params                    the module's own dict by role (the block points it at the model's arrays)
    mixer.embed_dim                 E, the width it reads and writes
    mixer.forward(x, mask=, training=, dropout_mask=, positions=, cache=)   x (B, L, E) -> (y (B, L, E), c)
    mixer.backward(d_y, c)          -> (d_x (B, L, E), gradients by role)
    mixer.new_cache()               an empty decoding cache of its kind (``cache_types``: the kinds it takes)

``AttentionMixer`` wraps a ``MultiHeadAttention`` (self-attention: q = k = v = x, so d_x is the sum of the three
paths); its decoding cache is the ``KVCache``, which grows by one key and value a token. ``RecurrentMixer`` wraps a
layer of ``mha_numpy.recurrent`` (Gated DeltaNet, Kimi Delta Attention, Mamba-2's ``Mamba2Mixer``:
``forward(x, state=) -> ((y, state), c)``, ``backward(d_y, c) -> {"x", ...}``);
its decoding cache is a ``RecurrentCache``, which holds the layer's state (the conv's last K-1 inputs and the matrix
S) and stays the same size however long the text. Both caches are forward only, as the KV cache always was: a
forward that used one has no backward (a cache is state).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..attention import MultiHeadAttention


class TokenMixer:
    """The protocol (module docstring); ``Block`` takes a ``MultiHeadAttention`` or one of these."""

    params: dict[str, np.ndarray]
    cache_types: tuple[type, ...] = ()

    @property
    def embed_dim(self) -> int:
        raise NotImplementedError

    def forward(self, x, *, mask=None, training=False, dropout_mask=None, positions=None, cache=None):
        raise NotImplementedError

    def backward(self, d_y, c):
        raise NotImplementedError

    def new_cache(self):
        raise NotImplementedError

    def accepts(self, cache) -> bool:
        """Whether ``cache`` is a decoding cache of this mixer's kind."""
        return isinstance(cache, self.cache_types)

    def describe_cache(self, cache) -> str:
        """What ``cache`` is, for a message that refuses it."""
        return type(cache).__name__

    def cache_batch(self, cache) -> int | None:
        """The number of sequences ``cache`` holds (None while empty)."""
        return None


class AttentionMixer(TokenMixer):
    """Softmax self-attention as a token mixer: a ``MultiHeadAttention`` called with q = k = v."""

    def __init__(self, attention: MultiHeadAttention) -> None:
        if not isinstance(attention, MultiHeadAttention):
            raise ValueError(f"attention must be a MultiHeadAttention, got {type(attention).__name__}")
        self.attention = attention
        self.params = attention.params  # the same dict: the block's arrays reach the module
        self.cache_types = (type(attention.new_kv_cache()),)

    def __repr__(self) -> str:
        return repr(self.attention)

    @property
    def embed_dim(self) -> int:
        return self.attention.embed_dim

    def forward(self, x, *, mask=None, training=False, dropout_mask=None, positions=None, cache=None):
        """x (B, L, E) -> (y (B, L, E), MHACache); ``cache`` a KVCache (decoding) or None."""
        return self.attention.forward(x, x, x, mask=mask, training=training, dropout_mask=dropout_mask,
                                      positions=positions, kv_cache=cache)  # fmt: skip

    def backward(self, d_y, c):
        """-> (d_x = d_query + d_key + d_value (self-attention: x fed all three), gradients by role)."""
        g = self.attention.backward(d_y, c)
        return g["query"] + g["key"] + g["value"], {role: g[role] for role in self.params}

    def new_cache(self):
        return self.attention.new_kv_cache()

    def cache_batch(self, cache) -> int | None:
        keys = getattr(cache, "keys", None)  # (B, Hkv, length, d), or None while empty
        return None if keys is None else int(keys.shape[0])


class RecurrentCache:
    """A recurrent layer's decoding cache: its state after the tokens so far (None before the first call, which
    starts from zeros), replaced by each call; ``length`` counts the tokens. Its size does not grow with them."""

    def __init__(self) -> None:
        self.state = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"RecurrentCache(length={self.length}, nbytes={self.nbytes})"

    @property
    def nbytes(self) -> int:
        """Bytes of the state: the conv's window and the recurrent matrix (0 before the first call)."""
        return 0 if self.state is None else int(sum(np.asarray(a).nbytes for a in vars(self.state).values()))


@dataclass
class RecurrentMixerCache:
    """What ``RecurrentMixer.backward`` needs: the layer's own cache, and whether the call decoded (no backward)."""

    layer: object
    decoding: bool


class RecurrentMixer(TokenMixer):
    """A recurrent layer (``recurrent.qwen3_next.GatedDeltaNet``, ``recurrent.kimi.KimiDeltaAttention``,
    ``recurrent.mamba2.Mamba2Mixer``, or any ``RecurrentLayer``: ``hidden_size``, ``params``, ``PARAM_NAMES``,
    ``zero_state``, ``forward(x, state=)`` and ``backward``) as a token
    mixer. Causal by construction: it takes no mask and no attention dropout."""

    cache_types = (RecurrentCache,)

    def __init__(self, layer) -> None:
        for attr in ("hidden_size", "params", "PARAM_NAMES", "zero_state", "forward", "backward"):
            if not hasattr(layer, attr):
                raise ValueError(f"layer must be a recurrent layer (it has no {attr!r}), got {type(layer).__name__}")
        self.layer = layer
        self.params = layer.params  # the same dict
        self.state_type = type(layer.zero_state(1))  # DeltaNetState, Mamba2State, ...: a cache holds one kind

    def __repr__(self) -> str:
        return repr(self.layer)

    @property
    def embed_dim(self) -> int:
        return self.layer.hidden_size

    def forward(self, x, *, mask=None, training=False, dropout_mask=None, positions=None, cache=None):
        """x (B, L, E) -> (y (B, L, E), RecurrentMixerCache); ``cache`` a RecurrentCache (decoding: its state is
        read and replaced) or None (a sequence from its start). ``training`` is ignored (no dropout inside)."""
        for name, value in (("mask", mask), ("dropout_mask", dropout_mask), ("positions", positions)):
            if value is not None:
                raise ValueError(f"{name} must be None for a recurrent mixer (causal by its recurrence, it has no "
                                 f"attention weights and no positions), got {type(value).__name__}")  # fmt: skip
        if cache is not None and not self.accepts(cache):
            raise ValueError(f"cache must be a RecurrentCache of {self.state_type.__name__} for {self!r}, got a "
                             f"{self.describe_cache(cache)}")  # fmt: skip
        state = None if cache is None else cache.state
        (y, state), c = self.layer.forward(x, state=state)  # F1: (B, L, E), the state after the call
        if cache is not None:
            cache.state, cache.length = state, cache.length + x.shape[1]
        return y, RecurrentMixerCache(c, cache is not None)

    def backward(self, d_y, c):
        """-> (d_x (B, L, E), gradients by role)."""
        if not isinstance(c, RecurrentMixerCache):
            raise ValueError(f"c must be this mixer's RecurrentMixerCache, got {type(c).__name__}")
        if c.decoding:
            raise ValueError("c comes from a forward with a cache: decoding is forward only (a cache is state)")
        g = self.layer.backward(d_y, c.layer)  # ← F1
        return g["x"], {role: g[role] for role in self.params}

    def new_cache(self) -> RecurrentCache:
        return RecurrentCache()

    def accepts(self, cache) -> bool:
        """A RecurrentCache, empty or holding this layer's kind of state (a Mamba2State is not a DeltaNetState)."""
        return isinstance(cache, RecurrentCache) and (cache.state is None or isinstance(cache.state, self.state_type))

    def cache_batch(self, cache) -> int | None:
        return None if cache.state is None else int(cache.state.conv.shape[0])  # conv (B, K-1, C)

    def describe_cache(self, cache) -> str:
        state = getattr(cache, "state", None)
        return type(cache).__name__ + ("" if state is None else f" holding a {type(state).__name__}")


def as_mixer(attention) -> TokenMixer:
    """A ``MultiHeadAttention`` -> its ``AttentionMixer``; a ``TokenMixer`` as it is; else ValueError."""
    if isinstance(attention, TokenMixer):
        return attention
    if isinstance(attention, MultiHeadAttention):
        return AttentionMixer(attention)
    raise ValueError(f"attention must be a MultiHeadAttention or a TokenMixer, got {type(attention).__name__}")


__all__ = ["TokenMixer", "AttentionMixer", "RecurrentMixer", "RecurrentCache", "as_mixer"]
