"""Run an implementation over the case matrix against the float64 reference, and name what a failing case does.

    report = verify_attention(fn, fn_vjp)          # a NumPy function of the calling convention (``adapters``)
    report = verify_attention(from_torch(fn))      # torch (autograd for the backward), or from_jax(fn) (jax.vjp)
    print(report); report.passed

Each case: the function's forward (and backward, when it has one) on the case's inputs; every tensor against the
reference with its budget (``tolerance``); a failing case is re-run under each alternative convention that
applies (``conventions``), alone and with the two other ways of treating a fully masked row, and the first whose
numbers the function matches is named. An exception in the function is that case's ERROR, never the tool's, and
so is its exit: ``sys.exit`` (SystemExit) and ``os._exit`` (``exit_guard``) while it runs. The function is handed
copies of the inputs; one it writes into is named and fails the case (the reference is of the untouched inputs).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace

import numpy as np

from .adapters import Call, Implementation, NotSupported, from_numpy, written
from .cases import Case, matrix
from .conventions import ALTERNATIVES, BY_NAME, LOWER, Tensors, applies, blocked_rows, effective_mask, reference
from .dtypes import HELD
from .report import CaseResult, VerifyReport
from .tolerance import check, largest, max_error, plain

MATCH_SLACK = 2.0  # a match is within twice the case's budget, scaled to the variant's magnitude
PRECISION_SLACK = 100.0  # "p inside": within p's budget, the worst error at least 1/100 of our path's in p (a
# single step in p, as HF eager's float32 softmax of float64 scores, errs ten times less than our whole path in p)
MEANINGFUL = 0.1  # ... and our path in p still computes the thing: its error under a tenth of the largest entry
LESS_EXACT = 10.0  # "less exact": no convention matches, every tensor within this many budgets


def verify_attention(fn, vjp=None, *, cases="quick", only: str | None = None, progress=None,
                     **numpy_options) -> VerifyReport:  # fmt: skip
    """Run ``fn`` over the ``quick`` or ``full`` matrix (or a list of ``Case``) -> a VerifyReport.

    fn: an ``Implementation`` (``from_torch``, ``from_jax``, ``torch_mha``, ``hf_attention``, ``kernel``), or a
    NumPy function of the calling convention, adapted by ``from_numpy(fn, vjp, **numpy_options)`` (layout,
    mask_convention, dtypes, without, name). only: run the cases whose id contains this text. progress: called as
    ``progress(i, n, result)`` after each case.
    """
    if isinstance(fn, Implementation):
        if vjp is not None or numpy_options:
            raise ValueError("vjp and the NumPy options apply to a NumPy function, not to an adapted Implementation")
        impl = fn
    else:
        impl = from_numpy(fn, vjp, **numpy_options)
    selected = select(matrix(cases) if isinstance(cases, str) else list(cases), only)
    cases = cases if isinstance(cases, str) else f"{len(selected)} given"
    start, cpu = time.perf_counter(), time.process_time()
    results = []
    for i, case in enumerate(selected, 1):
        results.append(run_case(impl, case))
        if progress is not None:
            progress(i, len(selected), results[-1])
    return VerifyReport(impl.name, cases, results, list(impl.notes), time.perf_counter() - start,
                        time.process_time() - cpu)  # fmt: skip


def select(case_list: list[Case], only: str | None) -> list[Case]:
    if only is None:
        return case_list
    chosen = [c for c in case_list if only.lower() in c.id.lower()]
    if not chosen:
        raise ValueError(f"only={only!r}: no case's id contains it (e.g. {case_list[0].id!r})")
    return chosen


def run_case(impl: Implementation, case: Case) -> CaseResult:
    """One case: n/a, ERROR (the function raised or exited), FAIL (with the detected convention, or the inputs it
    wrote into) or PASS. The function is handed copies of the case's inputs; the reference is of the originals."""
    missing = sorted(case.needs() - impl.features - {"backward"})
    if case.dtype not in impl.dtypes:
        return CaseResult(case, "n/a", message=f"takes no {case.dtype}")
    if missing:
        return CaseResult(case, "n/a", message=f"takes no {', '.join(missing)}")
    backward = "backward" in impl.features
    x = case.inputs()  # the reference's: the function gets copies, so what it writes cannot change the reference
    original = {"q": x.q, "k": x.k, "v": x.v, "mask": x.mask, "dropout_mask": x.keep,
                "d_out": x.d_out if backward else None}  # fmt: skip
    given = {n: None if a is None else a.copy() for n, a in original.items()}
    call = Call(case.dtype, given["q"], given["k"], given["v"], given["mask"], case.scale, case.is_causal,
                case.dropout_p, given["dropout_mask"], given["d_out"])  # fmt: skip
    try:
        with np.errstate(all="ignore"), exit_guard():
            outcome = impl(call)
    except (NotSupported, NotImplementedError) as e:
        return CaseResult(case, "n/a", message=_one_line(e) or type(e).__name__)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - whatever the function raises, and its exit, is this case's result
        changed = written(given, original)
        first = f"wrote into {_names(changed)}, then " if changed else ""
        if isinstance(e, (SystemExit, Exited)):
            how = "os._exit" if isinstance(e, Exited) else "sys.exit"
            return CaseResult(case, "ERROR", message=f"{first}called {how}({e.code!r}): a function under test must "
                              "return (its exit is a failure, whatever the code)", written=changed)  # fmt: skip
        hint = sorted(case.needs() - {"backward", "mask"})
        more = f" (if it does not take {', '.join(hint)}: without={tuple(hint)!r})" if hint else ""
        return CaseResult(case, "ERROR", message=f"{first}raised {type(e).__name__}: {_one_line(e)}"[:300] + more,
                          written=changed)  # fmt: skip
    changed = tuple(dict.fromkeys(written(given, original) + tuple(getattr(outcome, "written", ()))))
    mutation = WROTE.format(_names(changed)) if changed else ""
    try:  # its results read as arrays: an object's __array__ is the function's code too
        with np.errstate(all="ignore"), exit_guard():
            got, problem = collect(outcome, case, backward)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001
        problem = f"returned what cannot be read as arrays ({type(e).__name__}: {_one_line(e)})"[:300]
    if problem:
        return CaseResult(case, "FAIL", message="; and ".join(filter(None, (mutation, problem))), written=changed)
    ref, pl = reference(x, case, backward=backward), plain(x, case, backward=backward)
    checks = check(got, ref, pl, case)
    wrong = [n for n, c in checks.items() if not c.passed]
    if changed:  # a failure of its own: judged on what it returned, against the reference of the untouched inputs
        more = f"; and wrong: {', '.join(wrong)}" if wrong else " (what it returned is right)"
        return CaseResult(case, "FAIL", checks, message=mutation + more, written=changed)
    if not wrong:
        return CaseResult(case, "PASS", checks)
    detected = detect(got, x, case, checks, impl.mask_convention)
    message = "" if detected else f"wrong: {', '.join(wrong)}; no known convention matches"
    return CaseResult(case, "FAIL", checks, detected, message)


