"""``python -m mha_numpy tour``: one small example through every step, forward then backward.

It prints each step's name, shape and a few numbers, then the backward in reverse order, then the
gradient-check table. With ``--out DIR`` it also writes figures (see ``mha_numpy.viz``).
"""

from __future__ import annotations

import argparse

import numpy as np

from .. import functional as F
from .._checks import default_scale
from ..gradcheck import check_mha
from ._config import add_config_args, make_example


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tour",
        help="walk one small example through every forward and backward step",
        description="Walk a small multi-head attention example through every step: projection, head split, "
        "scores, scale, mask, softmax, weighted sum, head merge, output projection; then the backward in "
        "reverse; then the finite-difference gradient check.",
    )
    add_config_args(p, batch=2, lq=4, lk=4, embed_dim=8, heads=2)
    p.add_argument(
        "--out", metavar="DIR", default=None, help="also write the step figures and attention maps as PNG into DIR"
    )
    p.set_defaults(run=run)


def _show(step: str, name: str, x: np.ndarray) -> None:
    flat = np.asarray(x).ravel()
    few = ", ".join(f"{v: .4f}" for v in flat[:4])
    print(f"  {step:<34} {name:<14} {str(x.shape):<16} [{few}{', ...' if flat.size > 4 else ''}]")


def run(args: argparse.Namespace) -> int:
    mha, query, key, value, mask = make_example(args)
    P, H = mha.params, mha.num_heads
    print(f"{mha}\nmask: {args.mask} (True = may attend)\n")
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
    scale = default_scale(mha.head_dim)  # 1/sqrt(d), the module's default
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
        from ..viz import write_tour_figures  # matplotlib only when figures are asked for

        for path in write_tour_figures(args.out, mha, query, key, value, mask, cache):
            print(f"wrote {path}")
    print("\nRESULT:", "all gradients PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1
