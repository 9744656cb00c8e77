"""Train the capstone's GPT (``models/gpt.py``) on the corpus (``data/corpus.py``), bytes in, bytes out.

One step: B windows of L + 1 bytes at random places of the training text, ``loss_and_grads`` (the hand-written
backward), the global gradient norm clipped, Adam with a linear warm-up and a cosine decay to a tenth. The
validation loss is measured the way the bigram baseline is: every byte of the validation text but the first,
predicted from what precedes it inside windows of L + 1 bytes that overlap by one (``evaluate``), so both numbers
average -log p over the same N - 1 bytes. BLAS runs on one thread (``threads.blas_single_threaded``): at these
sizes more threads only add waiting, badly so on a shared machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ._checks import as_generator
from .models.gpt import GPT, GPTConfig
from .optim import Adam, clip_grad_norm
from .threads import blas_single_threaded


def random_windows(ids: np.ndarray, batch: int, length: int, rng) -> np.ndarray:
    """(batch, length + 1) windows of ``ids`` starting at uniformly random places."""
    if len(ids) < length + 1:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one window of length + 1 = {length + 1}")
    starts = as_generator(rng).integers(0, len(ids) - length, size=batch)  # (B,)
    return ids[starts[:, None] + np.arange(length + 1)]  # (B, 1) + (L + 1,) -> (B, L + 1)


def evaluate(model: GPT, ids: np.ndarray, batch: int = 64) -> float:
    """The mean cross-entropy (nats) of every token of ``ids`` but the first, each predicted from the tokens before it
    in its window (windows of L + 1 tokens, stride L; the last window may be shorter)."""
    L = model.config.context
    windows = [ids[s : s + L + 1] for s in range(0, len(ids) - 1, L)]  # each (L + 1,), the last maybe shorter
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        group = windows[i : i + batch]
        same = [group] if len(group[-1]) == L + 1 else [group[:-1], group[-1:]]  # the short tail on its own
        for part in (np.stack(p) for p in same if p):  # (b, l + 1)
            n = part.shape[0] * (part.shape[1] - 1)  # the tokens predicted
            total += model.loss(part) * n  # the mean back to a sum
            count += n
    return total / count


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine from ``lr`` down to lr / 10 at the last step (1-based)."""
    if step <= warmup:
        return lr * step / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@dataclass
class GPTRun:
    """What ``train_gpt`` returns: the model, the history (step, train loss, validation loss on a fixed sample, lr,
    seconds), the final validation loss on the whole validation text, the seconds of the whole run."""

    model: GPT
    history: dict[str, list] = field(default_factory=dict)
    val_loss: float = math.nan
    seconds: float = math.nan


def train_gpt(
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    config: GPTConfig,
    *,
    steps: int,
    batch: int = 32,
    lr: float = 3e-3,
    warmup: int = 50,
    clip: float = 1.0,
    seed: int = 0,
    eval_every: int = 100,
    eval_windows: int = 64,
    on_step: Callable[[int, dict], None] | None = None,
    grads_fn: Callable | None = None,
) -> GPTRun:
    """Train a fresh ``GPT(config)`` for ``steps`` steps; ``on_step(step, row)`` after each (for a progress bar).

    Every ``eval_every`` steps (and at the last) the validation loss of ``eval_windows`` fixed windows is logged;
    at the end, ``evaluate`` on the whole validation text. ``grads_fn(model, windows) -> (loss, grads)`` replaces
    ``model.loss_and_grads`` (the exercise trains with the student's backward through it).
    """
    start = time.perf_counter()
    seq_init, seq_data, seq_val = np.random.SeedSequence(seed).spawn(3)
    model = GPT(config, rng=np.random.default_rng(seq_init))
    opt = Adam(model.params, lr=lr)
    data_rng = np.random.default_rng(seq_data)
    fixed_val = random_windows(val_ids, eval_windows, config.context, np.random.default_rng(seq_val))
    step_fn = grads_fn or (lambda m, w: m.loss_and_grads(w))
    history: dict[str, list] = {"step": [], "loss": [], "val_step": [], "val_loss": [], "lr": [], "seconds": []}
    with blas_single_threaded():
        for step in range(1, steps + 1):
            opt.lr = lr_at(step, steps, lr, warmup)
            loss, grads = step_fn(model, random_windows(train_ids, batch, config.context, data_rng))
            if clip:
                grads, _ = clip_grad_norm(grads, clip)
            opt.step(grads)
            row = {"step": step, "loss": loss, "lr": opt.lr, "seconds": time.perf_counter() - start}
            for key in ("step", "loss", "lr", "seconds"):
                history[key].append(row[key])
            if step % eval_every == 0 or step == steps:
                row["val_loss"] = model.loss(fixed_val)
                history["val_step"].append(step)
                history["val_loss"].append(row["val_loss"])
            if on_step is not None:
                on_step(step, row)
        val = evaluate(model, val_ids)
    return GPTRun(model, history, val, time.perf_counter() - start)
