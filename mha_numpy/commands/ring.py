"""``mpiexec -n P python -m mha_numpy ring --length L``: ring attention over P ranks, forward and backward, checked
against the single-process kernel on rank 0; prints the error, the time, the bytes sent and the peak memory per rank
(``mha_numpy.distributed``; docs/distributed.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._args import UsageError, image_file, image_format, nonnegative_int, positive_int, writing

TOLERANCE = {"float64": 1e-12, "float32": 1e-4}  # against the float64 single-process result


def add_parser(sub) -> None:
    """Add the ``ring`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "ring",
        help="ring attention over MPI (run it under mpiexec -n P), checked against one process",
        description="Run one forward and backward of ring attention (context parallelism) over the P ranks this "
        "program was started on (mpiexec -n P python -m mha_numpy ring ...; without mpiexec P = 1): each rank "
        "holds L/P positions, keys and values travel around the ring. Rank 0 compares the context and every "
        "gradient with the vectorized kernel on the whole sequence (for L up to --check-max) and prints the error, "
        "the time, the bytes each rank sent (against the formula) and each rank's peak memory. Exits 1 if the "
        "check fails, 2 without MPI (pip install 'mha_numpy[mpi]').",
    )
    p.add_argument("--length", type=positive_int, default=1024, help="sequence length L (default %(default)s)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size B (default %(default)s)")
    p.add_argument("--heads", type=positive_int, default=4, help="query heads H (default %(default)s)")
    p.add_argument("--kv-heads", type=positive_int, default=None, help="key/value heads (GQA; default H)")
    p.add_argument("--head-dim", type=positive_int, default=32, help="head dim d (default %(default)s)")
    p.add_argument("--layout", choices=["zigzag", "contiguous"], default="zigzag", help="shards (default zigzag)")
    p.add_argument("--mask", choices=["causal", "none"], default="causal", help="(default %(default)s)")
    p.add_argument("--padding", type=nonnegative_int, default=0, help="padding keys at the end of the last item")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="(default %(default)s)")
    p.add_argument("--kernel", choices=["vectorized", "chunked"], default="vectorized",
                   help="the kernel each rank runs per piece (default %(default)s)")  # fmt: skip
    p.add_argument("--order", choices=["sequential", "tree", "flat"], default="sequential",
                   help="the merge order of a rank's partial results (default %(default)s)")  # fmt: skip
    p.add_argument("--check-max", type=nonnegative_int, default=2048, metavar="L",
                   help="check against one process only up to this length (default %(default)s)")  # fmt: skip
    p.add_argument("--seed", type=nonnegative_int, default=0, help="(default %(default)s)")
    p.add_argument("--html", metavar="FILE", default=None, help="write the ring schedule as an offline HTML page")
    p.add_argument("--out", metavar="PNG", type=image_file, default=None, help="draw the ring schedule (matplotlib)")
    p.set_defaults(run=run)


def check_args(args, size: int) -> None:
    """Rules across arguments, before any work: one line each (UsageError)."""
    from ..distributed import Sharding

    chunks = Sharding(size, args.layout).n_chunks
    if args.length % chunks:
        raise UsageError(f"argument --length: {args.length} is not a multiple of {chunks} ({args.layout} shards "
                         f"over {size} rank(s): {chunks} equal chunks)")  # fmt: skip
    kv = args.kv_heads or args.heads
    if args.heads % kv:
        raise UsageError(f"argument --kv-heads: {kv} does not divide --heads {args.heads}")
    if args.padding >= args.length:
        raise UsageError(f"argument --padding: {args.padding} must be less than --length {args.length}")
    if args.html is not None and (Path(args.html).is_dir() or not Path(args.html).parent.is_dir()):
        raise UsageError(f"argument --html: cannot write {args.html!r} (a directory, or its directory is missing)")


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def run(args: argparse.Namespace) -> int:
    """Run ring attention on this MPI world, rank 0 printing the report and writing the schedule (--html, --out); 0 on
    every rank if the check passed, else 1.
    """
    from ..distributed import Sharding, experiment
    from ..distributed.mpi import world

    comm = world()  # without mpi4py or MPI: MissingDependency, one line, exit 2
    size, rank = comm.Get_size(), comm.Get_rank()
    check_args(args, size)
    config = experiment.RingConfig(
        length=args.length, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
        layout=args.layout, causal=args.mask == "causal", padding=args.padding, dtype=args.dtype,
        kernel=args.kernel, order=args.order, seed=args.seed, check=args.length <= args.check_max,
    )  # fmt: skip
    result = experiment.run(comm, config)
    ok = True
    if rank == 0:
        ok = report(config, size, result)
        sharding = Sharding(size, args.layout)
        if args.html is not None:
            from ..distributed.draw import schedule_html

            with writing("--html", args.html):
                Path(args.html).write_text(schedule_html(sharding, args.length, config.causal), encoding="utf-8")
            print(f"wrote {args.html}")
        if args.out is not None:
            from ..distributed.draw import schedule_figure

            fig = schedule_figure(sharding, args.length, config.causal)
            with writing("--out", args.out):
                fig.savefig(args.out, dpi=100, format=image_format(Path(args.out)))
            print(f"wrote {args.out}")
    sys.stdout.flush()
    return 0 if comm.bcast(ok, root=0) else 1


def report(config, size: int, result: dict) -> bool:
    """Print the run's configuration, a row per rank (positions, times, bytes sent, peak memory) and the error against
    one process; True if within ``TOLERANCE``.
    """
    c = config
    kv = c.kv_heads or c.heads
    print(f"ring attention over {size} rank{'s' * (size > 1)}: L = {c.length}, B = {c.batch}, H = {c.heads}, "
          f"Hkv = {kv}, d = {c.head_dim}, {c.layout}, {'causal' if c.causal else 'no mask'}, padding {c.padding}, "
          f"{c.dtype}, kernel {c.kernel}, merge {c.order}")  # fmt: skip
    print(f"{'rank':>4}  {'positions':<24} {'forward':>9} {'backward':>9} {'bytes sent':>12} {'peak memory':>12}")
    for s in result["ranks"]:
        chunks = " ".join(f"[{a},{b})" for a, b in s["chunks"])
        print(f"{s['rank']:>4}  {chunks:<24} {s['forward_s']:>8.3f}s {s['backward_s']:>8.3f}s "
              f"{s['bytes_sent']:>12,} {_mb(s['peak_bytes']):>12}")  # fmt: skip
    print(f"bytes sent per rank by the formula (3P - 2) · B · Hkv · L/P · 2d · itemsize: {c.bytes_formula(size):,}")
    if result["errors"] is None:
        print(f"no check against one process: L = {c.length} > --check-max")
        return True
    tol = TOLERANCE[c.dtype]
    worst = max(result["errors"].values())
    errors = ", ".join(f"{n} {e:.1e}" for n, e in result["errors"].items())
    ok = worst <= tol
    print(f"max error against one process in float64 (of the largest entry): {errors}")
    print(f"RESULT: {'PASS' if ok else 'FAIL'} (tolerance {tol:.0e} for {c.dtype})")
    return ok
