"""``python -m mha_numpy gradcheck``: the finite-difference table for a configurable example."""

from __future__ import annotations

import argparse

from ..gradcheck import check_functional, check_mha
from ._args import nonnegative_float, positive_float, probability
from ._config import add_config_args, make_example


def add_parser(sub) -> None:
    """Add the ``gradcheck`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "gradcheck",
        help="finite-difference check of every gradient; exits 1 on failure",
        description="Compare every analytic gradient of MultiHeadAttention (inputs and parameters) and of each "
        "functional pair with float64 central differences against a random upstream gradient. "
        "Prints one row per gradient and exits 1 if any fails.",
    )
    add_config_args(p)
    p.add_argument("--dropout", type=probability, default=0.0, help="attention dropout, checked with a fixed mask")
    p.add_argument("--eps", type=positive_float, default=1e-6, help="finite-difference step (default %(default)s)")
    p.add_argument("--rtol", type=nonnegative_float, default=1e-6, help="relative tolerance (default %(default)s)")
    p.add_argument("--atol", type=nonnegative_float, default=1e-8, help="absolute tolerance (default %(default)s)")
    p.add_argument("--skip-functional", action="store_true", help="check only the module, not each pair")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the finite-difference tables of the functional pairs and of the example's module; 0 if every gradient
    passes, else 1.
    """
    mha, query, key, value, mask = make_example(args)
    mha.dropout = args.dropout
    print(f"{mha}\nquery {query.shape}, key {key.shape}, value {value.shape}, mask: {args.mask}\n")
    ok = True
    if not args.skip_functional:
        rep = check_functional(eps=args.eps, atol=args.atol, rtol=args.rtol, rng=args.seed)
        print("functional pairs\n" + str(rep) + "\n")
        ok &= rep.passed
    rep = check_mha(
        mha,
        query,
        key,
        value,
        mask=mask,
        training=args.dropout > 0,
        rng=args.seed,
        eps=args.eps,
        atol=args.atol,
        rtol=args.rtol,
    )
    print("MultiHeadAttention\n" + str(rep))
    ok &= rep.passed
    print("\nRESULT:", "all gradients PASS" if ok else "FAIL")
    return 0 if ok else 1