class Exited(BaseException):
    """``os._exit(code)`` called by the function under test while ``exit_guard`` holds: its case's ERROR. A
    BaseException, as SystemExit is, so that the function's own ``except Exception`` does not swallow it."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def exit_guard():
    """While the function under test runs, ``os._exit`` raises ``Exited`` instead of ending this process (a process
    it forks exits for real). C code calling exit(), or a crash, still ends the process: the command runs the cases
    in a child process for that (``commands/verify_process.py``)."""
    real, pid = os._exit, os.getpid()

    def guarded(code):
        if os.getpid() != pid:
            real(code)
        raise Exited(code)

    os._exit = guarded
    try:
        yield
    finally:
        os._exit = real


WROTE = "wrote into its input {} (a function must leave its arguments as given)"


def _names(names) -> str:
    return ", ".join(names)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def collect(outcome, case: Case, backward: bool) -> tuple[dict, str]:
    """The outcome's arrays by name, as float64, or a message saying what is wrong with them (shape, dtype)."""
    B, H, Hkv, Lq, Lk, d = case.B, case.H, case.Hkv, case.Lq, case.Lk, case.d
    expected = {"out": (B, H, Lq, d), "weights": (B, H, Lq, Lk), "dq": (B, H, Lq, d), "dk": (B, Hkv, Lk, d),
                "dv": (B, Hkv, Lk, d)}  # fmt: skip
    arrays = {"out": outcome.out}
    if outcome.weights is not None:
        arrays["weights"] = outcome.weights
    if backward:
        grads = outcome.grads
        if grads is None or len(grads) != 3:
            return {}, f"the backward returned {type(grads).__name__}, expected (dq, dk, dv)"
        arrays.update(zip(("dq", "dk", "dv"), grads))
    got = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.shape != expected[name]:
            hint = " (the (B, L, heads, d) layout? layout='blhd')" if a.shape == (B, Lq, H, d) else ""
            return {}, f"{name} has shape {a.shape}, expected {expected[name]}{hint}"
        if a.dtype != HELD[case.dtype] and not (case.dtype == "bfloat16" and a.dtype.name == "bfloat16"):
            return {}, f"{name} is {a.dtype} for {case.dtype} inputs"
        got[name] = a.astype(np.float64)
    return got, ""


# --------------------------------------------------------------------------- convention detection


