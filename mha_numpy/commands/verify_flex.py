"""``python -m mha_numpy verify --flex MODULE:SCORE_MOD [--mask-mod FN] [--numpy-twin FN] [--params NAME]
[--backward FN]``: a torch FlexAttention call against ``mha_numpy.flex`` and your backward against ours
(``testing.verify_flex``; docs/flex.md). Each option takes MODULE:NAME, or a NAME alone, looked up in the score_mod's
module. It runs in verify's own process (the matrix's child process and --timeout are for MODULE:FUNCTION alone):
your backward's exception or exit is its case's ERROR, a crash in C code ends verify."""

from __future__ import annotations

import sys
from pathlib import Path

from .._optional import require
from ..testing.verify import Exited, exit_guard
from ._args import UsageError, positive_float, positive_int
from .verify_load import (
    EXIT_CANNOT_IMPORT,
    EXIT_FAILED,
    EXIT_PASSED,
    attribute,
    check_output,
    import_target,
    is_file,
    write_report,
)
from .verify_process import CannotImport

FLEX_ONLY = ("mask_mod", "numpy_twin", "numpy_mask_twin", "params", "backward", "heads", "gqa", "tol")
NOT_WITH_FLEX = ("torch", "jax", "vjp", "layout", "mask_convention", "dtypes", "without", "device", "sdpa_backend",
                 "timeout", "in_process")  # fmt: skip
VALUE_OPTIONS = {"params": "--params", "only": "--only", "gqa": "--heads", "tol": "--tol"}  # a ValueError's start


def add_arguments(p) -> None:
    """``verify``'s FlexAttention options."""
    g = p.add_argument_group("FlexAttention (--flex)", "a torch flex_attention call: its eager forward on the CPU "
                             "against mha_numpy.flex's and your backward against ours, in float64 (docs/flex.md); "
                             "each option MODULE:NAME, or a NAME of the score_mod's module")  # fmt: skip
    g.add_argument("--flex", action="store_true", help="MODULE:FUNCTION is a torch score_mod(score, b, h, q_idx, "
                   "kv_idx, **params) (omit it for a mask_mod alone)")  # fmt: skip
    g.add_argument("--mask-mod", metavar="FN", help="torch's mask_mod(b, h, q_idx, kv_idx)")
    g.add_argument("--numpy-twin", metavar="FN", help="the score_mod's NumPy twin (default: the torch function "
                   "itself, tried on NumPy arrays); FN_vjp beside it, if any, is the twin's VJP")  # fmt: skip
    g.add_argument("--numpy-mask-twin", metavar="FN", help="the mask_mod's NumPy twin (default: the torch one)")
    g.add_argument("--params", metavar="NAME", help="a dict {name: array or tensor}: the tensors the score_mod "
                   "captures, passed to it as keywords")  # fmt: skip
    g.add_argument("--backward", metavar="FN", help="your backward: FN(q, k, v, params, d_out) -> (dq, dk, dv, "
                   "d_params) on float64 arrays; its gradients against ours (the first wrong one named)")  # fmt: skip
    g.add_argument("--heads", type=positive_int, help="query heads of the cases (default 4)")
    g.add_argument("--gqa", action="store_true", help="add a grouped-query case (heads / 2 key heads)")
    g.add_argument("--tol", type=positive_float, help="of the largest magnitude (default 1e-10)")


def _given(args, names) -> list[str]:
    return [n for n in names if getattr(args, n, None) not in (None, False, ())]


def check_options(args) -> None:
    """Options of the other mode: a UsageError naming the first."""
    wrong = _given(args, NOT_WITH_FLEX) if args.flex else _given(args, FLEX_ONLY)
    if wrong:
        rule = "does not apply with --flex" if args.flex else "applies with --flex only"
        raise UsageError(f"argument --{wrong[0].replace('_', '-')}: {rule}")


def load(spec: str | None, option: str, home=None):
    """MODULE:NAME (or a NAME of ``home``, the score_mod's module) -> (module, object); (home, None) for None.
    UsageError naming ``option``; CannotImport when the module raises while imported."""
    if spec is None:
        return home, None
    module_part, sep, name = spec.rpartition(":")
    if not sep and home is not None:
        where = getattr(home, "__file__", None) if home.__name__.startswith("_verify_target_") else home.__name__
        return home, attribute(home, where or home.__name__, spec, option)
    if not sep or not module_part or not name:
        raise UsageError(f"argument {option}: expected MODULE:NAME (or a NAME of the score_mod's module), got {spec!r}")
    if is_file(module_part) and not Path(module_part).is_file():
        raise UsageError(f"argument {option}: no such file: {module_part}")
    module = import_target(module_part, option)
    return module, attribute(module, module_part, name, option)


def run(args) -> int:
    """Load the mods, the params and the backward, run ``verify_flex``, print the report; verify's exit codes."""
    from ..testing import verify_flex

    require("torch", "verify --flex (torch's eager flex_attention is the reference)")
    if args.target is None and args.mask_mod is None:
        raise UsageError("argument --flex: give MODULE:SCORE_MOD, --mask-mod or both")
    for option, path in (("--json", args.json), ("--html", args.html)):
        check_output(option, path)
    try:
        with exit_guard():
            home, score_mod = load(args.target, "MODULE:FUNCTION")
            home, mask_mod = load(args.mask_mod, "--mask-mod", home)
            twin_home, twin = load(args.numpy_twin, "--numpy-twin", home)
            twin_vjp = getattr(twin_home, f"{args.numpy_twin.rpartition(':')[2]}_vjp", None) if twin else None
            mask_twin = load(args.numpy_mask_twin, "--numpy-mask-twin", home)[1]
            params = load(args.params, "--params", home)[1]
            backward = load(args.backward, "--backward", home)[1]
            report = verify_flex(score_mod, mask_mod, numpy_score_mod=twin, numpy_mask_mod=mask_twin,
                                 numpy_score_mod_vjp=twin_vjp, params=params, backward=backward,
                                 heads=args.heads or 4, gqa=args.gqa, only=args.only, tol=args.tol or 1e-10,
                                 name=" + ".join(s for s in (args.target, args.mask_mod) if s))  # fmt: skip
    except CannotImport as e:
        print(f"verify: {e}", file=sys.stderr)
        return EXIT_CANNOT_IMPORT
    except ValueError as e:
        message = " ".join(str(e).split())
        option = next((o for v, o in VALUE_OPTIONS.items() if message.startswith(v)), None)
        raise UsageError(f"argument {option}: {message}" if option else message) from None
    except (SystemExit, Exited) as e:
        print(f"verify: your mods called exit({e.code!r}) outside the backward: nothing to report", file=sys.stderr)
        return EXIT_FAILED
    if args.json != "-":
        print(report)
    write_report(args, report)
    return EXIT_PASSED if report.passed else EXIT_FAILED
