"""The shared example configuration of the CLI commands (batch, lengths, sizes, mask kind)."""

from __future__ import annotations

import argparse

import numpy as np

from .. import masks
from ..attention import MultiHeadAttention
from ._args import check_heads, nonnegative_int, positive_int

MASK_KINDS = ("none", "padding", "causal", "padding+causal", "bool", "additive", "fully-masked-row")


def add_config_args(p: argparse.ArgumentParser, *, batch=2, lq=4, lk=5, embed_dim=8, heads=2) -> None:
    g = p.add_argument_group("example configuration")
    g.add_argument("--batch", type=positive_int, default=batch, help="batch size B (default %(default)s)")
    g.add_argument("--lq", type=positive_int, default=lq, help="query length Lq (default %(default)s)")
    g.add_argument("--lk", type=positive_int, default=lk, help="key/value length Lk (default %(default)s)")
    g.add_argument("--embed-dim", type=positive_int, default=embed_dim, help="embed dim E (default %(default)s)")
    g.add_argument("--heads", type=positive_int, default=heads, help="number of heads H (default %(default)s)")
    g.add_argument("--kdim", type=positive_int, default=None, help="key feature size (default E)")
    g.add_argument("--vdim", type=positive_int, default=None, help="value feature size (default E)")
    g.add_argument("--no-bias", action="store_true", help="projections without bias")
    g.add_argument("--mask", choices=MASK_KINDS, default="padding", help="mask kind (default %(default)s)")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="random seed (default %(default)s)")


def make_mask(kind: str, B: int, Lq: int, Lk: int, rng: np.random.Generator, dtype=np.float64):
    """A mask of the named kind in our convention (True = may attend / float added)."""
    lengths = np.array([Lk - (b % max(Lk - 1, 1)) for b in range(B)])  # first sequence full, the others padded
    if kind == "none":
        return None
    if kind == "padding":
        return masks.padding_mask(lengths, Lk)
    if kind == "causal":
        return masks.causal_mask(Lq, Lk)
    if kind == "padding+causal":
        return masks.combine_masks(masks.padding_mask(lengths, Lk), masks.causal_mask(Lq, Lk))
    if kind == "bool":
        m = rng.random((B, 1, Lq, Lk)) < 0.7
        m[..., 0] = True  # every row keeps at least one key
        return m
    if kind == "additive":
        return masks.combine_masks(rng.normal(0, 1, (1, 1, Lq, Lk)).astype(dtype), masks.padding_mask(lengths, Lk))
    if kind == "fully-masked-row":
        m = np.ones((B, 1, Lq, Lk), dtype=bool)
        m[0, 0, -1, :] = False  # the last query of the first sequence may attend to nothing
        return m
    raise ValueError(f"unknown mask kind {kind!r}; choose from {MASK_KINDS}")


def make_example(args: argparse.Namespace, dtype=np.float64):
    """(mha, query, key, value, mask) for the configuration in ``args``, with nonzero biases."""
    check_heads(args.embed_dim, args.heads)
    rng = np.random.default_rng(args.seed)
    mha = MultiHeadAttention(
        args.embed_dim, args.heads, bias=not args.no_bias, kdim=args.kdim, vdim=args.vdim, dtype=dtype, rng=rng
    )
    # zero biases would hide bias bugs, so give them values
    for name, p in mha.params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.1, p.shape)
    kdim, vdim = mha.kdim, mha.vdim
    query = rng.standard_normal((args.batch, args.lq, args.embed_dim)).astype(dtype)
    key = rng.standard_normal((args.batch, args.lk, kdim)).astype(dtype)
    value = rng.standard_normal((args.batch, args.lk, vdim)).astype(dtype)
    mask = make_mask(args.mask, args.batch, args.lq, args.lk, rng, dtype)
    return mha, query, key, value, mask
