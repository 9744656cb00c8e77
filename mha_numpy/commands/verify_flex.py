"""``python -m mha_numpy verify --flex MODULE:SCORE_MOD [--mask-mod FN] [--numpy-twin FN] [--params NAME]
[--backward FN]``: a torch FlexAttention call against ``mha_numpy.flex`` and your backward against ours
(``testing.verify_flex``; docs/flex.md). Each option takes MODULE:NAME, or a NAME alone, looked up in the score_mod's
module. As the matrix's, the cases run in a child process (``verify_process.Child``), each within --timeout: your
code's exception, exit, crash or hang is its case's ERROR (--in-process: in verify's own process, no time limit)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .._optional import MissingDependency, require
from ..testing.flex_report import TOL, FlexReport
from ..testing.report import CaseResult
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
from .verify_process import DEFAULT_TIMEOUT, STARTUP, CannotImport, Child, next_result, send

FLEX_ONLY = ("mask_mod", "numpy_twin", "numpy_mask_twin", "params", "backward", "heads", "gqa", "tol")
NOT_WITH_FLEX = ("torch", "jax", "vjp", "layout", "mask_convention", "dtypes", "without", "device",
                 "sdpa_backend")  # fmt: skip
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
    """Run ``verify_flex`` on the options (in a child process, each case within --timeout, unless --in-process),
    print the report; verify's exit codes."""
    require("torch", "verify --flex (torch's eager flex_attention is the reference)")
    if args.target is None and args.mask_mod is None:
        raise UsageError("argument --flex: give MODULE:SCORE_MOD, --mask-mod or both")
    for option, path in (("--json", args.json), ("--html", args.html)):
        check_output(option, path)
    options = {n: getattr(args, n) for n in ("target", *FLEX_ONLY, "only")}
    start = time.perf_counter()
    try:
        if args.in_process:
            cpu = time.process_time()
            with exit_guard():
                plan = _plan(options)
                results = [plan.run.case(c) for c in plan.cases]
            name, notes, cpu = plan.name, plan.notes + [IN_PROCESS], time.process_time() - cpu
        else:
            name, notes, results, cpu = _in_child(options, args.timeout or DEFAULT_TIMEOUT)
    except CannotImport as e:
        print(f"verify: {e}", file=sys.stderr)
        return EXIT_CANNOT_IMPORT
    except ValueError as e:
        raise usage(e) from None
    except (SystemExit, Exited) as e:
        print(f"verify: your mods called exit({e.code!r}) outside the backward: nothing to report", file=sys.stderr)
        return EXIT_FAILED
    report = FlexReport(name, f"{len(results)} flex", results, notes, time.perf_counter() - start, cpu,
                        tol=args.tol or TOL)  # fmt: skip
    if args.json != "-":
        print(report)
    write_report(args, report)
    return EXIT_PASSED if report.passed else EXIT_FAILED


IN_PROCESS = "run in verify's own process (--in-process): no time limit, and a crash or an exit from C code ends verify"


def usage(e: ValueError) -> UsageError:
    """A ValueError of ``plan_flex`` as a usage error naming the option it is about."""
    message = " ".join(str(e).split())
    option = next((o for v, o in VALUE_OPTIONS.items() if message.startswith(v)), None)
    return UsageError(f"argument {option}: {message}" if option else message)


def _plan(options: dict):
    """The options' functions loaded -> ``testing.flex_verify.FlexPlan`` (UsageError, CannotImport, ValueError)."""
    from ..testing.flex_verify import plan_flex

    home, score_mod = load(options["target"], "MODULE:FUNCTION")
    home, mask_mod = load(options["mask_mod"], "--mask-mod", home)
    twin_home, twin = load(options["numpy_twin"], "--numpy-twin", home)
    twin_vjp = getattr(twin_home, f"{options['numpy_twin'].rpartition(':')[2]}_vjp", None) if twin else None
    return plan_flex(score_mod, mask_mod, numpy_score_mod=twin, numpy_score_mod_vjp=twin_vjp,
                     numpy_mask_mod=load(options["numpy_mask_twin"], "--numpy-mask-twin", home)[1],
                     params=load(options["params"], "--params", home)[1],
                     backward=load(options["backward"], "--backward", home)[1], heads=options["heads"] or 4,
                     gqa=options["gqa"], only=options["only"], tol=options["tol"] or TOL,
                     name=" + ".join(s for s in (options["target"], options["mask_mod"]) if s))  # fmt: skip


def _in_child(options: dict, timeout: float):
    """The plan and its cases in a child process (``verify_process.Child``), each case within ``timeout``: a case
    that hangs or ends the process is an ERROR, the cases after it not run. -> (name, notes, results, CPU s)."""
    child = Child({"kind": "flex", "options": options})
    try:
        try:
            message = child.read(time.monotonic() + max(STARTUP, timeout), ("ready", 4), ("usage", 2), ("import", 2))
        except (TimeoutError, EOFError, ValueError) as e:
            raise CannotImport(f"loading the mods did not finish ({type(e).__name__}: {e})") from None
        if message[0] != "ready":
            raise (UsageError if message[0] == "usage" else CannotImport)(message[1])
        _, name, notes, cases = message
        results, cpu = [], 0.0
        for i in range(len(cases)):
            result, seconds = next_result(child, cases, i, timeout)
            results.append(result)
            cpu += max(seconds, 0.0)
            if seconds < 0:  # hung or ended: the rest not run
                results += [CaseResult(c, "ERROR", message=f"not run: the case before it {result.message[:60]}")
                            for c in cases[i + 1 :]]  # fmt: skip
                break
        return name, notes, results, cpu
    finally:
        child.kill()


def child(job: dict) -> None:
    """The child process's side (``verify.child`` hands a flex job here): the plan, then a case at a time."""
    fd = job["fd"]
    try:
        with exit_guard():
            plan = _plan(job["options"])
    except (UsageError, MissingDependency) as e:
        return send(fd, ("usage", str(e)))
    except ValueError as e:
        return send(fd, ("usage", str(usage(e))))
    except CannotImport as e:
        return send(fd, ("import", str(e)))
    send(fd, ("ready", plan.name, plan.notes, plan.cases))
    for i, case in enumerate(plan.cases):
        send(fd, ("start", i))
        cpu = time.process_time()
        try:
            with exit_guard():
                result = plan.run.case(case)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the mods' exit (the backward's own is caught in the case)
            result = CaseResult(case, "ERROR", message=f"your mods raised or exited: {type(e).__name__}: {e}"[:300])
        send(fd, ("result", i, result, time.process_time() - cpu))
