"""A tiny encoder–decoder (the Transformer of "Attention Is All You Need", pre-norm) with a hand-written backward,
so that the decoder's cross-attention is *learned* (notebook 01 builds one by hand; notebook 13 trains this one).

    src (B, Ls) ──src_embed + src_pos──► s (B, Ls, E)                                    F1
    for each encoder layer (a Block: pre-norm, LayerNorm, GELU feed-forward):          F2
        s = s + self_attn(norm1(s));   s = s + ffn(norm2(s))
    memory = encoder.norm(s)                                   (B, Ls, E)               F3
    tgt_in (B, Lt) ──tgt_embed + tgt_pos──► x (B, Lt, E)                                F4
    for each decoder layer (a DecoderLayer):                                           F5
        x = x + self_attn(norm1(x))              causal: position t sees the target up to t
        x = x + multihead_attn(norm2(x), memory) cross-attention: queries from the target, keys and values from
        x = x + ffn(norm3(x))                    the memory; its maps (B, H, Lt, Ls) are what the task teaches
    logits = generator(decoder.norm(x))          (B, Lt, V)                              F6, F7

The attentions are ``MultiHeadAttention`` modules, the encoder layer is ``Block``, the rest are the pairs of
``models.layers``. The same model is ``torch.nn.Transformer(norm_first=True, activation="gelu", dropout=0,
batch_first=True)`` with four ``nn.Embedding`` and an ``nn.Linear``: ``mha_numpy.interop.seq2seq`` builds it from
these weights and compares the logits, every gradient and the greedy decoding. The names of ``params`` are that
model's state-dict names, except the attention projections: torch packs W_q, W_k, W_v into one ``in_proj_weight``
(``names.torch_mha_name_map`` says where each sits).

Greedy decoding (``greedy_decode``) runs the decoder one token a call: each decoder self-attention appends its new
key and value to a ``KVCache`` (the cache grows by one position a token); the cross-attention is the module's
forward with the memory as keys and values, as in training. Its keys and values are the memory's, the same for
every token; the module projects them at each call (``MultiHeadAttention``'s ``KVCache`` is self-attention's: each
call appends its own keys), which at these sizes costs less than the Python around it. The tests check the
decoding against the teacher-forced forward, token for token.

The task (``reverse_batch``, ``train_reverse``): reverse a sequence of ``length`` symbols. The decoder reads
BOS, y_0, ..., y_{L-2} and predicts y_0 ... y_{L-1}, with y_t = src[L-1-t], so target position t must read source
position L-1-t: a learned cross-attention map is an anti-diagonal. Accuracy target: ``REVERSE_TARGET``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .. import masks
from .._checks import as_float_dtype, as_generator, as_int, as_number, check_like
from ..attention import MHACache, MultiHeadAttention
from ..kv_cache import KVCache
from ..optim import Adam, clip_grad_norm
from ..threads import blas_single_threaded
from . import layers as LY
from .block import Block, BlockCache

ATTENTION_ROLES = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
# the block's and the decoder layer's roles -> the names inside a layer (torch.nn.TransformerEncoderLayer's, but
# the attention's projections, which torch packs: in_proj_weight / in_proj_bias)
FFN_NAMES = {"W_1": "linear1.weight", "b_1": "linear1.bias", "W_2": "linear2.weight", "b_2": "linear2.bias"}
ENCODER_NAMES = {
    **{role: f"self_attn.{role}" for role in ATTENTION_ROLES},
    **{f"norm{i}.{w}": f"norm{i}.{w}" for i in (1, 2) for w in ("weight", "bias")},
    **FFN_NAMES,
}
DECODER_NAMES = {
    **{f"self_attn.{role}": f"self_attn.{role}" for role in ATTENTION_ROLES},
    **{f"cross_attn.{role}": f"multihead_attn.{role}" for role in ATTENTION_ROLES},  # torch's name for it
    **{f"norm{i}.{w}": f"norm{i}.{w}" for i in (1, 2, 3) for w in ("weight", "bias")},
    **FFN_NAMES,
}
BOS = 0  # the token the decoder starts from; the symbols of the task are 1 ... vocab_size - 1
REVERSE_TARGET = 0.95  # the reversal task's target: >= 95% of held-out sequences reversed exactly, greedily


@dataclass(frozen=True)
class Seq2SeqConfig:
    """The sizes of the model. max_len: the longest source and target (the learned position tables' rows).

    Checked when made (ValueError naming the field): every size a positive int, ``d_model`` divisible by ``nhead``,
    ``num_encoder_layers`` >= 0 (0: the memory is the normed embeddings), ``num_decoder_layers`` >= 1 (the decoder
    is the model's output), ``layer_norm_eps`` a finite number > 0.
    """

    vocab_size: int = 11
    d_model: int = 32
    nhead: int = 2
    dim_feedforward: int = 64
    num_encoder_layers: int = 1
    num_decoder_layers: int = 1
    max_len: int = 16
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        minimum = {"num_encoder_layers": 0}  # every other int field is a size: at least 1
        for name in ("vocab_size", "d_model", "nhead", "dim_feedforward", "num_encoder_layers", "num_decoder_layers",
                     "max_len"):  # fmt: skip
            object.__setattr__(self, name, as_int(getattr(self, name), name, minimum=minimum.get(name, 1)))
        eps = as_number(self.layer_norm_eps, "layer_norm_eps", positive=True)
        object.__setattr__(self, "layer_norm_eps", eps)
        if self.d_model % self.nhead:
            raise ValueError(f"d_model={self.d_model} is not divisible by nhead={self.nhead}")


def param_shapes(c: Seq2SeqConfig) -> dict[str, tuple[int, ...]]:
    """Every weight by name, with its shape (W in PyTorch layout (out, in))."""
    E, I, V, P = c.d_model, c.dim_feedforward, c.vocab_size, c.max_len
    attn = {"W_q": (E, E), "W_k": (E, E), "W_v": (E, E), "W_o": (E, E), "b_q": (E,), "b_k": (E,), "b_v": (E,),
            "b_o": (E,)}  # fmt: skip
    ffn = {"W_1": (I, E), "b_1": (I,), "W_2": (E, I), "b_2": (E,)}
    norm = {"weight": (E,), "bias": (E,)}
    enc = {**attn, **{f"norm{i}.{w}": s for i in (1, 2) for w, s in norm.items()}, **ffn}
    dec = {**{f"self_attn.{r}": s for r, s in attn.items()}, **{f"cross_attn.{r}": s for r, s in attn.items()},
           **{f"norm{i}.{w}": s for i in (1, 2, 3) for w, s in norm.items()}, **ffn}  # fmt: skip
    shapes = {
        "src_embed.weight": (V, E),
        "src_pos.weight": (P, E),
        "tgt_embed.weight": (V, E),
        "tgt_pos.weight": (P, E),
    }
    for i in range(c.num_encoder_layers):
        shapes.update({f"encoder.layers.{i}.{ENCODER_NAMES[role]}": s for role, s in enc.items()})
    shapes.update({"encoder.norm.weight": (E,), "encoder.norm.bias": (E,)})
    for i in range(c.num_decoder_layers):
        shapes.update({f"decoder.layers.{i}.{DECODER_NAMES[role]}": s for role, s in dec.items()})
    shapes.update({"decoder.norm.weight": (E,), "decoder.norm.bias": (E,)})
    shapes.update({"generator.weight": (V, E), "generator.bias": (V,)})
    return shapes


def _attention(c: Seq2SeqConfig, dtype) -> MultiHeadAttention:
    return MultiHeadAttention(c.d_model, c.nhead, dtype=dtype, rng=0)  # its params are replaced by the model's


# --------------------------------------------------------------------------- the decoder layer


@dataclass
class DecoderLayerCache:
    """Intermediates of ``DecoderLayer.forward``: ``self_attention`` and ``cross_attention`` are the modules'
    caches (``.attn_weights`` (B, H, Lt, Lt) and (B, H, Lt, Ls))."""

    self_attention: MHACache
    cross_attention: MHACache
    norms: tuple
    ffn: tuple


class DecoderLayer:
    """Pre-norm decoder layer: causal self-attention, cross-attention to the memory, a GELU feed-forward, each a
    residual branch (torch.nn.TransformerDecoderLayer(norm_first=True)).

        h1 = x  + self_attn(n1, n1, n1, causal),   n1 = norm1(x)           F1
        h2 = h1 + cross_attn(n2, memory, memory),  n2 = norm2(h1)          F2
        y  = h2 + ffn(n3),                         n3 = norm3(h2)          F3

    The weights live in the model's ``params`` under ``prefix`` + ``DECODER_NAMES[role]``; both attention modules
    are pointed at those arrays at every call (no copy), as ``Block`` does.
    """

    def __init__(self, self_attn: MultiHeadAttention, cross_attn: MultiHeadAttention, params: dict, prefix: str,
                 eps: float) -> None:  # fmt: skip
        self.self_attn, self.cross_attn, self.params, self.prefix, self.eps = self_attn, cross_attn, params, prefix, eps
        self._sync()

    def _p(self, role: str) -> np.ndarray:
        return self.params[self.prefix + DECODER_NAMES[role]]

    def _sync(self) -> None:
        for module, kind in ((self.self_attn, "self_attn"), (self.cross_attn, "cross_attn")):
            module.params = {role: self._p(f"{kind}.{role}") for role in module.params}

    def _norm_forward(self, x: np.ndarray, i: int):
        return LY.layer_norm_forward(x, self._p(f"norm{i}.weight"), self._p(f"norm{i}.bias"), self.eps)

    def _norm_backward(self, d: np.ndarray, cache, i: int, g: dict) -> np.ndarray:
        d, g[self.prefix + f"norm{i}.weight"], g[self.prefix + f"norm{i}.bias"] = LY.layer_norm_backward(d, cache)
        return d

    def _ffn(self) -> list[np.ndarray]:
        return [self._p(role) for role in FFN_NAMES]

    def forward(self, x: np.ndarray, memory: np.ndarray, mask) -> tuple[np.ndarray, DecoderLayerCache]:
        """x (B, Lt, E), memory (B, Ls, E), mask: the self-attention's (causal) -> y (B, Lt, E), cache."""
        self._sync()
        n1, c1 = self._norm_forward(x, 1)  # F1: (B, Lt, E)
        a, c_sa = self.self_attn.forward(n1, n1, n1, mask=mask)  # F1: (B, Lt, E) causal self-attention
        h1, _ = LY.add_forward(x, a)  # F1: residual
        n2, c2 = self._norm_forward(h1, 2)  # F2: (B, Lt, E)
        a, c_ca = self.cross_attn.forward(n2, memory, memory)  # F2: (B, Lt, E); weights (B, H, Lt, Ls)
        h2, _ = LY.add_forward(h1, a)  # F2: residual
        n3, c3 = self._norm_forward(h2, 3)  # F3: (B, Lt, E)
        f, c_ff = LY.feed_forward_forward(n3, *self._ffn())  # F3: (B, Lt, E) -> (B, Lt, I) -> (B, Lt, E)
        y, _ = LY.add_forward(h2, f)  # F3: residual
        return y, DecoderLayerCache(c_sa, c_ca, (c1, c2, c3), c_ff)

    def backward(self, d_y: np.ndarray, cache: DecoderLayerCache) -> tuple[np.ndarray, np.ndarray, dict]:
        """d_y (B, Lt, E) -> d_x (B, Lt, E), d_memory (B, Ls, E), gradients by name (every tensor of the layer)."""
        g: dict[str, np.ndarray] = {}
        c1, c2, c3 = cache.norms
        d_h2, d_f = LY.add_backward(d_y)  # ← F3: the skip path and the feed-forward path
        d_n3, *g_ffn = LY.feed_forward_backward(d_f, cache.ffn)  # ← F3: (B, Lt, E)
        g.update({self.prefix + name: gw for name, gw in zip(FFN_NAMES.values(), g_ffn)})
        d_h2 = d_h2 + self._norm_backward(d_n3, c3, 3, g)  # ← F3: both paths into h2
        d_h1, d_a = LY.add_backward(d_h2)  # ← F2
        gc = self.cross_attn.backward(d_a, cache.cross_attention)  # ← F2: query, key, value, W_q, ...
        g.update({self.prefix + f"multihead_attn.{role}": gc[role] for role in self.cross_attn.params})
        d_memory = gc["key"] + gc["value"]  # ← F2: the memory fed both the keys and the values (B, Ls, E)
        d_h1 = d_h1 + self._norm_backward(gc["query"], c2, 2, g)  # ← F2: both paths into h1
        d_x, d_a = LY.add_backward(d_h1)  # ← F1
        gs = self.self_attn.backward(d_a, cache.self_attention)  # ← F1
        g.update({self.prefix + f"self_attn.{role}": gs[role] for role in self.self_attn.params})
        d_n1 = gs["query"] + gs["key"] + gs["value"]  # ← F1: self-attention, three paths (B, Lt, E)
        d_x = d_x + self._norm_backward(d_n1, c1, 1, g)  # ← F1: skip + attention
        return d_x, d_memory, g

    # ------------------------------------------------------------------ decoding (forward only)

    def cross_kv(self, memory: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """memory (B, Ls, E) -> the cross-attention's K, V (B, H, Ls, d): the memory as the module projects it (its
        cache's ``K`` and ``V``), what every query of the target reads (forward only)."""
        self._sync()
        _, c = self.cross_attn.forward(memory[:, :1], memory, memory)  # one query: only K and V are wanted
        return c.K, c.V

    def step(self, x: np.ndarray, kv: KVCache, memory: np.ndarray) -> tuple[np.ndarray, MHACache]:
        """One call of decoding: x (B, n, E) the newest tokens, memory (B, Ls, E) -> y (B, n, E), the cross-attention
        module's cache (``attn_weights`` (B, H, n, Ls); ``K``, ``V`` (B, H, Ls, d) the memory's projections).

        The self-attention appends the tokens' keys and values to ``kv`` (and attends to all cached ones); the
        cross-attention is the module's forward, as in ``forward``: the same lines, F1-F3."""
        self._sync()
        n1 = self._norm_forward(x, 1)[0]
        h1 = x + self.self_attn.forward(n1, n1, n1, kv_cache=kv)[0]  # F1: the cache: cached + n keys
        n2 = self._norm_forward(h1, 2)[0]
        a, c_ca = self.cross_attn.forward(n2, memory, memory)  # F2: (B, n, E); weights (B, H, n, Ls)
        h2 = h1 + a
        return h2 + LY.feed_forward_forward(self._norm_forward(h2, 3)[0], *self._ffn())[0], c_ca  # F3


# --------------------------------------------------------------------------- the model


@dataclass
class Seq2SeqOutput:
    """logits (B, Lt, V); memory (B, Ls, E), the encoder's output; the attention maps after softmax, one array per
    layer: encoder_attentions (B, H, Ls, Ls), decoder_attentions (B, H, Lt, Lt) (causal),
    cross_attentions (B, H, Lt, Ls) (rows: target positions, columns: source positions)."""

    logits: np.ndarray
    memory: np.ndarray
    encoder_attentions: tuple[np.ndarray, ...]
    decoder_attentions: tuple[np.ndarray, ...]
    cross_attentions: tuple[np.ndarray, ...]


@dataclass
class Seq2SeqCache:
    """What ``Seq2SeqModel.backward`` needs; ``owner`` identifies the model that made it."""

    owner: object
    shape: tuple[int, int, int]  # (B, Lt, V) of the logits
    embeddings: tuple
    encoder: list[BlockCache]
    encoder_norm: tuple
    decoder: list[DecoderLayerCache]
    decoder_norm: tuple
    generator: tuple


@dataclass
class GreedyDecoding:
    """tokens (B, n) the decoded ids (BOS not included); logits (B, n, V) each step's; cross_attentions: one
    (B, H, n, Ls) per decoder layer, row t the weights with which step t read the source; kv_caches: each decoder
    layer's self-attention ``KVCache`` at the end (n positions: one appended a step); cross_kv: each layer's
    cross-attention K, V (B, H, Ls, d), the memory's projections (the same at every step)."""

    tokens: np.ndarray
    logits: np.ndarray
    cross_attentions: tuple[np.ndarray, ...]
    kv_caches: tuple[KVCache, ...]
    cross_kv: tuple[tuple[np.ndarray, np.ndarray], ...]


class Seq2SeqModel:
    """Source and target embeddings (token + learned position), encoder layers (``Block``), decoder layers
    (``DecoderLayer``), final LayerNorms and a linear read-out (module docstring).

    ``weights`` maps the names of ``param_shapes`` to arrays; they are copied into ``params`` in ``dtype``.
    """

    def __init__(self, config: Seq2SeqConfig, weights: dict[str, np.ndarray], dtype=np.float64) -> None:
        dtype, c = as_float_dtype(dtype), config
        if not isinstance(c, Seq2SeqConfig):
            raise ValueError(f"config must be a Seq2SeqConfig (it checks the sizes), got {type(c).__name__}")
        self.config, self.dtype = c, dtype
        self.params: dict[str, np.ndarray] = LY.checked_params(weights, param_shapes(c), dtype)
        self.encoder_layers = [
            Block(
                _attention(c, dtype),
                self.params,
                ENCODER_NAMES,
                f"encoder.layers.{i}.",
                norm_position="pre",
                norm="layer_norm",
                eps=c.layer_norm_eps,
                ffn="gelu",
            )  # fmt: skip
            for i in range(c.num_encoder_layers)
        ]
        self.decoder_layers = [
            DecoderLayer(
                _attention(c, dtype), _attention(c, dtype), self.params, f"decoder.layers.{i}.", c.layer_norm_eps
            )  # fmt: skip
            for i in range(c.num_decoder_layers)
        ]
        self._token = object()  # identifies this model's caches

    @classmethod
    def random(cls, config: Seq2SeqConfig, dtype=np.float64, rng=0) -> Seq2SeqModel:
        """Weights N(0, 1/fan_in) (embeddings N(0, 1)), biases 0, LayerNorm weights 1."""
        gen = as_generator(rng)
        weights = {}
        for name, shape in param_shapes(config).items():
            if ".norm" in name and name.endswith(".weight"):
                weights[name] = np.ones(shape)
            elif len(shape) == 1:
                weights[name] = np.zeros(shape)
            elif "embed" in name or "_pos" in name:
                weights[name] = gen.normal(0.0, 1.0, shape)
            else:
                weights[name] = gen.normal(0.0, shape[1] ** -0.5, shape)
        return cls(config, weights, dtype=dtype)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Seq2SeqModel(encoder_layers={c.num_encoder_layers}, decoder_layers={c.num_decoder_layers}, "
            f"d_model={c.d_model}, nhead={c.nhead}, vocab_size={c.vocab_size}, dtype={self.dtype.name})"
        )

    # ------------------------------------------------------------------ pieces

    def _embed(self, ids: np.ndarray, side: str, start: int = 0):
        """ids (B, L) at positions start ... start + L - 1 -> (B, L, E), the two lookups' caches."""
        P, L = self.params, ids.shape[1]
        positions = np.broadcast_to(np.arange(start, start + L), ids.shape)  # (B, L)
        tok, c_tok = LY.embedding_forward(ids, P[f"{side}_embed.weight"])  # (B, L, E)
        pos, c_pos = LY.embedding_forward(positions, P[f"{side}_pos.weight"])  # (B, L, E)
        return LY.add_forward(tok, pos)[0], (c_tok, c_pos)

    def _final_norm(self, x: np.ndarray, side: str):
        P = self.params
        return LY.layer_norm_forward(x, P[f"{side}.norm.weight"], P[f"{side}.norm.bias"], self.config.layer_norm_eps)

    def _check_ids(self, ids, name: str) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 2 or 0 in ids.shape:
            raise ValueError(f"{name} must be a non-empty integer array (B, L), got shape {ids.shape}")
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"{name} with shape {ids.shape} is longer than max_len={self.config.max_len}")
        return LY.check_ids(ids, name, self.config.vocab_size)

    def encode(self, src: np.ndarray):
        """src (B, Ls) -> memory (B, Ls, E), and the caches (embedding, layers, final norm)."""
        s, c_emb = self._embed(src, "src")  # F1: (B, Ls, E)
        caches = []
        for layer in self.encoder_layers:
            s, c = layer.forward(s)  # F2: (B, Ls, E), no mask: every source token sees every other
            caches.append(c)
        memory, c_norm = self._final_norm(s, "encoder")  # F3: (B, Ls, E)
        return memory, (c_emb, caches, c_norm)

    # ------------------------------------------------------------------ forward / backward

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> tuple[Seq2SeqOutput, Seq2SeqCache]:
        """src (B, Ls), tgt_in (B, Lt) ints (teacher forcing: the target shifted right, BOS first) -> output, cache."""
        src, tgt_in = self._check_ids(src, "src"), self._check_ids(tgt_in, "tgt_in")
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"src {src.shape} and tgt_in {tgt_in.shape} must have the same batch size")
        P = self.params
        memory, (c_src, c_enc, c_enc_norm) = self.encode(src)  # F1-F3
        x, c_tgt = self._embed(tgt_in, "tgt")  # F4: (B, Lt, E)
        causal = masks.causal_mask(tgt_in.shape[1])  # (Lt, Lt) True = may attend
        c_dec = []
        for layer in self.decoder_layers:
            x, c = layer.forward(x, memory, causal)  # F5: (B, Lt, E)
            c_dec.append(c)
        y, c_dec_norm = self._final_norm(x, "decoder")  # F6: (B, Lt, E)
        logits, c_gen = F.linear_forward(y, P["generator.weight"], P["generator.bias"])  # F7: (B, Lt, E) @ (E, V)
        out = Seq2SeqOutput(
            logits, memory, tuple(c.attention.attn_weights for c in c_enc),
            tuple(c.self_attention.attn_weights for c in c_dec), tuple(c.cross_attention.attn_weights for c in c_dec),
        )  # fmt: skip
        cache = Seq2SeqCache(self._token, logits.shape, (c_src, c_tgt), c_enc, c_enc_norm, c_dec, c_dec_norm, c_gen)
        return out, cache

    def backward(self, d_logits: np.ndarray, cache: Seq2SeqCache) -> dict[str, np.ndarray]:
        """d_logits (B, Lt, V) -> a gradient for every entry of ``params`` (same names, shapes, dtype, order)."""
        if not isinstance(cache, Seq2SeqCache) or cache.owner is not self._token:
            raise ValueError("cache must come from this model's forward (it was made by another model or is not one)")
        d = check_like(d_logits, "d_logits", cache.shape, self.dtype, "logits")
        g: dict[str, np.ndarray] = {}
        d, g["generator.weight"], g["generator.bias"] = F.linear_backward(d, cache.generator)  # ← F7: (B, Lt, E)
        d, g["decoder.norm.weight"], g["decoder.norm.bias"] = LY.layer_norm_backward(d, cache.decoder_norm)  # ← F6
        d_memory = 0.0
        for layer, c in zip(reversed(self.decoder_layers), reversed(cache.decoder)):
            d, d_mem, g_layer = layer.backward(d, c)  # ← F5: (B, Lt, E), (B, Ls, E)
            d_memory = d_memory + d_mem  # every decoder layer reads the memory: their gradients add up
            g.update(g_layer)
        self._embedding_backward(d, cache.embeddings[1], "tgt", g)  # ← F4
        d, g["encoder.norm.weight"], g["encoder.norm.bias"] = LY.layer_norm_backward(
            d_memory, cache.encoder_norm
        )  # ← F3: (B, Ls, E)
        for layer, c in zip(reversed(self.encoder_layers), reversed(cache.encoder)):
            d, g_layer = layer.backward(d, c)  # ← F2: (B, Ls, E)
            g.update(g_layer)
        self._embedding_backward(d, cache.embeddings[0], "src", g)  # ← F1
        return {name: g[name] for name in self.params}

    def _embedding_backward(self, d: np.ndarray, caches, side: str, g: dict) -> None:
        d_tok, d_pos = LY.add_backward(d)  # token + position: the same gradient to both tables
        g[f"{side}_embed.weight"] = LY.embedding_backward(d_tok, caches[0])  # scatter-add, (V, E)
        g[f"{side}_pos.weight"] = LY.embedding_backward(d_pos, caches[1])  # (max_len, E), unused rows 0

    def loss_and_grads(self, src, tgt_in, labels) -> tuple[float, Seq2SeqOutput, dict[str, np.ndarray]]:
        """Mean cross-entropy of the logits against labels (B, Lt) -> (loss, output, gradients by name)."""
        out, cache = self.forward(src, tgt_in)
        loss, c_loss = LY.softmax_cross_entropy_forward(out.logits, labels)
        return loss, out, self.backward(LY.softmax_cross_entropy_backward(1.0, c_loss), cache)

    # ------------------------------------------------------------------ greedy decoding with the caches

    def greedy_decode(self, src: np.ndarray, length: int, bos: int = BOS) -> GreedyDecoding:
        """src (B, Ls) -> the ``length`` tokens the decoder picks one by one (argmax), from ``bos``.

        Forward only. The encoder runs once; each step embeds one token at its position, appends its self-attention
        keys and values to the layer's ``KVCache`` and reads the memory through the cross-attention module."""
        src = self._check_ids(src, "src")
        length = as_int(length, "length", minimum=1)
        if length > self.config.max_len:
            raise ValueError(f"length={length} is longer than max_len={self.config.max_len}")
        LY.check_ids(np.asarray([bos]), "bos", self.config.vocab_size)
        P = self.params
        memory, _ = self.encode(src)  # (B, Ls, E), once
        caches = [KVCache() for _ in self.decoder_layers]  # per layer: the self-attention's, growing a token a step
        token = np.full((src.shape[0], 1), bos)  # (B, 1)
        tokens, logits, weights, kvs = [], [], [[] for _ in self.decoder_layers], [None] * len(self.decoder_layers)
        for t in range(length):
            x, _ = self._embed(token, "tgt", start=t)  # (B, 1, E) the token at position t
            for i, layer in enumerate(self.decoder_layers):
                x, c = layer.step(x, caches[i], memory)  # (B, 1, E), the cross-attention's cache
                weights[i].append(c.attn_weights)  # (B, H, 1, Ls)
                if t == 0:
                    kvs[i] = c.K, c.V  # (B, H, Ls, d) each: the memory's, the same at every step
            y, _ = self._final_norm(x, "decoder")
            step_logits, _ = F.linear_forward(y, P["generator.weight"], P["generator.bias"])  # (B, 1, V)
            token = step_logits.argmax(axis=-1)  # (B, 1) the most likely next token
            tokens.append(token)
            logits.append(step_logits)
        cross = tuple(np.concatenate(w, axis=2) for w in weights)  # (B, H, length, Ls) per layer
        return GreedyDecoding(np.concatenate(tokens, axis=1), np.concatenate(logits, axis=1), cross, tuple(caches),
                              tuple(kvs))  # fmt: skip


# --------------------------------------------------------------------------- the task: reverse a sequence


def reverse_batch(rng: np.random.Generator, batch: int, length: int, vocab_size: int):
    """-> src (B, L) symbols in 1 ... vocab_size - 1, tgt_in (B, L) = BOS then the reversed source without its last
    token (teacher forcing), labels (B, L) = the reversed source. rng: a Generator or an int seed; batch, length
    >= 1; vocab_size >= 2 (BOS and at least one symbol)."""
    rng = as_generator(rng)
    batch, length = as_int(batch, "batch", minimum=1), as_int(length, "length", minimum=1)
    vocab_size = as_int(vocab_size, "vocab_size", minimum=2)  # 0 is BOS: the symbols are 1 ... vocab_size - 1
    src = rng.integers(1, vocab_size, size=(batch, length))  # (B, L)
    labels = src[:, ::-1].copy()  # (B, L) y_t = src[L-1-t]
    tgt_in = np.concatenate([np.full((batch, 1), BOS), labels[:, :-1]], axis=1)  # (B, L) shifted right
    return src, tgt_in, labels


def sequence_accuracy(model: Seq2SeqModel, src: np.ndarray, labels: np.ndarray) -> float:
    """The share of sequences whose greedy decoding is exactly ``labels`` (B, L)."""
    return float((model.greedy_decode(src, labels.shape[1]).tokens == labels).all(axis=1).mean())


@dataclass
class ReverseTraining:
    """The trained model, the loss and token accuracy per step (teacher forcing, before each update), and the
    held-out sequences (src, labels) behind ``accuracy``, the share greedily reversed exactly."""

    model: Seq2SeqModel
    history: dict[str, list]
    src: np.ndarray
    labels: np.ndarray
    accuracy: float


def train_reverse(
    config: Seq2SeqConfig = Seq2SeqConfig(),
    *,
    length: int = 8,
    steps: int = 150,
    batch_size: int = 64,
    lr: float = 3e-3,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    eval_size: int = 500,
) -> ReverseTraining:
    """Train a ``Seq2SeqModel`` to reverse random sequences with Adam on fresh batches; the seed fixes the initial
    weights, every batch and the held-out set. Each step: forward, cross-entropy, the hand-written backward, the
    gradient clipped to ``max_grad_norm``, an Adam update. ``eval_size``: the held-out sequences, at least 1."""
    if not isinstance(config, Seq2SeqConfig):
        raise ValueError(f"config must be a Seq2SeqConfig, got {type(config).__name__}")
    if config.vocab_size < 2:
        raise ValueError(f"config.vocab_size={config.vocab_size} leaves no symbol to reverse (0 is BOS): at least 2")
    length = as_int(length, "length", minimum=1)
    steps, batch_size = as_int(steps, "steps", minimum=1), as_int(batch_size, "batch_size", minimum=1)
    eval_size = as_int(eval_size, "eval_size", minimum=1)
    lr, max_grad_norm = as_number(lr, "lr", positive=True), as_number(max_grad_norm, "max_grad_norm", positive=True)
    if length > config.max_len:
        raise ValueError(f"length={length} is longer than the config's max_len={config.max_len}")
    seq_init, seq_data, seq_eval = np.random.SeedSequence(as_int(seed, "seed", minimum=0)).spawn(3)
    model = Seq2SeqModel.random(config, rng=np.random.default_rng(seq_init))
    data = np.random.default_rng(seq_data)
    opt = Adam(model.params, lr=lr)
    history: dict[str, list] = {"step": [], "loss": [], "token_accuracy": []}
    with blas_single_threaded():  # tiny matrices: more BLAS threads only add synchronisation
        for step in range(1, steps + 1):
            src, tgt_in, labels = reverse_batch(data, batch_size, length, config.vocab_size)
            loss, out, grads = model.loss_and_grads(src, tgt_in, labels)
            grads, _ = clip_grad_norm(grads, max_grad_norm)
            opt.step(grads)
            history["step"].append(step)
            history["loss"].append(loss)
            history["token_accuracy"].append(float((out.logits.argmax(-1) == labels).mean()))
        src, _, labels = reverse_batch(np.random.default_rng(seq_eval), eval_size, length, config.vocab_size)
        accuracy = sequence_accuracy(model, src, labels)
    return ReverseTraining(model, history, src, labels, accuracy)
