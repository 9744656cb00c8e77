"""Fine-tune the pretrained MiniLM in NumPy: a sentence task, AdamW with warm-up, the hand-written backward.

The task ("sentiment"): template sentences about a thing, e.g. "i thought the concert was really dreadful .";
the label (0 = negative, 1 = positive) is decided by one adjective, the word the model must attend to.
Held-out sentences use templates, adjectives and nouns that never occur in training, so the accuracy
measures what the model learned about the word's meaning, not the templates.

The loop: ``BertClassifier`` (mean pooling + a linear head) on all 6 layers, softmax cross-entropy, gradient
clipping by global norm, AdamW (no decay on biases and LayerNorm weights) with a linear warm-up and decay.
The word-embedding table (12M of MiniLM's 22M parameters) is frozen: the held-out words' rows would get no
gradient anyway, and moving only the training words' rows would pull them away from the held-out ones.
``model.params`` are updated in memory only; the weights on disk are never written.

Speed: each batch runs as bands of sentences on a pool of threads (``BertClassifier.loss_and_grads``), the held-out
sentences are batched by length, and AdamW steps one group of parameters per thread; the results do not depend
on the thread count beyond rounding (docs/performance.md, "The finetune demo").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ._checks import as_bool, as_int, as_number, positive_int_or_none
from .models.bert import BertModel
from .models.classifier import BertClassifier
from .optim import AdamW, clip_grad_norm, global_norm, warmup_linear
from .threads import AVAILABLE_CORES, blas_single_threaded, run_items

TASK = "sentiment"
POSITIVE = {
    "train": "good great wonderful excellent lovely pleasant delightful fantastic nice superb".split(),
    "heldout": "amazing brilliant marvelous charming splendid perfect enjoyable beautiful".split(),
}
NEGATIVE = {
    "train": "bad terrible awful horrible poor dreadful nasty unpleasant miserable disappointing".split(),
    "heldout": "boring dull ugly annoying pathetic rotten weak sad".split(),
}
NOUNS = {
    "train": "movie meal hotel concert book trip show game dinner party".split(),
    "heldout": "song play hike class museum lecture flight room coffee album".split(),
}
TEMPLATES = {
    "train": [
        "the {noun} was {adj} .",
        "i thought the {noun} was really {adj} .",
        "what a {adj} {noun} that was !",
        "everyone agreed that the {noun} felt {adj} .",
        "we all found the {noun} {adj} yesterday .",
        "my sister said the {noun} was {adj} .",
    ],
    "heldout": [
        "honestly , the {noun} seemed {adj} to me .",
        "after a long day , that {noun} was simply {adj} .",
        "our neighbours called the {noun} {adj} .",
        "it was such a {adj} {noun} .",
    ],
}


def make_sentences(split: str, n: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray, list[str]]:
    """n sentences of ``split`` ('train' or 'heldout'), half positive: -> texts, labels (n,) int64, key adjectives."""
    if not isinstance(split, str) or split not in TEMPLATES:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    n = as_int(n, "n", minimum=0)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    labels = rng.permutation(np.arange(n) % 2)
    texts, words = [], []
    for label in labels:
        adj = rng.choice((POSITIVE if label else NEGATIVE)[split])
        template, noun = rng.choice(TEMPLATES[split]), rng.choice(NOUNS[split])
        texts.append(template.format(noun=noun, adj=adj))
        words.append(str(adj))
    return texts, labels.astype(np.int64), words


def split_evenly(params: dict[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    """``params`` in ``n`` groups of about equal size (largest first, each to the smallest group so far)."""
    sizes, groups = [0] * n, [{} for _ in range(n)]
    for name in sorted(params, key=lambda name: -params[name].size):
        i = sizes.index(min(sizes))
        groups[i][name], sizes[i] = params[name], sizes[i] + params[name].size
    return [g for g in groups if g]


def clipped_step(opts: list[AdamW], grads: dict[str, np.ndarray], max_norm: float, lr: float) -> float:
    """Clip ``grads`` by their global norm and step each optimizer (each over its own group of the parameters), the
    groups on the pool's threads; -> the global norm before clipping (from the groups' norms: the norm of the norms,
    as torch's ``clip_grad_norm_``)."""
    groups = [{name: grads[name] for name in opt.params} for opt in opts]
    norms = [0.0] * len(opts)
    run_items(lambda i: norms.__setitem__(i, global_norm(groups[i])), range(len(opts)), len(opts))
    norm = float(np.sqrt(sum(n * n for n in norms)))

    def step(i: int) -> None:
        opts[i].lr = lr
        opts[i].step(clip_grad_norm(groups[i], max_norm, norm)[0])

    run_items(step, range(len(opts)), len(opts))
    return norm


