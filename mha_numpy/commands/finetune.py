"""``python -m mha_numpy finetune``: fine-tune the pretrained all-MiniLM-L6-v2 on a sentence task, in NumPy.

Prints the progress (step, loss, batch accuracy), writes the loss curve and one head's attention before vs after
as PNG, and ends with ``RESULT: task=sentiment accuracy=<accuracy on held-out sentences>``. The weights on disk are
never changed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune the real MiniLM (all 6 layers, hand-written backward, AdamW) on a sentence task",
        description="Fine-tune all-MiniLM-L6-v2 in NumPy on generated sentences whose label (positive/negative) "
        "depends on one adjective; held-out sentences use unseen templates, adjectives and nouns. Mean pooling + a "
        "linear head, AdamW with warm-up, gradient clipping, dropout; the word-embedding table stays frozen. "
        "Writes finetune_loss.png and finetune_attention.png.",
    )
    p.add_argument("--steps", type=int, default=60, help="training steps (default %(default)s, ~2 min on 2 cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of the head, batches and dropout (default %(default)s)")
    p.add_argument("--out", metavar="DIR", default=".", help="directory for the PNG files (default: current)")
    p.add_argument("--batch", type=int, default=16, help="sentences per step (default %(default)s)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default %(default)s)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default %(default)s)")
    p.add_argument("--clip", type=float, default=1.0, help="max global gradient norm (default %(default)s)")
    p.add_argument("--eval-size", type=int, default=256, help="held-out sentences (default %(default)s)")
    p.add_argument("--float64", action="store_true", help="run in float64 (slower; default float32)")
    p.set_defaults(run=run)


def _usage_error(args: argparse.Namespace) -> str | None:
    for name in ("steps", "batch", "eval_size"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    if not args.lr > 0 or not args.clip > 0 or args.weight_decay < 0:
        return f"--lr and --clip must be > 0 and --weight-decay >= 0, got {args.lr}, {args.clip}, {args.weight_decay}"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem:
        print(f"finetune: error: {problem}", file=sys.stderr)
        return 2
    import numpy as np

    from ..bert import BertModel
    from ..finetune import TASK, finetune

    start = time.perf_counter()
    try:
        model = BertModel.from_pretrained(dtype=np.float64 if args.float64 else np.float32)
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        print(f"finetune: error: {exc}", file=sys.stderr)
        return 2
    print(f"fine-tuning {model!r} on '{TASK}': {args.steps} steps of {args.batch} sentences, seed {args.seed}")
    result = finetune(
        model, steps=args.steps, batch_size=args.batch, lr=args.lr, weight_decay=args.weight_decay,
        max_grad_norm=args.clip, eval_size=args.eval_size, seed=args.seed,
        log_every=max(1, args.steps // 12),
    )  # fmt: skip
    print(f"done in {time.perf_counter() - start:.0f} s")

    from ..viz import plot_training_history  # matplotlib only here
    from ..viz.finetune import plot_attention_before_after

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ex = result.example
    figures = {
        "finetune_loss.png": plot_training_history(result.history, title=f"Fine-tuning MiniLM on '{TASK}'"),
        "finetune_attention.png": plot_attention_before_after(ex["before"], ex["after"], ex["tokens"], ex["word"]),
    }
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=100)
        print(f"wrote {out / name}")
    print(f"held-out accuracy {result.accuracy_before:.3f} before, {result.accuracy:.3f} after")
    print(f"RESULT: task={TASK} accuracy={result.accuracy:.4f} (held-out sentences: unseen templates and words)")
    return 0