def detect(got: dict, x, case: Case, checks: dict, mask_convention: str) -> str | None:
    """The name of the alternative (``conventions.ALTERNATIVES``, or "A + rows") whose numbers the function's
    match on this case, among those that apply and differ from ours here; None if none does."""
    budgets = {n: c.budget for n, c in checks.items()}
    ours = reference(x, case, backward="dq" in got)
    scales = {n: largest(ours.values[n]) for n in got}
    forward_bad = any(not checks[n].passed for n in ("out", "weights") if n in checks)
    stage = "forward" if forward_bad else "backward"
    candidates = [
        a for a in ALTERNATIVES if a.stage == stage and applies(a, case, x, mask_convention, "weights" in got)
    ]
    for alt in candidates:
        if _explains(alt.convention(), got, x, case, budgets, ours, scales):
            return alt.name
    if stage == "forward":
        found = _with_rows(candidates, got, x, case, budgets, ours, scales)
        if found:
            return found
    worst = max((n for n in checks if not checks[n].passed), key=lambda n: checks[n].ratio)
    for p in LOWER[case.dtype]:  # the numbers are right (or a convention's), but only to a lower precision
        low = replace(case, dtype=p)
        at_p = check(got, ours, plain(x, low, backward="dq" in got), low)
        if any(c.plain_error > MEANINGFUL * largest(ours.values[n]) for n, c in at_p.items()):
            continue  # our path in p is noise here (e.g. logits 1e4 in float16): it would match anything
        if all(c.passed for c in at_p.values()) and checks[worst].error >= at_p[worst].plain_error / PRECISION_SLACK:
            return f"{p} inside"
        low_budgets = {n: c.budget for n, c in at_p.items()}
        for alt in candidates:
            if _explains(alt.convention(), got, x, case, low_budgets, ours, scales):
                return f"{alt.name} + {p} inside"
        if stage == "forward":
            found = _with_rows(candidates, got, x, case, low_budgets, ours, scales)
            if found:
                return f"{found} + {p} inside"
    if all(c.ratio <= LESS_EXACT for c in checks.values()):
        return "less exact"
    return None


def _with_rows(candidates, got, x, case, budgets, ours, scales) -> str | None:
    """A convention together with a masked-row treatment: e.g. the polarity flipped, and NaN rows."""
    shape = (case.B, case.H, case.Lq, case.Lk)
    for alt in candidates:
        if "masked_rows" in alt.change:
            continue
        for rows in ("NaN rows", "uniform rows"):
            conv = replace(alt.convention(), **BY_NAME[rows].change)
            if blocked_rows(effective_mask(x.mask, case, replace(conv, masked_rows="zero")), shape).any() and (
                _explains(conv, got, x, case, budgets, ours, scales)
            ):
                return f"{alt.name} + {rows}"
    return None


def _explains(conv, got: dict, x, case: Case, budgets: dict, ours, scales: dict) -> bool:
    """Whether the function's numbers match ``conv``'s, which differ from ours on this case: forward first (cheap),
    then the gradients."""
    variant = reference(x, case, conv, backward=False)
    forward = [n for n in ("out", "weights") if n in got]
    if not _matches(got, variant, budgets, forward, scales, ours.max_logit):
        return False
    if "dq" in got:
        variant = reference(x, case, conv, backward=True)
    names = list(got)
    # and ``conv`` changes something here: ours against all of the variant's entries (its dont_care ones too: a
    # uniform row's pass-through dq may be the only visible difference in a low dtype)
    everywhere = Tensors(variant.values, max_logit=variant.max_logit)  # the same allowance both ways
    same = _matches(got, variant, budgets, names, scales, ours.max_logit)
    return same and not _matches(ours.values, everywhere, budgets, names, scales, ours.max_logit)


def _matches(got: dict, t, budgets: dict, names, scales: dict, logit: float = 0.0) -> bool:
    """Whether ``got`` equals ``t`` on ``names``: each tensor within MATCH_SLACK times its budget, the budget grown
    by the ratio of t's largest entry to the reference's (``scales``) where t's is larger (errors scale with it; a
    tensor of t that is zero in theory by the ratio of the largest of all of t's tensors to the reference's), and
    by the ratio of t's largest logit to the reference's (``logit``) where t's is larger (the scale forgotten at
    logits 1e4: 8e4, rounded 8 times as coarsely)."""
    theirs = {n: largest(t.values[n]) for n in names}
    overall = max(theirs.values()) / max(max(scales[n] for n in names), 1e-300)
    logits = max(1.0, (1.0 + t.max_logit) / (1.0 + logit))
    for n in names:
        grow = theirs[n] / scales[n] if theirs[n] > 0 and scales[n] > 0 else overall
        if max_error(got[n], t.values[n], t.dont_care.get(n)) > MATCH_SLACK * budgets[n] * max(1.0, grow) * logits:
            return False
    return True
