"""Learn by training: the tiny attention model (``models.tiny.TinyAttentionModel``: embeddings, one
self-attention layer with a residual, a read-out; every piece a forward/backward pair) trained end
to end with the hand-written backward.

The toy tasks have a known answer: to ``reverse`` a sequence, output i must read input L-1-i (an
anti-diagonal attention map); to ``shift`` it by k, output i reads input i-k (a shifted diagonal,
wrapping around). The match must come from *positions*, not token values: only the learned position
embedding tells the query at i which key is at L-1-i, so that is what the attention learns.

The optimizers (SGD with momentum, Adam with bias correction) and clipping by global norm are in
``mha_numpy.optim``, formula for formula as torch's, so that a torch copy of the model trains to the same
numbers (tests/test_train.py, notebooks/07).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ._checks import as_generator, as_int, as_number
from .models.layers import softmax_cross_entropy_forward
from .models.tiny import TinyAttentionModel
from .optim import SGD, Adam, clip_grad_norm, global_norm
from .threads import blas_single_threaded

# --------------------------------------------------------------------------- toy tasks

TASKS = ("reverse", "shift")


def make_batch(
    task: str, rng: np.random.Generator, batch_size: int, length: int, vocab_size: int, shift: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids and the task's answer: -> tokens (B, L), targets (B, L), both int64.

    reverse: targets[:, i] = tokens[:, L-1-i].   shift: targets[:, i] = tokens[:, (i - shift) mod L].
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    rng, shift = as_generator(rng), as_int(shift, "shift")
    batch_size, length = as_int(batch_size, "batch_size", minimum=1), as_int(length, "length", minimum=1)
    vocab_size = as_int(vocab_size, "vocab_size", minimum=1)
    tokens = rng.integers(0, vocab_size, size=(batch_size, length))  # (B, L)
    targets = tokens[:, ::-1] if task == "reverse" else np.roll(tokens, shift, axis=1)  # (B, L)
    return tokens, np.ascontiguousarray(targets)


def ideal_attention(task: str, length: int, shift: int = 1) -> np.ndarray:
    """(L, L) map with a 1 where output (query) i must read input (key) j: the pattern to learn."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    length, shift = as_int(length, "length", minimum=1), as_int(shift, "shift")
    i = np.arange(length)
    j = length - 1 - i if task == "reverse" else (i - shift) % length
    ideal = np.zeros((length, length))
    ideal[i, j] = 1.0
    return ideal


def attention_share(attn: np.ndarray, ideal: np.ndarray) -> float:
    """Fraction of the attention mass on the ideal keys, averaged over queries (and heads): 1 = perfect.

    attn: (..., L, L) weights whose rows sum to 1; ideal: (L, L) 0/1.
    """
    return float((attn * ideal).sum(axis=-1).mean())


# --------------------------------------------------------------------------- training loop


@dataclass
class TrainResult:
    """What ``train`` returns.

    history: lists per step: "step", "loss", "accuracy" (token accuracy on that step's batch),
        "grad_norm" (before clipping).
    attention: (H, L, L) final attention weights averaged over the evaluation batch.
    snapshots: step -> (H, L, L) the same average at that moment (step 0 = before training).
    accuracy: final token accuracy on the held-out evaluation batch.
    ideal: (L, L) the task's ideal attention map.
    """

    model: TinyAttentionModel
    task: str
    history: dict[str, list]
    attention: np.ndarray
    snapshots: dict[int, np.ndarray]
    accuracy: float
    ideal: np.ndarray
    config: dict = field(default_factory=dict)


def evaluate(model: TinyAttentionModel, tokens: np.ndarray, targets: np.ndarray) -> tuple[float, float, np.ndarray]:
    """-> (loss, token accuracy, (H, L, L) attention weights averaged over the batch)."""
    logits, cache = model.forward(tokens)
    loss, _ = softmax_cross_entropy_forward(logits, targets)
    accuracy = float((logits.argmax(axis=-1) == targets).mean())
    return loss, accuracy, cache.attn_weights.mean(axis=0)


def one_blas_thread():
    """A context that runs NumPy's BLAS on one thread (shared with the chunked kernel's own limit).

    The matrices here are tiny (B·L × E); several BLAS threads only add synchronisation, which on a
    busy machine makes training 10x slower or worse.
    """
    return blas_single_threaded()


def train_step(
    model: TinyAttentionModel,
    opt: SGD | Adam,
    tokens: np.ndarray,
    targets: np.ndarray,
    max_grad_norm: float | None = None,
) -> tuple[float, np.ndarray, float]:
    """forward, loss, backward, clip, update: -> (loss, logits (B, L, V) before the update, gradient norm)."""
    loss, logits, grads, _ = model.loss_and_grads(tokens, targets)
    norm = global_norm(grads)  # before clipping, as clip_grad_norm_ reports it
    if max_grad_norm is not None:
        grads, _ = clip_grad_norm(grads, max_grad_norm)
    opt.step(grads)
    return loss, logits, norm