def no_decay_names(params) -> set[str]:
    """Biases and LayerNorm weights: not decayed (as in BERT's fine-tuning recipe)."""
    return {n for n in params if n.endswith(".bias") or "LayerNorm" in n}


@dataclass
class FinetuneResult:
    """history: per step "step", "loss", "accuracy" (on that step's batch, before the update), "grad_norm", "lr".
    accuracy / accuracy_before: on the held-out sentences after / before fine-tuning.
    example: a held-out sentence, its tokens, its key word's position and its attentions (layers, H, L, L)
    before and after."""

    classifier: BertClassifier
    history: dict[str, list]
    accuracy: float
    accuracy_before: float
    example: dict
    config: dict = field(default_factory=dict)


def evaluate(
    clf: BertClassifier, texts: list[str], labels: np.ndarray, batch_size: int = 64, num_threads: int | None = None
) -> float:
    """Accuracy of ``clf`` (eval mode) on ``texts``; each batch in ``num_threads`` bands (None: one per core).

    The sentences are batched by length, and each batch cut to its longest sentence: less padding to compute
    (each sentence's logits do not depend on its batch, up to rounding)."""
    inputs = clf.bert.tokenize(texts)  # (N, L), right-padded to the longest of all
    lengths = inputs.attention_mask.sum(axis=1)  # (N,)
    order = np.argsort(lengths, kind="stable")  # (N,)
    correct = 0
    for s in range(0, len(texts), batch_size):
        rows, L = order[s : s + batch_size], int(lengths[order[s : s + batch_size]].max())
        batch = (a[rows, :L] for a in (inputs.input_ids, inputs.attention_mask, inputs.token_type_ids))  # (b, L)
        logits = clf.logits(*batch, num_threads=num_threads)  # (b, C)
        correct += int((logits.argmax(-1) == labels[rows]).sum())
    return correct / len(texts)


