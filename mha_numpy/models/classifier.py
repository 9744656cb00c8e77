"""A sentence classifier on a BERT encoder, with a hand-written backward through every layer.

    input_ids (B, L) ──BertModel──► h (B, L, E) ──mean over real tokens──► s (B, E) ──linear──► logits (B, C)
    logits, labels ──softmax cross-entropy──► loss (mean over the B sentences)

Mean pooling, not BERT's [CLS] pooler: all-MiniLM-L6-v2 was trained to make sentence embeddings as the mean
of its token vectors (its pooler weights are unused), so the mean is the feature it already knows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import functional as F
from . import layers as LY
from .bert import BertCache, BertModel

HEAD = ("classifier.weight", "classifier.bias")


@dataclass
class ClassifierCache:
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

    def loss_and_grads(self, inputs, labels: np.ndarray, training=False, rng=None):
        """One forward and backward on a BertInputs batch: -> (loss, logits (B, C), grads, cache)."""
        logits, cache = self.forward(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids, training, rng)
        loss, c_loss = LY.softmax_cross_entropy_forward(logits, labels)
        grads = self.backward(LY.softmax_cross_entropy_backward(1.0, c_loss), cache)
        return loss, logits, grads, cache
