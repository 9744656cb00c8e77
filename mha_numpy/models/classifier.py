"""A sentence classifier on a BERT encoder, with a hand-written backward through every layer.

    input_ids (B, L) ──BertModel──► h (B, L, E) ──mean over real tokens──► s (B, E) ──linear──► logits (B, C)
    logits, labels ──softmax cross-entropy──► loss (mean over the B sentences)

Mean pooling, not BERT's [CLS] pooler: all-MiniLM-L6-v2 was trained to make sentence embeddings as the mean
of its token vectors (its pooler weights are unused), so the mean is the feature it already knows.

Bands (``loss_and_grads``, ``logits``): the batch runs as bands of sentences, one per thread of a pool, BLAS on one
thread each, as ``BertModel.__call__`` runs inference. Sentences never meet (attention stays within a sentence, and
the loss is a mean over sentences), so each band runs forward, loss and backward on its own rows, its loss weighted
by its share b / B of the batch:

    loss = Σ_bands (b / B) · loss_band      d_logits_band = (b / B) · (p - onehot) / b = (p - onehot) / B   (b, C)
    grads = Σ_bands backward(d_logits_band)                                            (sums over sentences)

so the bands' loss and parameter gradients add up to the one-band ones, up to rounding (tests/test_finetune.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._checks import positive_int_or_none
from ..threads import AVAILABLE_CORES, row_bands, run_items
from . import layers as LY
from .bert import BertCache, BertModel

HEAD = ("classifier.weight", "classifier.bias")


@dataclass
class ClassifierCache:
    """What the backward needs: BERT's cache, the attention weights (a (B, H, L, L) per layer), the head's caches."""

    bert: BertCache
    attentions: tuple[np.ndarray, ...]  # one (B, H, L, L) per layer
    _caches: dict


class BertClassifier:
    """``bert`` + mean pooling + a linear head to ``num_labels`` classes.

    ``params``: every entry of ``bert.params`` (the same arrays) and 'classifier.weight' (C, E), 'classifier.bias'
    (C,), initialised as BERT's heads: N(0, 0.02) and 0.
    """

    def __init__(self, bert: BertModel, num_labels: int = 2, rng: int | np.random.Generator | None = 0) -> None:
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.bert, self.num_labels = bert, num_labels
        E = bert.config.hidden_size
        self.head = {
            HEAD[0]: (gen.standard_normal((num_labels, E)) * 0.02).astype(bert.dtype),
            HEAD[1]: np.zeros(num_labels, bert.dtype),
        }

    @property
    def params(self) -> dict[str, np.ndarray]:
        """Every parameter by name: BERT's (the same arrays), 'classifier.weight' (C, E) and 'classifier.bias' (C,)."""
        return {**self.bert.params, **self.head}

    def forward(self, input_ids, attention_mask, token_type_ids=None, training=False, rng=None, dropout_masks=None):
        """(B, L) ints -> logits (B, C), ClassifierCache."""
        out, c_bert = self.bert.forward(input_ids, attention_mask, token_type_ids, training, rng, dropout_masks)
        pooled, c_pool = LY.mean_pool_forward(out.last_hidden_state, attention_mask)  # F1: (B, E)
        logits, c_head = F.linear_forward(pooled, *self.head.values())  # F2: (B, E) @ (E, C) -> (B, C)
        return logits, ClassifierCache(c_bert, out.attentions, dict(pool=c_pool, head=c_head))

    def backward(self, d_logits: np.ndarray, cache: ClassifierCache) -> dict[str, np.ndarray]:
        """d_logits (B, C) -> a gradient for every entry of ``params``."""
        d_pooled, dW, db = F.linear_backward(d_logits, cache._caches["head"])  # ← F2: (B, E)
        d_h = LY.mean_pool_backward(d_pooled, cache._caches["pool"])  # ← F1: (B, L, E)
        return {**self.bert.backward(d_h.astype(self.bert.dtype, copy=False), cache.bert), HEAD[0]: dW, HEAD[1]: db}

    def logits(self, input_ids, attention_mask, token_type_ids=None, num_threads: int | None = None) -> np.ndarray:
        """(B, L) ints -> eval-mode logits (B, C), in ``num_threads`` bands (None: one per available core)."""
        batch = (input_ids, attention_mask, token_type_ids)
        bands = self._bands(input_ids, num_threads)
        return np.concatenate([logits for logits, _ in self._forward_bands(batch, bands, False, None)])  # (B, C)

    def loss_and_grads(self, inputs, labels: np.ndarray, training=False, rng=None, num_threads=1, names=None):
        """One forward and backward on a BertInputs batch: -> (loss, logits (B, C), grads, caches).

        num_threads: the batch runs as that many bands of sentences, each band's forward and backward on its own
        thread (None: one band per available core; 1: the plain one-band call). The dropout keep-masks are drawn
        for the whole batch from ``rng``, as a one-band forward draws them, and each band takes its rows, so the
        masks (and the results, up to rounding) do not depend on the band count.
        names: the parameters whose gradients are returned (default: all of ``params``); a frozen table's need not
        be summed over the bands. caches: one ClassifierCache per band.
        """
        ids, mask, types = (np.asarray(a) for a in (inputs.input_ids, inputs.attention_mask, inputs.token_type_ids))
        bands = self._bands(ids, num_threads)
        B, L = ids.shape
        drop = self.bert.sample_dropout_masks(B, L, rng) if training else None  # the whole batch's: (B, ...) each
        labels = np.asarray(labels)
        if labels.shape != (B,):
            raise ValueError(f"labels must be (B,) = ({B},) for input_ids {ids.shape}, got shape {labels.shape}")
        outs = [None] * len(bands)

        def band(i: int) -> None:  # forward, loss and backward of the band's rows
            rows = bands[i]
            band_drop = None if drop is None else {name: m[rows] for name, m in drop.items()}  # (b, ...) views
            logits, cache = self.forward(ids[rows], mask[rows], types[rows], training, None, band_drop)  # (b, C)
            loss, c_loss = LY.softmax_cross_entropy_forward(logits, labels[rows])  # the band's mean
            share = (rows.stop - rows.start) / B  # b / B: the band's weight in the batch's mean
            d_logits = LY.softmax_cross_entropy_backward(share, c_loss)  # (b, C): (p - onehot) / B
            outs[i] = (share * loss, logits, self.backward(d_logits, cache), cache)

        run_items(band, range(len(bands)), len(bands))
        loss = sum(out[0] for out in outs)
        logits = np.concatenate([out[1] for out in outs])  # (B, C)
        band_grads = [out[2] for out in outs]
        names = list(self.params) if names is None else list(names)
        if len(bands) == 1:
            return loss, logits, {name: band_grads[0][name] for name in names}, [outs[0][3]]
        grads = dict.fromkeys(names)  # the order of params; filled on the pool

        def total(name: str) -> None:  # Σ over the bands, band by band in order
            grads[name] = np.add(band_grads[0][name], band_grads[1][name])
            for g in band_grads[2:]:
                grads[name] += g[name]

        run_items(total, names, len(bands))
        return loss, logits, grads, [out[3] for out in outs]

    def _bands(self, input_ids, num_threads) -> list[slice]:
        threads = positive_int_or_none(num_threads, "num_threads") or AVAILABLE_CORES
        shape = np.shape(input_ids)
        if len(shape) != 2 or shape[0] == 0:
            raise ValueError(f"input_ids must be a non-empty (B, L) batch, got shape {shape}")
        return row_bands(shape[0], min(threads, shape[0]))

    def _forward_bands(self, batch, bands, training, drop) -> list[tuple[np.ndarray, ClassifierCache]]:
        """(logits (b, C), cache) of each band, the bands on a pool. batch: (input_ids, attention_mask,
        token_type_ids or None), (B, L) each; drop: the whole batch's dropout masks or None."""
        ids, mask, types = (None if a is None else np.asarray(a) for a in batch)  # (B, L) each, for slicing
        outs = [None] * len(bands)

        def forward(i: int) -> None:
            rows = bands[i]
            band_drop = None if drop is None else {name: m[rows] for name, m in drop.items()}  # (b, ...) views
            outs[i] = self.forward(ids[rows], mask[rows], None if types is None else types[rows], training, None,
                                   band_drop)  # fmt: skip

        run_items(forward, range(len(bands)), len(bands))
        return outs
