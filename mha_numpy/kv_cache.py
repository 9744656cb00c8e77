"""``KVCache``: the projected keys and values of earlier calls, for decoding one token (or a few) at a time.

A decoder that produces token t needs the keys and values of tokens 0 ... t. They do not change once
computed (causal attention: an old token never looks at a new one), so they are kept instead of being
recomputed: each call projects only its new tokens, appends their K and V (after RoPE, at their positions),
and attends to everything stored. With grouped-query attention the cache holds the Hkv key/value heads, not
the H query heads: that is where GQA and MQA save memory (``nbytes``, ``bytes_per_token``).

    kv = KVCache()
    out, _ = mha.forward(prompt, prompt, prompt, kv_cache=kv)  # prefill: Lq tokens, causal among themselves
    out, _ = mha.forward(x_t, x_t, x_t, kv_cache=kv)  # one step: 1 token attends to all cached ones

Storage grows by doubling, so appending L tokens one at a time copies O(L) entries in all, not O(L²).
Forward only: a cache is state, ``MultiHeadAttention.backward`` refuses a call that used one. For the same reason
it is never shared between threads or sequences: a ``KVCache`` is the keys and values of one decoding so far.

``StreamingKVCache(sink_tokens, window)`` is StreamingLLM's (Xiao et al., "Efficient Streaming Language Models with
Attention Sinks", 2024): it keeps the first ``sink_tokens`` positions for ever and the last ``window`` ones, and
evicts the rest, so decoding runs without end in the memory of sink_tokens + window positions.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import masks
from ._checks import as_float_array, as_int


class KVCache:
    """Keys and values (B, Hkv, length, d) of one attention module, appended call after call."""

    stores = "keys after RoPE"  # each key turned once, at its position in the text (the data path appends after RoPE)
    takes_positions = True  # a call may give its tokens' positions

    def __init__(self) -> None:
        self._k: np.ndarray | None = None  # (B, Hkv, capacity, d), the first ``length`` positions in use
        self._v: np.ndarray | None = None  # (B, Hkv, capacity, dv)
        self.length = 0
        self._owner: weakref.ref | None = None

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        shape = None if self._k is None else self.keys.shape
        return f"KVCache(length={self.length}, keys={shape}, nbytes={self.nbytes})"

    @property
    def keys(self) -> np.ndarray | None:
        """(B, Hkv, length, d): the cached keys, after RoPE (a view, not a copy)."""
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def values(self) -> np.ndarray | None:
        """(B, Hkv, length, dv): the cached values (a view)."""
        return None if self._v is None else self._v[:, :, : self.length]

    @property
    def dtype(self) -> np.dtype | None:
        return None if self._k is None else self._k.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the stored keys and values: 2 · B · Hkv · length · d · itemsize (d = dv)."""
        return 0 if self._k is None else int(self.keys.nbytes + self.values.nbytes)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more position costs, per sequence of the batch: (d + dv) · Hkv · itemsize (0 while empty)."""
        if self._k is None:
            return 0
        B, Hkv, _, d = self._k.shape
        return int(Hkv * (d + self._v.shape[-1]) * self._k.itemsize)

    def positions(self, num_new: int) -> np.ndarray:
        """(num_new,) the positions of the next call's tokens: length, length + 1, ..."""
        return np.arange(self.length, self.length + num_new)

    def mask(self, num_new: int, structured: bool = False) -> np.ndarray | masks.StructuredMask | None:
        """What the next call's num_new queries may attend to: every cached position and the new ones causally (the
        causal mask aligned bottom-right), (num_new, length + num_new) bool, or with structured=True its rule (a
        ``StructuredMask``: nothing Lq × Lk made). None for at most one query: a decoded token is the last position
        and sees every key, so no mask is built or applied."""
        if num_new <= 1:
            return None
        return masks.causal_mask(num_new, self.length + num_new, align="bottom-right", structured=structured)

    def bind(self, owner, dtype=None, batch: int | None = None) -> None:
        """Tie the cache to ``owner`` (the attention module that appends to it) on first use; ValueError naming
        ``kv_cache`` for another owner, another ``dtype`` (default: ``owner.dtype``) or, given ``batch``, another
        batch size than the cached one. Runs before any arithmetic."""
        dtype = getattr(owner, "dtype", None) if dtype is None else np.dtype(dtype)
        held = None if self._owner is None else self._owner()
        if held is None and self._owner is not None and self.length:
            raise ValueError("kv_cache belongs to a module that no longer exists; start a new KVCache()")
        if held is not None and held is not owner:
            raise ValueError(f"kv_cache belongs to another module ({held!r}); use one KVCache per attention module")
        if self.dtype is not None and dtype is not None and self.dtype != dtype:
            raise ValueError(f"kv_cache holds {self.dtype} keys and values but the module is {dtype}")
        if batch is not None and self._k is not None and self._k.shape[0] != batch:
            raise ValueError(f"kv_cache holds a batch of {self._k.shape[0]} sequences, this call has {batch}")
        self._owner = weakref.ref(owner)

    def append(self, K: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store K (B, Hkv, Lnew, d) and V (B, Hkv, Lnew, dv) after the cached positions.

        -> (keys, values): (B, Hkv, length, d) and (B, Hkv, length, dv), every position so far (views).
        """
        K, V = self._check_new(K, V)
        end = self.length + K.shape[2]
        if self._k is None or end > self._k.shape[2]:
            self._grow(K, V, end)
        self._k[:, :, self.length : end] = K  # (B, Hkv, Lnew, d) into the free positions
        self._v[:, :, self.length : end] = V
        self.length = end
        return self.keys, self.values

    def _check_new(self, K, V) -> tuple[np.ndarray, np.ndarray]:
        """K (B, Hkv, Lnew, d), V (B, Hkv, Lnew, dv) as arrays that fit the cached ones, or ValueError."""
        K = as_float_array(K, "K", ndim=4)
        V = as_float_array(V, "V", ndim=4)
        if K.shape[:3] != V.shape[:3] or K.dtype != V.dtype:
            raise ValueError(f"K {K.dtype} {K.shape} and V {V.dtype} {V.shape} must share dtype and (B, Hkv, L)")
        if self._k is not None:
            held = (self._k.shape[:2], self._k.shape[3], self._v.shape[3], self._k.dtype)
            new = (K.shape[:2], K.shape[3], V.shape[3], K.dtype)
            if held != new:
                raise ValueError(
                    f"kv_cache holds keys {self.keys.dtype} {self.keys.shape} and values {self.values.shape}; "
                    f"the new K {K.dtype} {K.shape} and V {V.shape} do not fit (batch, heads, head dim, dtype)"
                )
        return K, V

    def _grow(self, K: np.ndarray, V: np.ndarray, needed: int) -> None:
        """Reallocate to max(needed, 2 · capacity) positions and copy what is stored."""
        capacity = max(needed, 2 * (0 if self._k is None else self._k.shape[2]))
        B, Hkv, _, d = K.shape
        new_k = np.empty((B, Hkv, capacity, d), dtype=K.dtype)
        new_v = np.empty((B, Hkv, capacity, V.shape[3]), dtype=V.dtype)
        if self.length:
            new_k[:, :, : self.length] = self.keys
            new_v[:, :, : self.length] = self.values
        self._k, self._v = new_k, new_v


class LatentCache:
    """What multi-head latent attention (``MultiHeadLatentAttention``, DeepSeek's MLA) keeps of earlier calls:
    the latent c_kv (B, 1, length, r) after its RMSNorm and the rope key k_rope (B, 1, length, dr) after RoPE,
    one "head" each, as Hugging Face's cache holds them for DeepseekV3Attention. K and V are not stored: each call
    expands them from c_kv (W_kvb is the same for every position), so a token costs r + dr numbers, not
    H · (dqk + dv) (``bytes_per_token``; the table in docs/derivation.md, § 25).

    Stored after the norm, as HF does: the norm is per token, so storing c_kv before it would be as exact and only
    cost each call the norms of every cached position again. Storage, growth and the checks are a ``KVCache``'s.
    """

    stores = "keys after RoPE"  # k_rope is turned once, at its position in the text
    takes_positions = True

    def __init__(self) -> None:
        self._store = KVCache()  # "keys" = c_kv, "values" = k_rope: the same (B, 1, length, ·) layout

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        shape = None if self.latent is None else self.latent.shape
        return f"LatentCache(length={len(self)}, latent={shape}, nbytes={self.nbytes})"

    @property
    def latent(self) -> np.ndarray | None:
        """(B, 1, length, r): c_kv of every cached position, after its RMSNorm (a view)."""
        return self._store.keys

    @property
    def k_rope(self) -> np.ndarray | None:
        """(B, 1, length, dr): the rope key of every cached position, after RoPE (a view)."""
        return self._store.values

    @property
    def dtype(self) -> np.dtype | None:
        return self._store.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the stored latents and rope keys: B · length · (r + dr) · itemsize."""
        return self._store.nbytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more position costs, per sequence of the batch: (r + dr) · itemsize (0 while empty)."""
        return self._store.bytes_per_token

    def positions(self, num_new: int) -> np.ndarray:
        """(num_new,) the positions of the next call's tokens: length, length + 1, ..."""
        return self._store.positions(num_new)

    def mask(self, num_new: int, structured: bool = False) -> np.ndarray | masks.StructuredMask | None:
        """As ``KVCache.mask``: every cached position, the new ones causally (bottom-right)."""
        return self._store.mask(num_new, structured)

    def bind(self, owner, dtype=None, batch: int | None = None) -> None:
        """As ``KVCache.bind``: one module, one dtype, one batch size, checked before any arithmetic."""
        self._store.bind(owner, dtype, batch)

    def append(self, latent: np.ndarray, k_rope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store latent (B, 1, Lnew, r) and k_rope (B, 1, Lnew, dr) after the cached positions.

        -> (latent, k_rope): (B, 1, length, r) and (B, 1, length, dr), every position so far (views).
        """
        for name, x in (("latent", latent), ("k_rope", k_rope)):
            if np.ndim(x) != 4 or np.shape(x)[1] != 1:
                raise ValueError(f"{name} with shape {np.shape(x)} must be (B, 1, Lnew, ·): one head for every head")
        return self._store.append(latent, k_rope)


class StreamingKVCache(KVCache):
    """StreamingLLM's cache: the first ``sink_tokens`` positions (the "attention sinks" a trained model dumps weight
    on) and the last ``window`` positions, the rest evicted; decoding runs for ever in bounded memory.

    A query attends to the sink tokens and to the ``window`` most recent positions up to itself, its own included
    (the window mask inside a call of several tokens). Between calls the cache holds at most
    sink_tokens + window - 1 positions, so the next token finds its whole window there (StreamingLLM's
    ``evict_for_space``).

    Positions are StreamingLLM's rule, the places in the cache, not in the text: the keys are stored before RoPE
    (``stores``) and a call turns all of them at their places 0 ... len - 1, its queries at len, len + 1, ... So the
    distance from a query to a sink token stays below sink_tokens + window, within what the model was trained on,
    however long the stream. Hence a call takes no ``positions=``. Token by token this is the paper's rule exactly;
    a call of several tokens numbers them after the kept positions, each seeing its own window.
    ``seen``: the tokens appended since the start; ``len(cache)``: the positions kept.
    """

    stores = "keys before RoPE"  # the data path appends before RoPE and turns every key at its place in the cache
    takes_positions = False

    def __init__(self, sink_tokens: int = 4, window: int = 1020) -> None:
        super().__init__()
        self.sink_tokens = as_int(sink_tokens, "sink_tokens", minimum=0)
        self.window = as_int(window, "window", minimum=1)
        self.seen = 0  # tokens appended so far, evicted ones included
        self._stream = np.zeros(0, dtype=np.int64)  # (length,) each kept position's index in the stream

    @property
    def kept(self) -> np.ndarray:
        """(length,) int64: the place in the stream (0 = the first token appended) of each position kept, in order."""
        return self._stream.copy()

    def __repr__(self) -> str:
        return (
            f"StreamingKVCache(sink_tokens={self.sink_tokens}, window={self.window}, length={self.length}, "
            f"seen={self.seen}, nbytes={self.nbytes})"
        )

    def mask(self, num_new: int, structured: bool = False) -> np.ndarray:
        """(num_new, length + num_new) bool: query i (token seen + i of the stream) may attend to the sink tokens
        and to the last ``window`` tokens up to itself (its entries always: no ``StructuredMask`` holds sinks)."""
        t = np.arange(self.seen, self.seen + num_new)[:, None]  # (num_new, 1) the queries' places in the stream
        s = np.concatenate([self._stream, t[:, 0]])[None, :]  # (1, length + num_new) the keys'
        return (s <= t) & ((s < self.sink_tokens) | (s > t - self.window))  # (num_new, length + num_new)

    def append(self, K: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add K (B, Hkv, Lnew, d) and V (B, Hkv, Lnew, dv) after the kept positions.

        -> (keys, values): (B, Hkv, length + Lnew, ·), what this call attends to (new arrays: no earlier call's
        are changed); then evicts all but the sink tokens and the last window - 1 positions, for the next call.
        """
        K, V = self._check_new(K, V)
        keys = K if self._k is None else np.concatenate([self._k, K], axis=2)  # (B, Hkv, length + Lnew, d)
        values = V if self._v is None else np.concatenate([self._v, V], axis=2)  # (B, Hkv, length + Lnew, dv)
        stream = np.concatenate([self._stream, np.arange(self.seen, self.seen + K.shape[2])])  # (length + Lnew,)
        self.seen += K.shape[2]
        keep = (stream < self.sink_tokens) | (stream > self.seen - self.window)  # the sinks, the last window - 1
        self._k, self._v, self._stream = keys[:, :, keep], values[:, :, keep], stream[keep]  # copies: evicted
        self.length = int(keep.sum())
        return keys, values
