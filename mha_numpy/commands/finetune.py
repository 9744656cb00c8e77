"""``python -m mha_numpy finetune``: fine-tune the pretrained all-MiniLM-L6-v2 on a sentence task, in NumPy.

Prints the progress (step, loss, batch accuracy), writes the loss curve and one head's attention before vs after
as PNG, and ends with ``RESULT: task=sentiment accuracy=<accuracy on held-out sentences>``. The weights on disk are
never changed.
"""

from __future__ import annotations

import argparse
import time

from .._optional import require
from ._args import (
    UsageError,
    make_dir,
    nonnegative_float,
    nonnegative_int,
    output_dir,
    positive_float,
    positive_int,
    writing,
)


def add_parser(sub) -> None:
    """Add the ``finetune`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "finetune",
        help="fine-tune the real MiniLM (all 6 layers, hand-written backward, AdamW) on a sentence task",
        description="Fine-tune all-MiniLM-L6-v2 in NumPy on generated sentences whose label (positive/negative) "
        "depends on one adjective; held-out sentences use unseen templates, adjectives and nouns. Mean pooling + a "
        "linear head, AdamW with warm-up, gradient clipping, dropout; the word-embedding table stays frozen. "
        "Writes finetune_loss.png and finetune_attention.png.",
    )
    p.add_argument(
        "--steps", type=positive_int, default=60, help="training steps (default %(default)s: ~20 s on 2 idle cores)"
    )
    p.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of head, batches, dropout (default %(default)s)"
    )
    p.add_argument("--out", metavar="DIR", type=output_dir, default=".", help="directory for the PNGs (default: .)")
    p.add_argument("--batch", type=positive_int, default=16, help="sentences per step (default %(default)s)")
    p.add_argument("--lr", type=positive_float, default=1e-4, help="peak learning rate (default %(default)s)")
    p.add_argument("--weight-decay", type=nonnegative_float, default=0.01, help="AdamW decay (default %(default)s)")
    p.add_argument("--clip", type=positive_float, default=1.0, help="max global gradient norm (default %(default)s)")
    p.add_argument("--eval-size", type=positive_int, default=256, help="held-out sentences (default %(default)s)")
    p.add_argument("--float64", action="store_true", help="run in float64 (slower; default float32)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Fine-tune MiniLM on the sentence task, write the loss curve and the before/after attention to ``--out``, print
    the held-out accuracy; 0.
    """
    require("matplotlib", "finetune (it draws the loss curve and the attention maps)")  # before, not after, training
    make_dir("--out", args.out)
    import numpy as np

    from ..finetune import TASK, finetune
    from ..models.bert import BertModel

    start = time.perf_counter()
    try:
        model = BertModel.from_pretrained(dtype=np.float64 if args.float64 else np.float32)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    print(f"fine-tuning MiniLM ({model.config.num_hidden_layers} layers) on '{TASK}': {args.steps} steps of "
          f"{args.batch} sentences, seed {args.seed}")  # fmt: skip
    result = finetune(
        model, steps=args.steps, batch_size=args.batch, lr=args.lr, weight_decay=args.weight_decay,
        max_grad_norm=args.clip, eval_size=args.eval_size, seed=args.seed,
        log_every=max(1, args.steps // 12),
    )  # fmt: skip
    print(f"done in {time.perf_counter() - start:.0f} s")

    from ..viz import plot_training_history  # matplotlib only here
    from ..viz.finetune import plot_attention_before_after

    ex = result.example
    loss_fig = plot_training_history(result.history, title=f"Fine-tuning MiniLM on '{TASK}'")
    loss_fig.axes[1].set_ylabel("sentence accuracy (batch)")
    figures = {
        "finetune_loss.png": loss_fig,
        "finetune_attention.png": plot_attention_before_after(ex["before"], ex["after"], ex["tokens"], ex["word"]),
    }
    with writing("--out", args.out):
        for name, fig in figures.items():
            fig.savefig(args.out / name, dpi=100)
    for name in figures:
        print(f"wrote {args.out / name}")
    print(f"held-out accuracy {result.accuracy_before:.3f} before, {result.accuracy:.3f} after")
    print(f"RESULT: task={TASK} accuracy={result.accuracy:.4f} (held-out sentences: unseen templates and words)")
    return 0
