"""``python -m mha_numpy tour``: one small example through every step, forward then backward.

It prints each step's name, shape and a few numbers, then the backward in reverse order, then the
gradient-check table. With ``--out DIR`` it also writes figures (``write_tour_figures``, drawn by
``mha_numpy.viz``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .. import functional as F
from .._checks import default_scale
from .._optional import require
from ..gradcheck import check_mha
from ._args import make_dir, output_dir, writing
from ._config import add_config_args, make_example
from ._html import add_html_arg, write_page


def add_parser(sub) -> None:
    """Add the ``tour`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "tour",
        help="walk one small example through every forward and backward step",
        description="Walk a small multi-head attention example through every step: projection, head split, "
        "scores, scale, mask, softmax, weighted sum, head merge, output projection; then the backward in "
        "reverse; then the finite-difference gradient check.",
    )
    add_config_args(p, batch=2, lq=4, lk=4, embed_dim=8, heads=2)
    p.add_argument(
        "--out",
        metavar="DIR",
        type=output_dir,
        default=None,
        help="also write the step figures and attention maps as PNG into DIR (created when missing)",
    )
    add_html_arg(p, "this example (the sequence the mask hits most)")
    p.set_defaults(run=run)


def _show(step: str, name: str, x: np.ndarray) -> None:
    flat = np.asarray(x).ravel()
    few = ", ".join(f"{v: .4f}" for v in flat[:4])
    print(f"  {step:<34} {name:<14} {str(x.shape):<16} [{few}{', ...' if flat.size > 4 else ''}]")


def run(args: argparse.Namespace) -> int:
    """Print the example through every forward step and back, then its gradient check; write the figures and the page if
    asked; 0 if the check passes, else 1.
    """
    mha, query, key, value, mask = make_example(args)
    if args.out:
        require("matplotlib", "tour --out (it draws the figures)")  # say so before the tour, not after
        make_dir("--out", args.out)
    P, H = mha.params, mha.num_heads
    print(f"{mha}\nmask: {args.mask} (True = may attend)\n")
    print(mha.describe(), end="\n\n")  # the steps the module walks; below, the attention step opened up
    print("FORWARD")
    _show("input", "query", query)
    q, _ = F.linear_forward(query, P["W_q"], P.get("b_q"))
    k, _ = F.linear_forward(key, P["W_k"], P.get("b_k"))
    v, _ = F.linear_forward(value, P["W_v"], P.get("b_v"))
    _show("1 projection  x Wᵀ + b", "q", q)
    Q, _ = F.split_heads_forward(q, H)
    K, _ = F.split_heads_forward(k, H)
    V, _ = F.split_heads_forward(v, H)
    _show("2 split heads (B,L,E)->(B,H,L,d)", "Q", Q)
    raw, _ = F.attention_scores_forward(Q, K, 1.0)
    _show("3 scores  Q Kᵀ", "Q Kᵀ", raw)
    scale = default_scale(mha.head_dim, mha.scale)  # 1/sqrt(d) unless the module has a scale of its own
    scores = raw * scale
    _show(f"4 scale  · 1/sqrt(d) = {scale:.4f}", "scores", scores)
    masked, _ = F.apply_mask_forward(scores, mask)
    _show("5 mask  (blocked -> -inf)", "masked", masked)
    weights, _ = F.softmax_forward(masked)
    _show("6 softmax over keys", "attn_weights", weights)
    context, _ = F.attention_context_forward(weights, V)
    _show("7 weighted sum  P V", "context", context)
    merged, _ = F.merge_heads_forward(context)
    _show("8 merge heads (B,H,L,d)->(B,L,E)", "merged", merged)
    output, cache = mha.forward(query, key, value, mask=mask)
    _show("9 output projection", "output", output)
    same = np.allclose(output, F.linear_forward(merged, P["W_o"], P.get("b_o"))[0], rtol=1e-12, atol=1e-12)
    print(f"  the steps above reproduce MultiHeadAttention.forward: {same}")

    print("\nBACKWARD (reverse order, random upstream gradient)")
    d_output = np.random.default_rng(args.seed + 1).standard_normal(output.shape)
    s, a = cache.steps, cache.attention.steps  # the module's steps and the attention's steps, by name
    d_merged, dW_o, _ = F.linear_backward(d_output, s["out_proj"])
    _show("9 output projection", "d_merged", d_merged)
    d_context = F.merge_heads_backward(d_merged, s["merge"])
    _show("8 merge heads", "d_context", d_context)
    d_weights, dV = F.attention_context_backward(d_context, a["context"])
    _show("7 weighted sum", "d_weights", d_weights)
    d_masked = F.softmax_backward(d_weights, a["softmax"])
    _show("6 softmax  p∘(dp - Σ p dp)", "d_masked", d_masked)
    d_scores = F.apply_mask_backward(d_masked, a["mask"])
    _show("5 mask (0 where blocked)", "d_scores", d_scores)
    dQ, dK = F.attention_scores_backward(d_scores, a["scores"])
    _show("4+3 scale, Q Kᵀ", "dQ", dQ)
    grads = mha.backward(d_output, cache)
    _show("2 split heads, 1 projection", "d_query", grads["query"])

    print("\nGRADIENT CHECK (float64 central differences)")
    report = check_mha(mha, query, key, value, mask=mask, d_output=d_output)
    print(report)
    if args.out:
        with writing("--out", args.out):
            paths = write_tour_figures(args.out, mha, query, key, value, mask, cache)
        for path in paths:
            print(f"wrote {path}")
    if args.html:
        from ..viz import explore_attention

        b = _most_masked(mask, cache.attn_weights.shape)
        if write_page(args.html, explore_attention(mha, cache, mask=mask, batch=b)):
            return 2
    print("\nRESULT:", "all gradients PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1


def _most_masked(mask, shape) -> int:
    """The sequence of the batch that the mask blocks most (0 without a mask)."""
    if mask is None:
        return 0
    allowed = mask if mask.dtype == np.bool_ else ~np.isneginf(mask)
    return int((~np.broadcast_to(allowed, shape)).reshape(shape[0], -1).sum(axis=1).argmax())


def write_tour_figures(out_dir, mha, query, key, value, mask, cache) -> list[Path]:
    """Write the step figures and the attention maps of one forward pass as PNG files.

    mha: the ``MultiHeadAttention``; query / key / value / mask: what was passed to ``forward``;
    cache: the ``MHACache`` it returned. ``out_dir`` is created when missing.
    Returns the written paths, in the order of the forward pass.
    """
    from ..viz import plot_attention, plot_mask, plot_step  # matplotlib only when figures are asked for

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    P = mha.params
    merged, _ = F.merge_heads_forward(cache.context)  # (B, Lq, E)
    output, _ = F.linear_forward(merged, P["W_o"], P.get("b_o"))  # (B, Lq, E)
    B, H, Lq, Lk = cache.attn_weights.shape
    qt = [f"q{i}" for i in range(Lq)]
    kt = [f"k{j}" for j in range(Lk)]
    sc = dict(row_tokens=qt, col_tokens=kt, xlabel="key", ylabel="query")

    figures = [
        ("01_query.png", plot_step(query, "input query", row_tokens=qt, xlabel="feature (E)")),
        ("02_Q_heads.png", plot_step(cache.Q, "Q after projection and head split", row_tokens=qt)),
        ("03_K_heads.png", plot_step(cache.K, "K after projection and head split", row_tokens=kt)),
        ("04_V_heads.png", plot_step(cache.V, "V after projection and head split", row_tokens=kt)),
        ("05_scores.png", plot_step(cache.scores, "scores Q Kᵀ / sqrt(d)", **sc)),
    ]
    if mask is not None:
        figures.append(("06_mask.png", plot_mask(mask, qt, kt, Lq=Lq)))
        masked = cache.attention.masked_scores  # (B, H, Lq, Lk), -inf where blocked
        b_most = _most_masked(mask, masked.shape)  # the sequence the mask hits most
        figures.append(("07_masked_scores.png", plot_step(masked, "masked scores", batch=b_most, **sc)))
    for b in range(B):
        figures.append(
            (
                f"08_attention_batch{b}.png",
                plot_attention(cache.attn_weights, qt, kt, batch=b, mask=mask, annotate=Lk <= 8),
            )
        )
    figures += [
        ("09_context.png", plot_step(cache.context, "context = weights · V (per head)", row_tokens=qt)),
        ("10_merged.png", plot_step(merged, "heads merged", row_tokens=qt, xlabel="feature (E)")),
        ("11_output.png", plot_step(output, "output after W_o", row_tokens=qt, xlabel="feature (E)")),
    ]
    paths = []
    for name, fig in figures:
        path = out / name
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths
