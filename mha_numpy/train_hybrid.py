"""Train the hybrid decoder (``models.hybrid.HybridModel``) with the hand-written backward on notebook 07's task,
``reverse``, as a decoder sees it: the sequence, a separator, then the sequence reversed, one token a step.

    input:   x_0 x_1 ... x_{L-1} SEP y_0 ... y_{L-2}          (B, 2L)   y = x reversed, SEP = vocab_size
    target:                      y_0 y_1 ... y_{L-1}          (B, L)    the loss on the last L positions only

Notebook 07's layer sees the whole sequence at once (no mask) and reads input L-1-i at output i; a causal decoder
cannot see ahead, so the question comes first and the answer after it, as a language model is prompted. The held-out
accuracy is measured twice: token accuracy with the true previous tokens fed in (teacher forcing, as the loss), and
whole reversals produced by ``generate``, the prompt in one call and then one token a call through every layer's
cache (KV cache for attention, conv + recurrent state for Gated DeltaNet).

    python -m mha_numpy.train_hybrid                                 # linear_attention,full_attention; 250 steps
    python -m mha_numpy.train_hybrid --layer-types full_attention,linear_attention,linear_attention --steps 800

or ``train_hybrid(...)`` from Python. Adam with a learning rate falling linearly to 0, clipping by global norm 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._checks import as_generator, as_int, as_number
from .models.hybrid import HybridConfig, HybridModel
from .optim import Adam, clip_grad_norm, global_norm
from .threads import blas_single_threaded


def reverse_prompt_batch(rng, batch_size: int, length: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """-> input_ids (B, 2L) [x, SEP, y without its last token], targets (B, L) y = x reversed; SEP = vocab_size."""
    rng = as_generator(rng)
    B, L, V = (as_int(v, n, minimum=1) for v, n in ((batch_size, "batch_size"), (length, "length"),
                                                    (vocab_size, "vocab_size")))  # fmt: skip
    x = rng.integers(0, V, size=(B, L))  # (B, L)
    y = np.ascontiguousarray(x[:, ::-1])  # (B, L)
    ids = np.concatenate([x, np.full((B, 1), V), y[:, :-1]], axis=1)  # (B, 2L)
    return ids, y


@dataclass
class HybridTrainResult:
    """model; history: lists per step "step", "loss", "grad_norm"; token_accuracy: held-out, teacher-forced;
    sequence_accuracy: held-out reversals generated with the caches that are exactly right; config: the arguments."""

    model: HybridModel
    history: dict[str, list]
    token_accuracy: float
    sequence_accuracy: float
    config: dict


def evaluate(model: HybridModel, length: int, ids: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
    """-> (teacher-forced token accuracy, share of whole reversals right when generated through the caches)."""
    L = length
    tokens = float((model(ids)[:, L:].argmax(axis=-1) == targets).mean())  # (B, L) predictions of y
    generated = model.generate(ids[:, : L + 1], L)  # (B, L): prompt x, SEP; then one token a call
    return tokens, float((generated == targets).all(axis=1).mean())


def train_hybrid(
    layer_types=("linear_attention", "full_attention"),
    *,
    length: int = 8,
    vocab_size: int = 10,
    hidden_size: int = 32,
    steps: int = 250,
    batch_size: int = 32,
    lr: float = 6e-3,
    seed: int = 0,
    eval_size: int = 1000,
    log_every: int = 50,
    log: Callable[[str], None] | None = print,
) -> HybridTrainResult:
    """Train a ``HybridModel`` of ``layer_types`` on reversal (module docstring); print progress through ``log``.

    Two heads of width hidden_size / 2 in every mixer (attention: no grouping; Gated DeltaNet: two key and two value
    heads), an MLP of 2·hidden_size. The seed fixes the initial weights, every batch and the held-out set.
    """
    steps, batch_size = as_int(steps, "steps", minimum=1), as_int(batch_size, "batch_size", minimum=1)
    length, vocab_size = as_int(length, "length", minimum=1), as_int(vocab_size, "vocab_size", minimum=1)
    hidden_size, seed = as_int(hidden_size, "hidden_size", minimum=2), as_int(seed, "seed", minimum=0)
    eval_size, log_every = as_int(eval_size, "eval_size", minimum=1), as_int(log_every, "log_every", minimum=1)
    lr = as_number(lr, "lr", positive=True)
    if hidden_size % 2:
        raise ValueError(f"hidden_size must be even (two heads of hidden_size / 2), got {hidden_size}")
    half = hidden_size // 2
    config = HybridConfig(vocab_size=vocab_size + 1, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                          layer_types=tuple(layer_types), num_attention_heads=2, num_key_value_heads=2,
                          linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=half,
                          linear_value_head_dim=half, chunk_size=2 * length)  # fmt: skip
    seq_init, seq_data, seq_eval = np.random.SeedSequence(seed).spawn(3)
    model = HybridModel.random(config, rng=np.random.default_rng(seq_init))
    data = np.random.default_rng(seq_data)
    held_out = reverse_prompt_batch(np.random.default_rng(seq_eval), eval_size, length, vocab_size)
    opt = Adam(model.params, lr=lr)
    history: dict[str, list] = {"step": [], "loss": [], "grad_norm": []}
    with blas_single_threaded():  # tiny matrices: BLAS threads only add synchronisation
        for step in range(1, steps + 1):
            opt.lr = lr * (1 - (step - 1) / steps)  # linear decay to 0
            ids, targets = reverse_prompt_batch(data, batch_size, length, vocab_size)
            loss, _, grads = model.loss_and_grads(ids, targets, slice(length, 2 * length))
            norm = global_norm(grads)
            opt.step(clip_grad_norm(grads, 1.0, norm)[0])
            for key, value in zip(history, (step, loss, norm)):
                history[key].append(value)
            if log is not None and (step % log_every == 0 or step in (1, steps)):
                log(f"step {step:5d}  loss {loss:.4f}  grad norm {norm:.3f}")
        tokens, sequences = evaluate(model, length, *held_out)
    if log is not None:
        log(f"held-out: token accuracy {tokens:.4f}, whole reversals generated with the caches {sequences:.4f}")
    args = dict(layer_types=list(config.layer_types), length=length, vocab_size=vocab_size, hidden_size=hidden_size,
                steps=steps, batch_size=batch_size, lr=lr, seed=seed)  # fmt: skip
    return HybridTrainResult(model, history, tokens, sequences, args)


def main(argv=None) -> int:
    """The command line (module docstring): a mistake is one line and exit status 2."""
    parser = argparse.ArgumentParser(prog="python -m mha_numpy.train_hybrid", description=__doc__.split("\n")[0])
    parser.add_argument("--layer-types", default="linear_attention,full_attention",
                        help="comma-separated layer kinds, in order (models.hybrid.LAYER_KINDS)")  # fmt: skip
    for name, default in (("length", 8), ("vocab-size", 10), ("hidden-size", 32), ("steps", 250),
                          ("batch-size", 32), ("seed", 0)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--lr", type=float, default=6e-3)
    a = parser.parse_args(argv)
    try:
        result = train_hybrid(a.layer_types.split(","), length=a.length, vocab_size=a.vocab_size,
                              hidden_size=a.hidden_size, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                              seed=a.seed)  # fmt: skip
    except ValueError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0 if result.token_accuracy > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
