"""Run a student's pairs against the reference pairs and finite differences, one Row per function.

For each pair the student defines (``NAME_forward`` and/or ``NAME_backward``), on every case of
``cases.PAIRS``: the forward is compared with the reference forward; the backward gets a random
upstream gradient and is compared with the reference backward and with float64 central differences
of the forward. The backward reads the cache of the student's forward when that forward passed, else
the reference forward's cache (so a student can write the backward alone). A failure is matched
against the buggy variants in ``bugs`` for a diagnosis.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ..gradcheck import numerical_gradient
from ..pairs import Case, Pair, ReturnConventionError, gradients
from . import bugs, cases
from . import reference as R
from .diagnose import compare, matching_bug, scale_of

FD_RTOL = 1e-5  # central differences with eps = 1e-6 in float64 agree to ~1e-9 of the largest entry
NOT_DONE = "not done yet"


@dataclass
class Row:
    """The verdict on one function: PASS, FAIL (detail, and a diagnosis when a known bug matches) or not done yet."""

    function: str
    status: str
    detail: str = ""
    bug: bugs.Bug | None = None

    @property
    def diagnosis(self) -> str:
        return self.bug.diagnosis() if self.bug else ""


class _Failed(Exception):
    """A case failed: the message is the row's detail; ``find_bug()`` looks for the known bug it matches."""

    def __init__(self, detail: str, find_bug=None):
        super().__init__(detail)
        self.find_bug = find_bug


def _call(fn, *args):
    """fn(*args) on copies of the arrays (a student's function may modify its inputs)."""
    return fn(*copy.deepcopy(args))


def _out(result):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise _Failed(f"must return (out, cache), returned {type(result).__name__}")
    return result


def finite(out) -> np.ndarray:
    """The forward's output with -inf (a blocked score, constant under any perturbation) read as 0."""
    out = np.asarray(out, dtype=np.float64)
    return np.where(np.isinf(out), 0.0, out)


def finite_differences(forward, case: Case, names, d_out) -> dict:
    """Central differences of sum(forward(*case)[0] * d_out) with respect to each input in ``names``."""
    return {
        name: numerical_gradient(lambda _x: finite(forward(*case.values())[0]), case.array(name), d_out)
        for name in names
    }


def given(pair: Pair, case: Case) -> list[str]:
    """The differentiable inputs ``case`` passes: the gradients a backward owes on it."""
    return [n for n in pair.grads if case.gives(n)]


def _grads(pair: Pair, result, case: Case) -> dict:
    try:
        return gradients(pair, result, case)
    except ReturnConventionError as e:
        raise _Failed(str(e)) from None


def run_cases(function: str, case_list, run_case) -> Row:
    """Row for ``function``: PASS if ``run_case(case)`` passes on every case; else the first failure, diagnosed."""
    first, bug = None, None
    for case in case_list:
        try:
            with np.errstate(all="ignore"):  # a student's NaN is reported in the row, not as a warning
                run_case(case)
        except NotImplementedError:
            return Row(function, NOT_DONE)
        except _Failed as failure:
            first = first or f"{failure} [case {case.label}]"
            if bug is None and failure.find_bug is not None:
                bug = failure.find_bug()
        except Exception as exc:  # noqa: BLE001 - a student's crash is a FAIL, not ours
            message = (str(exc).splitlines() or [""])[0][:100]
            first = first or f"raised {type(exc).__name__}: {message} [case {case.label}]"
    return Row(function, "PASS") if first is None else Row(function, "FAIL", first, bug)


def check_forward(pair: Pair, student_fwd, rng) -> Row:
    ref_fwd = pair.forward
    function = f"{pair.name}_forward"

    def run_case(case):
        got = _out(_call(student_fwd, *case.values()))[0]
        expected = ref_fwd(*case.values())[0]
        scale = scale_of([expected])
        problem = compare("out", got, expected, scale)
        if problem:
            raise _Failed(
                problem,
                lambda: matching_bug(function, {"out": got}, lambda b: {"out": b.impl(*case.values())[0]}, scale),
            )

    return run_cases(function, pair.cases(rng), run_case)


def check_backward(pair: Pair, student_bwd, student_fwd, rng, forward_failed: bool = False) -> Row:
    ref_fwd, ref_bwd = pair.forward, pair.backward
    fwd = student_fwd or ref_fwd
    function = f"{pair.name}_backward"

    def run_case(case):
        out, cache = _out(_call(fwd, *case.values()))
        # a random upstream gradient, never ones: an all-ones one hides a swapped transpose or a mean-for-sum
        d_out = rng.standard_normal() if pair.scalar_output else rng.standard_normal(np.shape(out))
        try:
            result = student_bwd(copy.deepcopy(d_out), cache)
        except NotImplementedError:
            raise
        except Exception as exc:
            if not forward_failed:
                raise
            raise _Failed(f"not checked: fix {pair.name}_forward first, the backward reads its cache") from exc
        got = _grads(pair, result, case)
        expected = gradients(pair, ref_bwd(d_out, ref_fwd(*case.values())[1]), case)
        numerical = finite_differences(fwd, case, given(pair, case), d_out)
        scale = scale_of([*expected.values(), *numerical.values()])
        for name in given(pair, case):
            problem = compare(f"d{name}", got.get(name), expected[name], scale) or compare(
                f"d{name} vs finite differences", got.get(name), numerical[name], scale, FD_RTOL
            )
            if problem:

                def run_variant(bug):
                    return gradients(pair, bug.impl(d_out, (bug.forward or ref_fwd)(*case.values())[1]), case)

                raise _Failed(problem, lambda: matching_bug(function, got, run_variant, scale))

    return run_cases(function, pair.cases(rng), run_case)


def check_online_softmax(update, rng) -> Row:
    function = "online_softmax_update"

    def run_case(case):
        scores, v, block = case.values()
        got = R.online_softmax_attention(update, scores, v, block)
        expected = R.direct_attention(scores, v)
        scale = scale_of([expected])
        problem = compare("context = acc / l", got, expected, scale)
        if problem:

            def run_variant(bug):
                return {"out": R.online_softmax_attention(bug.impl, scores, v, block)}

            raise _Failed(problem, lambda: matching_bug(function, {"out": got}, run_variant, scale))

    return run_cases(function, cases.online_softmax_cases(rng), run_case)


def check_namespace(namespace: dict, only=None) -> list[Row]:
    """One Row per function of a known pair that ``namespace`` defines (restricted to the pair names in ``only``)."""
    rows = []
    for pair in cases.PAIRS:
        if only is not None and pair.name not in only:
            continue
        fwd, bwd = namespace.get(f"{pair.name}_forward"), namespace.get(f"{pair.name}_backward")
        fwd_row = check_forward(pair, fwd, np.random.default_rng(0)) if callable(fwd) else None
        if fwd_row:
            rows.append(fwd_row)
        if callable(bwd):
            usable = fwd if fwd_row is not None and fwd_row.status == "PASS" else None
            failed = fwd_row is not None and fwd_row.status == "FAIL"
            rows.append(check_backward(pair, bwd, usable, np.random.default_rng(1), failed))
    update = namespace.get("online_softmax_update")
    if callable(update) and (only is None or "online_softmax" in only):
        rows.append(check_online_softmax(update, np.random.default_rng(2)))
    return rows
