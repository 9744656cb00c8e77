"""``python -m mha_numpy verify MODULE:FUNCTION``: run an attention implementation over the case matrix against
mha_numpy's float64 reference and print the report (``mha_numpy.testing``; docs/verify.md). The cases run in a
child process, each with a time limit (``verify_process``; ``child`` below is that process's side), so that the
function's exit, crash or hang is its case's failure and this process always prints the report."""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path

from ..testing.verify import exit_guard
from . import verify_flex as flex_command
from ._args import UsageError, positive_float
from .verify_load import (  # noqa: F401 - EXIT_USAGE: the exit codes are verify's
    EXIT_CANNOT_IMPORT,
    EXIT_FAILED,
    EXIT_PASSED,
    EXIT_USAGE,
    attribute,
    check_output,
    import_target,
    is_file,
    write_report,
)
from .verify_process import DEFAULT_TIMEOUT, CannotImport, run_cases, send

EXIT_CODES = (
    "exit codes: 0 = every case ran passed (n/a cases, which the function does not take, do not count); 1 = a case "
    "failed, or the function raised, exited, wrote into its inputs or ran past --timeout on it; 2 = usage error (a "
    "bad target or option, torch or JAX missing); 3 = the module could not be imported (it raised, exited or hung)."
)
LIBRARIES = {"torch": "torch", "transformers": "torch", "jax": "jax"}  # a target in these modules: that adapter


