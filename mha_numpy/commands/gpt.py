"""``python -m mha_numpy gpt``: the capstone. Train a small GPT on the King James Bible, bytes in, bytes out, with
the hand-written backward, beat the best bigram by the stated margin, and sample text.

It prints the best bigram's validation cross-entropy (the baseline), a progress bar, the validation loss, a
sample, writes the loss curve (``gpt_loss.png``) and ends with a line ``RESULT: val_loss=... bigram=... ratio=...
target=... seconds=...``. The defaults are the measured run of docs/course.md (the capstone's targets).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .._optional import require
from ._args import UsageError, check_heads, make_dir, nonnegative_int, output_dir, positive_float, positive_int, writing

TARGET = 0.75  # the model's validation cross-entropy must be at most 75 % of the best bigram's


def add_parser(sub) -> None:
    """Add the ``gpt`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "gpt",
        help="train a small GPT on the King James Bible (bytes) with the hand-written backward, then sample",
        description="Train a decoder-only language model (RoPE attention, RMSNorm, SwiGLU; models/gpt.py) on the "
        "King James Bible as the package bible-cli ships it, one byte per token, by the hand-written backward and "
        "Adam. Compares its validation cross-entropy with the best bigram model's on the same split (target: "
        f"at most {TARGET:.0%} of it), writes the loss curve and prints a sample.",
    )
    p.add_argument("--steps", type=positive_int, default=600, help="training steps (default %(default)s)")
    p.add_argument("--batch", type=positive_int, default=32, help="windows per step (default %(default)s)")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="peak learning rate (default %(default)s)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="weights and batches (default %(default)s)")
    p.add_argument("--out", metavar="DIR", type=output_dir, default=Path("."), help="directory for gpt_loss.png, "
                   "created when missing (default: current)")  # fmt: skip
    g = p.add_argument_group("model")
    g.add_argument("--context", type=positive_int, default=64, help="context length L in bytes (default %(default)s)")
    g.add_argument("--hidden", type=positive_int, default=128, help="width E (default %(default)s)")
    g.add_argument("--layers", type=positive_int, default=3, help="blocks N (default %(default)s)")
    g.add_argument("--heads", type=positive_int, default=4, help="heads H (default %(default)s)")
    g = p.add_argument_group("data and sampling")
    g.add_argument("--train-bytes", type=positive_int, default=None, help="use only the first N bytes of the "
                   "training split (default: all, 3.7 MB)")  # fmt: skip
    g.add_argument("--val-bytes", type=positive_int, default=None, help="use only the first N bytes of the "
                   "validation split (default: all, 0.4 MB)")  # fmt: skip
    g.add_argument("--sample", type=nonnegative_int, default=300, help="bytes to sample (default %(default)s)")
    g.add_argument("--prompt", default="And God said", help="the sample's start (default %(default)r)")
    g.add_argument("--temperature", type=positive_float, default=0.8, help="sampling (default %(default)s)")
    p.set_defaults(run=run)


def _bar(step: int, steps: int, row: dict, width: int = 30) -> str:
    done = int(width * step / steps)
    val = f"  val {row['val_loss']:.3f}" if "val_loss" in row else ""
    return f"[{'#' * done}{'.' * (width - done)}] {step}/{steps}  loss {row['loss']:.3f}{val}  {row['seconds']:.0f} s"


def run(args: argparse.Namespace) -> int:
    """Train, report against the bigram, sample, plot; 0 (the target is reported, not enforced)."""
    check_heads(args.hidden, args.heads)
    if not args.prompt:
        raise UsageError("--prompt must not be empty (the sample starts from it)")
    require("matplotlib", "gpt (it draws the loss curve)")
    make_dir("--out", args.out)
    from ..data import corpus as C
    from ..models.gpt import GPTConfig
    from ..train_gpt import train_gpt

    start = time.perf_counter()
    split, tok = C.load_split(), C.ByteTokenizer()
    train_ids, val_ids = tok.encode(split.train)[: args.train_bytes], tok.encode(split.validation)[: args.val_bytes]
    if min(len(train_ids), len(val_ids)) < args.context + 1:
        raise UsageError(f"--train-bytes and --val-bytes must be at least --context + 1 = {args.context + 1}")
    bigram, alpha = C.best_bigram(train_ids, val_ids)
    print(f"corpus: the King James Bible ({C.PACKAGE}), {len(train_ids):,} training and {len(val_ids):,} validation "
          f"bytes; best bigram (add-{alpha:g}): {bigram:.4f} nats, target <= {TARGET * bigram:.4f}")  # fmt: skip
    config = GPTConfig(context=args.context, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                       intermediate_size=max(16, args.hidden * 8 // 3 // 16 * 16))  # fmt: skip
    tty, every = sys.stdout.isatty(), max(1, args.steps // 10)

    def progress(step: int, row: dict) -> None:
        if tty:
            print("\r" + _bar(step, args.steps, row), end="\n" if step == args.steps else "", flush=True)
        elif step % every == 0 or step == args.steps:
            print(_bar(step, args.steps, row), flush=True)

    result = train_gpt(train_ids, val_ids, config, steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                       eval_every=every, on_step=progress)  # fmt: skip
    seconds = time.perf_counter() - start
    print(
        f"{result.model}: validation {result.val_loss:.4f} nats/byte ({result.val_loss / bigram:.1%} of the bigram's)"
    )
    if args.sample:
        ids = result.model.generate(tok.encode(args.prompt), args.sample, args.temperature, rng=args.seed)
        print("sample:\n" + tok.decode(ids))
    fig = _plot(result.history, bigram)
    with writing("--out", args.out):
        fig.savefig(args.out / "gpt_loss.png", dpi=100)
    print(f"wrote {args.out / 'gpt_loss.png'}")
    print(f"RESULT: val_loss={result.val_loss:.4f} bigram={bigram:.4f} ratio={result.val_loss / bigram:.4f} "
          f"target={TARGET} seconds={seconds:.1f}")  # fmt: skip
    return 0


def _plot(history: dict, bigram: float):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history["step"], history["loss"], lw=0.8, alpha=0.6, label="training batch")
    ax.plot(history["val_step"], history["val_loss"], "o-", label="validation (fixed windows)")
    ax.axhline(bigram, color="gray", ls="--", label=f"best bigram {bigram:.3f}")
    ax.axhline(TARGET * bigram, color="green", ls=":", label=f"target {TARGET * bigram:.3f} (75 % of the bigram)")
    ax.set(xlabel="step", ylabel="cross-entropy (nats per byte)", title="A small GPT on the King James Bible")
    ax.set_ylim(0, max(6.0, bigram + 1))
    ax.legend()
    fig.tight_layout()
    return fig
