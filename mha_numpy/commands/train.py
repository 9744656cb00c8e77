"""``python -m mha_numpy train``: train the tiny attention model on a toy task, with our hand-written backward.

It prints the progress (step, loss, accuracy), writes the loss curve and the attention maps (learned
next to the ideal pattern, and at a few moments during training) as PNG, and ends with a line
``RESULT: task=... accuracy=<token accuracy on held-out sequences>``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from .._optional import require
from ..train import TASKS, attention_share, make_batch, train
from ._args import (
    check_heads,
    make_dir,
    nonnegative_float,
    nonnegative_int,
    output_dir,
    positive_float,
    positive_int,
    writing,
)
from ._html import add_html_arg, write_page


def add_parser(sub) -> None:
    """Add the ``train`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "train",
        help="train a one-layer attention model on reverse/shift and draw the attention it learns",
        description="Train token + position embeddings, one self-attention layer with a residual and a "
        "read-out, by the hand-written backward and Adam (or SGD). The tasks have a known answer: reverse "
        "(output i reads input L-1-i: an anti-diagonal map) and shift (output i reads input i-k). "
        "Writes the loss curve and the learned attention next to the ideal pattern as PNG.",
    )
    p.add_argument("--task", choices=TASKS, default="reverse", help="toy task (default %(default)s)")
    p.add_argument("--steps", type=positive_int, default=300, help="training steps (default %(default)s)")
    p.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of the weights and batches (default %(default)s)"
    )
    p.add_argument("--out", metavar="DIR", type=output_dir, default=None, help="directory for the PNG files, "
                   "created when missing (default: current; with --html alone, no PNG files)")  # fmt: skip
    add_html_arg(p, "the trained model on one held-out sequence")
    g = p.add_argument_group("model and data")
    g.add_argument("--length", type=positive_int, default=8, help="sequence length L (default %(default)s)")
    g.add_argument("--vocab", type=positive_int, default=10, help="vocabulary size V (default %(default)s)")
    g.add_argument("--embed-dim", type=positive_int, default=32, help="embed dim E (default %(default)s)")
    g.add_argument("--heads", type=positive_int, default=1, help="number of heads H (default %(default)s)")
    g.add_argument("--shift", type=int, default=1, help="k for --task shift (default %(default)s)")
    g.add_argument(
        "--block",
        choices=("none", "post", "pre"),
        default="none",
        help="none: attention + residual; post / pre: a full Transformer block with LayerNorm and feed-forward "
        "(post- or pre-norm) (default %(default)s)",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="(default %(default)s)")
    g.add_argument("--lr", type=positive_float, default=None, help="learning rate (default 3e-3 for adam, 0.1 for sgd)")
    g.add_argument("--batch", type=positive_int, default=64, help="sequences per step (default %(default)s)")
    g.add_argument(
        "--clip", type=nonnegative_float, default=1.0, help="max global gradient norm, 0 = off (default %(default)s)"
    )
    g.add_argument(
        "--log-every", type=positive_int, default=50, help="print progress every N steps (default %(default)s)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Train the tiny model on ``args.task``, write its loss and attention figures (and the --html page), print the
    held-out accuracy; 0.
    """
    check_heads(args.embed_dim, args.heads)
    require("matplotlib", "train (it draws the loss curve and the attention maps)")  # before, not after, training
    if args.out is None and not args.html:
        args.out = Path(".")
    if args.out is not None:
        make_dir("--out", args.out)
    lr = args.lr if args.lr is not None else (3e-3 if args.optimizer == "adam" else 0.1)
    print(
        f"task {args.task}: length {args.length}, vocabulary {args.vocab}, E={args.embed_dim}, H={args.heads}, "
        f"{args.optimizer} lr={lr:g}, batch {args.batch}, clip {args.clip or 'off'}, {args.steps} steps, "
        f"seed {args.seed}"
    )
    start = time.perf_counter()
    result = train(
        args.task,
        length=args.length,
        vocab_size=args.vocab,
        embed_dim=args.embed_dim,
        num_heads=args.heads,
        steps=args.steps,
        batch_size=args.batch,
        optimizer=args.optimizer,
        lr=lr,
        max_grad_norm=args.clip or None,
        shift=args.shift,
        seed=args.seed,
        log_every=args.log_every,
        block=None if args.block == "none" else args.block,
    )
    seconds = time.perf_counter() - start
    share = attention_share(result.attention, result.ideal)
    print(f"trained in {seconds:.1f} s; {share:.1%} of the attention lands where the ideal map points")

    from ..viz import plot_attention_over_training, plot_training_history  # matplotlib only here

    out = args.out
    what = f"{args.task}" + (f" by {args.shift}" if args.task == "shift" else "")
    figures = {
        f"train_{args.task}_loss.png": plot_training_history(result.history, title=f"Training on {what}"),
        f"train_{args.task}_attention.png": plot_attention_over_training(
            {args.steps: result.attention}, result.ideal, title=f"{what}: learned attention next to the ideal"
        ),
        f"train_{args.task}_snapshots.png": plot_attention_over_training(
            result.snapshots, result.ideal, title=f"{what}: attention during training (rows: queries, cols: keys)"
        ),
    }
    if out is not None:  # --html alone writes only the page
        with writing("--out", out):
            for name, fig in figures.items():
                fig.savefig(out / name, dpi=100)
        for name in figures:
            print(f"wrote {out / name}")
    if args.html:
        from ..viz import explore_tiny

        rng = np.random.default_rng(args.seed + 12345)  # a sequence the training batches did not fix
        tokens, _ = make_batch(args.task, rng, 1, args.length, args.vocab, args.shift)
        page = explore_tiny(result.model, tokens[0], title=f"{what}: the trained model on one sequence (position:id)")
        if write_page(args.html, page):
            return 2
    print(f"RESULT: task={args.task} accuracy={result.accuracy:.4f} (token accuracy on held-out sequences)")
    return 0