def _list(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def add_parser(sub) -> None:
    """Add the ``verify`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "verify",
        help="check any attention implementation against the float64 reference; name what a failing case does",
        description="Run FUNCTION (in MODULE, a module name or a .py file) over a matrix of attention cases "
        "(head dims, "
        "Lq != Lk, padding, every mask convention, causal top-left and bottom-right, sliding windows, "
        "documents, fully masked rows, GQA, dropout with a given keep-mask, scale, large logits, float64 to "
        "bfloat16), forward and backward, against mha_numpy's kernel in float64. A case passes when each "
        "tensor's error is at most 2 times that of mha_numpy's plain path in the same dtype, plus a floor "
        "from the dtype's epsilon (docs/verify.md). A failing case is re-run under the known alternative "
        "conventions (mask polarity, causal alignment, NaN or uniform fully masked rows, dropout, scale, GQA "
        "layout, backward scale, softmax without max) and the one that matches is named. A NumPy function "
        "follows the calling convention fn(q, k, v, mask=None, scale=None, is_causal=False, dropout_p=0.0, "
        "dropout_mask=None) on (B, H, L, d) arrays; its backward is FUNCTION_vjp(q, k, v, d_out, **the same) "
        "if MODULE has one (or --vjp).",
        epilog=EXIT_CODES,
    )
    p.add_argument("target", metavar="MODULE:FUNCTION", nargs="?",
                   help="e.g. my_kernels:attention or examples/verify/x.py:attention (--flex: score_mod)")  # fmt: skip
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--torch", action="store_true", help="FUNCTION takes torch tensors (autograd for the backward); "
                      "also torch.nn:MultiheadAttention and Hugging Face attention functions")  # fmt: skip
    kind.add_argument("--jax", action="store_true", help="FUNCTION takes JAX arrays (jax.vjp for the backward)")
    p.add_argument("--vjp", metavar="NAME", help="the backward of a NumPy function in MODULE (default FUNCTION_vjp)")
    p.add_argument("--cases", choices=["quick", "full"], default="quick", help="the matrix (default %(default)s)")
    p.add_argument("--only", metavar="TEXT", help="run only the cases whose id contains TEXT (e.g. is_causal)")
    p.add_argument("--layout", choices=["bhld", "blhd"], help="(B, H, L, d) (default) or (B, L, H, d)")
    p.add_argument("--mask-convention", choices=["attend", "ignore", "additive", "finite-min", "hf-01"],
                   help="how FUNCTION reads a mask (default attend: bool True = may attend, or a float added; "
                   "ignore: torch MHA's True = ignore; finite-min: HF eager's 0 / finfo.min; hf-01: HF's (B, Lk) "
                   "1 = keep)")  # fmt: skip
    p.add_argument("--dtypes", type=_list, help="dtypes FUNCTION takes, e.g. float32,bfloat16")
    p.add_argument("--without", type=_list, default=(), help="features FUNCTION lacks (n/a, not failures): any of "
                   "mask, is_causal, scale, dropout, gqa, backward")  # fmt: skip
    p.add_argument("--device", help="torch device for --torch (default cpu)")
    p.add_argument("--sdpa-backend", choices=["math", "flash_attention", "efficient_attention", "cudnn_attention"],
                   help="run a --torch function under torch.nn.attention.sdpa_kernel(this backend)")  # fmt: skip
    p.add_argument("--timeout", type=positive_float, metavar="SECONDS",
                   help=f"the time a case may take, the function and its judging (default {DEFAULT_TIMEOUT:g} s; "
                   "the judging takes under 3 s on the full matrix): a case still running then is a failure, its "
                   "process killed, the cases after it not run")  # fmt: skip
    p.add_argument("--in-process", action="store_true", help="run the function in verify's own process (for a "
                   "debugger): no time limit, and a crash or an exit from C code ends verify")  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON (- : to stdout, instead of the table)")
    p.add_argument("--html", metavar="FILE", help="also write the report as one HTML page")
    flex_command.add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Adapt MODULE:FUNCTION (NumPy, torch or JAX), run it over the case matrix (in a child process unless
    --in-process), print the report and write --json/--html; an exit code of ``EXIT_CODES``."""
    from ..testing import VerifyReport, matrix, verify_attention
    from ..testing.verify import select

    flex_command.check_options(args)
    if args.flex:
        return flex_command.run(args)
    if args.target is None:
        raise UsageError("argument MODULE:FUNCTION: give the function to verify (or --flex with --mask-mod)")
    for option, path in (("--json", args.json), ("--html", args.html)):
        check_output(option, path)
    module_part = _module_part(args.target)
    library = "numpy" if is_file(module_part) else LIBRARIES.get(module_part.split(".")[0], "numpy")
    kind = "torch" if args.torch else "jax" if args.jax else library
    options = {k: v for k, v in (("layout", args.layout), ("mask_convention", args.mask_convention),
               ("dtypes", args.dtypes), ("without", args.without or None)) if v is not None}  # fmt: skip
    torch_only = {k: v for k, v in (("device", args.device), ("sdpa_backend", args.sdpa_backend)) if v is not None}
    if torch_only and kind != "torch":
        raise UsageError(f"argument --{next(iter(torch_only)).replace('_', '-')}: applies to --torch functions only")
    job = {"target": args.target, "module": module_part, "vjp": args.vjp, "kind": kind, "options": options,
           "torch_only": torch_only}  # fmt: skip
    progress = _progress if sys.stderr.isatty() and args.json != "-" else None
    try:
        if args.in_process or os.name != "posix" or not sys.executable:  # no process groups elsewhere
            with exit_guard():
                impl = adapt(job)
            impl.notes.append(IN_PROCESS)
            report = verify_attention(impl, cases=args.cases, only=args.only, progress=progress)
        else:
            cases = select(matrix(args.cases), args.only)
            start = time.perf_counter()
            name, notes, results, cpu = run_cases(job, cases, args.timeout or DEFAULT_TIMEOUT, progress)
            report = VerifyReport(name, args.cases, results, notes, time.perf_counter() - start, cpu)
    except ValueError as e:  # --only matching nothing
        raise _usage(e) from None
    except CannotImport as e:
        print(f"verify: {e}", file=sys.stderr)
        return EXIT_CANNOT_IMPORT
    if args.json != "-":
        print(report)
    write_report(args, report)
    return EXIT_PASSED if report.passed else EXIT_FAILED


IN_PROCESS = "run in verify's own process (--in-process): no time limit, and a crash or an exit from C code ends verify"


def adapt(job: dict):
    """The target of ``job`` imported and adapted -> an Implementation (UsageError, CannotImport)."""
    from ..testing import Implementation, from_jax, from_numpy, from_torch

    _, obj, vjp = load_target(job["target"], job["vjp"])
    options, torch_only, kind = job["options"], job["torch_only"], job["kind"]
    try:
        if isinstance(obj, Implementation):
            if options or torch_only or vjp is not None:
                raise UsageError(f"{job['target']} is an adapted Implementation: it takes no adapter options")
            return obj
        if kind == "torch":
            return from_torch(obj, **options, **torch_only)
        if kind == "jax":
            return from_jax(obj, **options)
        return from_numpy(obj, vjp, **options, name=job["target"])
    except ValueError as e:  # a bad option value for the adapter
        raise _usage(e) from None


def _usage(e: ValueError) -> UsageError:
    message = str(e)
    option = next((o for o in ("dtypes", "without", "layout", "mask_convention", "sdpa_backend", "only")
                   if message.startswith(o)), None)  # fmt: skip
    return UsageError(f"argument --{option.replace('_', '-')}: {message}" if option else message)


def child() -> None:
    """The child process of ``verify_process``: the job from stdin, the messages to the pipe it names."""
    from .._optional import MissingDependency
    from ..testing import run_case

    job = pickle.load(sys.stdin.buffer)
    sys.path[:] = job["path"]  # the parent's: a module name resolves as it would there
    if job["kind"] == "flex":
        return flex_command.child(job)
    fd, cases = job["fd"], job["cases"]
    try:
        with exit_guard():
            impl = adapt(job)
    except (UsageError, MissingDependency) as e:
        return send(fd, ("usage", str(e)))
    except CannotImport as e:
        return send(fd, ("import", str(e)))
    send(fd, ("ready", impl.name, list(impl.notes)))
    for i in range(job["start"], len(cases)):
        send(fd, ("start", i))
        cpu = time.process_time()
        result = run_case(impl, cases[i])
        send(fd, ("result", i, result, time.process_time() - cpu))


def _module_part(target: str) -> str:
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise UsageError(f"argument MODULE:FUNCTION: expected e.g. my_kernels:attention, got {target!r}")
    if is_file(module_part) and not Path(module_part).is_file():
        raise UsageError(f"argument MODULE:FUNCTION: no such file: {module_part}")
    return module_part


def load_target(target: str, vjp_name: str | None):
    """MODULE:FUNCTION -> (module name, the object, its NumPy VJP or None); UsageError, or CannotImport when the
    module raises (or exits) while being imported."""
    module_part = _module_part(target)
    attr = target.rpartition(":")[2]
    module = import_target(module_part)
    obj = attribute(module, module_part, attr)
    if vjp_name is not None:
        vjp = attribute(module, module_part, vjp_name, "--vjp")
    else:
        vjp = getattr(module, f"{attr}_vjp", None)
    if not callable(obj) and not _is_implementation(obj):
        raise UsageError(f"argument MODULE:FUNCTION: {target} is a {type(obj).__name__}, not a function")
    return module.__name__, obj, vjp


def _is_implementation(obj) -> bool:
    from ..testing import Implementation

    return isinstance(obj, Implementation)


def _progress(i: int, n: int, result) -> None:
    """One line on stderr, rewritten after each case; cleared after the last."""
    line = f"verify [{i}/{n}] {result.status:<5} {result.case.id}"[:100]
    end = "\r" + " " * 100 + "\r" if i == n else ""
    print(f"\r{line:<100}{end}", end="", file=sys.stderr, flush=True)