def _attentions(clf: BertClassifier, text: str) -> np.ndarray:
    inputs = clf.bert.tokenize(text)
    _, cache = clf.forward(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    return np.stack([a[0] for a in cache.attentions])  # (layers, H, L, L)


def finetune(
    model: BertModel,
    *,
    steps: int = 60,
    batch_size: int = 16,
    lr: float = 1e-4,
    warmup: int | None = None,
    weight_decay: float = 0.01,
    max_grad_norm: float = 1.0,
    dropout: bool = True,
    eval_size: int = 256,
    seed: int = 0,
    log_every: int = 10,
    log: Callable[[str], None] | None = print,
    num_threads: int | None = None,
) -> FinetuneResult:
    """Fine-tune ``model`` (its ``params`` change in memory) on the sentiment task; -> FinetuneResult.

    warmup: warm-up steps (default 10% of ``steps``). dropout: BERT's dropouts while training (masks from the seed).
    steps, batch_size, eval_size, log_every: positive ints; seed, warmup: non-negative ints; lr, max_grad_norm: > 0;
    weight_decay: >= 0 (a ValueError naming the argument otherwise, before any work).
    num_threads: each batch (training and evaluation) runs as that many bands of sentences on a pool of threads,
    BLAS on one thread each (None: one per available core); the results do not depend on it beyond rounding
    (``BertClassifier.loss_and_grads``).
    """
    if not isinstance(model, BertModel):
        raise ValueError(f"model must be a mha_numpy BertModel, got {type(model).__name__}")
    if model.tokenizer is None:
        raise ValueError(f"model has no tokenizer, so it cannot read the task's sentences: {model!r}")
    steps, batch_size = as_int(steps, "steps", minimum=1), as_int(batch_size, "batch_size", minimum=1)
    eval_size, log_every = as_int(eval_size, "eval_size", minimum=1), as_int(log_every, "log_every", minimum=1)
    seed = as_int(seed, "seed", minimum=0)  # SeedSequence takes no negative seed
    warmup = None if warmup is None else as_int(warmup, "warmup", minimum=0)
    lr, max_grad_norm = as_number(lr, "lr", positive=True), as_number(max_grad_norm, "max_grad_norm", positive=True)
    weight_decay, dropout = as_number(weight_decay, "weight_decay", minimum=0), as_bool(dropout, "dropout")
    num_threads = positive_int_or_none(num_threads, "num_threads")
    if log is not None and not callable(log):
        raise ValueError(f"log must be a function of one str, or None; got {log!r:.60}")
    seq_head, seq_data, seq_eval, seq_drop = np.random.SeedSequence(seed).spawn(4)
    data_rng, drop_rng = np.random.default_rng(seq_data), np.random.default_rng(seq_drop)
    clf = BertClassifier(model, 2, rng=np.random.default_rng(seq_head))
    trainable = {n: p for n, p in clf.params.items() if n != "embeddings.word_embeddings.weight"}
    # AdamW is elementwise: one optimizer per group of parameters, the groups stepped on the pool's threads
    groups = split_evenly(trainable, min(num_threads or AVAILABLE_CORES, len(trainable)))
    opts = [AdamW(g, lr=lr, weight_decay=weight_decay, no_decay=no_decay_names(g)) for g in groups]
    warmup = max(1, steps // 10) if warmup is None else warmup
    eval_texts, eval_labels, eval_words = make_sentences("heldout", eval_size, np.random.default_rng(seq_eval))
    history: dict[str, list] = {"step": [], "loss": [], "accuracy": [], "grad_norm": [], "lr": []}

    with blas_single_threaded():
        example = {"text": eval_texts[0], "word": eval_words[0], "tokens": model.tokenize(eval_texts[0]).tokens[0]}
        example["before"] = _attentions(clf, example["text"])
        accuracy_before = evaluate(clf, eval_texts, eval_labels, num_threads=num_threads)
        if log:
            log(f"held-out accuracy before fine-tuning: {accuracy_before:.3f} ({eval_size} sentences)")
        for step in range(steps):
            texts, labels, _ = make_sentences("train", batch_size, data_rng)
            step_lr = lr * warmup_linear(step, steps, warmup)
            loss, logits, grads, _ = clf.loss_and_grads(
                model.tokenize(texts), labels, dropout, drop_rng, num_threads, names=list(trainable)
            )  # only the trainable parameters' gradients: the frozen table's is not summed over the bands
            norm = clipped_step(opts, grads, max_grad_norm, step_lr)
            accuracy = float((logits.argmax(-1) == labels).mean())
            for key, value in zip(history, (step + 1, loss, accuracy, norm, step_lr)):
                history[key].append(value)
            if log and ((step + 1) % log_every == 0 or step in (0, steps - 1)):
                log(f"step {step + 1:4d}/{steps}  loss {loss:.4f}  accuracy {accuracy:.3f}  grad norm {norm:.2f}")
        accuracy = evaluate(clf, eval_texts, eval_labels, num_threads=num_threads)
        example["after"] = _attentions(clf, example["text"])
    config = dict(task=TASK, steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, weight_decay=weight_decay,
                  max_grad_norm=max_grad_norm, dropout=dropout, eval_size=eval_size, seed=seed)  # fmt: skip
    return FinetuneResult(clf, history, accuracy, accuracy_before, example, config)