def train(
    task: str = "reverse",
    *,
    length: int = 8,
    vocab_size: int = 10,
    embed_dim: int = 32,
    num_heads: int = 1,
    steps: int = 300,
    batch_size: int = 64,
    optimizer: str = "adam",
    lr: float = 3e-3,
    momentum: float = 0.9,
    max_grad_norm: float | None = 1.0,
    shift: int = 1,
    seed: int = 0,
    log_every: int = 50,
    snapshot_steps: tuple[int, ...] | None = None,
    eval_size: int = 1000,
    log: Callable[[str], None] | None = print,
    block: str | None = None,
) -> TrainResult:
    """Train a ``TinyAttentionModel`` on a toy task with fresh random batches; print progress via ``log``.

    optimizer: "adam" or "sgd" (with ``momentum``). max_grad_norm: clip by global norm (None: no clipping).
    snapshot_steps: steps after which to store the attention maps (default: 0, i.e. before training,
    and after 5%, 15%, 40% and 100% of the steps). The seed fixes the initial weights, every batch
    and the held-out evaluation batch (``eval_size`` sequences) behind ``accuracy`` and the maps.
    block: None (attention + residual) or "post" / "pre": a full Transformer block (LayerNorm, feed-forward).
    """
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    steps, batch_size = as_int(steps, "steps", minimum=1), as_int(batch_size, "batch_size", minimum=1)
    eval_size, log_every = as_int(eval_size, "eval_size", minimum=1), as_int(log_every, "log_every", minimum=1)
    seed, shift = as_int(seed, "seed", minimum=0), as_int(shift, "shift")  # SeedSequence: no negative seed
    lr, momentum = as_number(lr, "lr", positive=True), as_number(momentum, "momentum", minimum=0)
    max_grad_norm = None if max_grad_norm is None else as_number(max_grad_norm, "max_grad_norm", positive=True)
    if snapshot_steps is not None:
        if not isinstance(snapshot_steps, (tuple, list, range, set, frozenset, np.ndarray)):
            raise ValueError(f"snapshot_steps must be a sequence of steps or None, got {snapshot_steps!r:.60}")
        snapshot_steps = tuple(as_int(s, f"snapshot_steps[{i}]", minimum=0) for i, s in enumerate(snapshot_steps))
    if log is not None and not callable(log):
        raise ValueError(f"log must be a function of one str, or None; got {log!r:.60}")
    seq_init, seq_data, seq_eval = np.random.SeedSequence(seed).spawn(3)
    data_rng = np.random.default_rng(seq_data)
    model = TinyAttentionModel(
        vocab_size, length, embed_dim, num_heads, rng=np.random.default_rng(seq_init), block=block
    )
    opt = Adam(model.params, lr=lr) if optimizer == "adam" else SGD(model.params, lr=lr, momentum=momentum)
    eval_tokens, eval_targets = make_batch(task, np.random.default_rng(seq_eval), eval_size, length, vocab_size, shift)
    if snapshot_steps is None:
        snapshot_steps = tuple(sorted({0, *(int(round(steps * f)) for f in (0.05, 0.15, 0.4, 1.0))}))
    history: dict[str, list] = {"step": [], "loss": [], "accuracy": [], "grad_norm": []}
    snapshots: dict[int, np.ndarray] = {}

    with one_blas_thread():
        if 0 in snapshot_steps:
            snapshots[0] = evaluate(model, eval_tokens, eval_targets)[2]
        for step in range(1, steps + 1):
            tokens, targets = make_batch(task, data_rng, batch_size, length, vocab_size, shift)
            loss, logits, norm = train_step(model, opt, tokens, targets, max_grad_norm)
            accuracy = float((logits.argmax(axis=-1) == targets).mean())  # before this step's update
            for key, value in zip(history, (step, loss, accuracy, norm)):
                history[key].append(value)
            if step in snapshot_steps:
                snapshots[step] = evaluate(model, eval_tokens, eval_targets)[2]
            if log is not None and (step % log_every == 0 or step in (1, steps)):
                log(f"step {step:5d}  loss {loss:.4f}  accuracy {accuracy:.3f}  grad norm {norm:.3f}")
        _, accuracy, attention = evaluate(model, eval_tokens, eval_targets)

    config = dict(
        task=task, length=length, vocab_size=vocab_size, embed_dim=embed_dim, num_heads=num_heads, steps=steps,
        batch_size=batch_size, optimizer=optimizer, lr=lr, max_grad_norm=max_grad_norm, shift=shift, seed=seed,
        block=block,
    )  # fmt: skip
    ideal = ideal_attention(task, length, shift)
    return TrainResult(model, task, history, attention, snapshots, accuracy, ideal, config)
