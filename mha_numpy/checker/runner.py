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
import importlib
from dataclasses import dataclass

import numpy as np

from ..gradcheck import numerical_gradient
from . import bugs, cases
from . import reference as R
from .diagnose import as_grads, compare, matching_bug, scale_of

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


def reference_pair(pair: cases.Pair):
    """(forward, backward or None) of the reference, looked up by name (a later pair is picked up when it lands)."""
    home = importlib.import_module(pair.home)
    fwd, bwd = getattr(home, f"{pair.name}_forward", None), getattr(home, f"{pair.name}_backward", None)
    if fwd is None:  # a pair its home does not have (yet): a forward in checker.reference, finite differences only
        return getattr(R, f"{pair.name}_forward"), None
    return fwd, bwd


def _call(fn, *args):
    """fn(*args) on copies of the arrays (a student's function may modify its inputs)."""
    return fn(*copy.deepcopy(args))


def _out(result):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise _Failed(f"must return (out, cache), returned {type(result).__name__}")
    return result


def _finite(out) -> np.ndarray:
    """The forward's output with -inf (a blocked score, constant under any perturbation) read as 0."""
    out = np.asarray(out, dtype=np.float64)
    return np.where(np.isinf(out), 0.0, out)


def _array(case: cases.Case, name: str):
    """The array named ``name`` among the case's arguments, or inside a dict argument (self-attention's params)."""
    for arg_name, value in case.args:
        if arg_name == name:
            return value
        if isinstance(value, dict) and name in value:
            return value[name]
    raise KeyError(name)


def _numerical(pair: cases.Pair, fwd, case: cases.Case, d_out) -> dict:
    """Central differences of sum(fwd(*case) * d_out) with respect to each input that gets a gradient."""
    return {
        name: numerical_gradient(lambda _x: _finite(fwd(*case.values())[0]), _array(case, name), d_out)
        for name in pair.grads
    }


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


def check_forward(pair: cases.Pair, student_fwd, rng) -> Row:
    ref_fwd, _ = reference_pair(pair)
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

    return run_cases(function, pair.make_cases(rng), run_case)


def check_backward(pair: cases.Pair, student_bwd, student_fwd, rng, forward_failed: bool = False) -> Row:
    ref_fwd, ref_bwd = reference_pair(pair)
    fwd = student_fwd or ref_fwd
    function = f"{pair.name}_backward"
    if ref_bwd is None and student_fwd is None:  # no cache to give the backward but the student's own
        try:
            student_bwd(None, None)
        except NotImplementedError:
            return Row(function, NOT_DONE)
        except Exception:  # noqa: BLE001, S110 - expected: None is no cache
            pass
        return Row(function, "FAIL", f"not checked: make {pair.name}_forward pass first, the backward reads its cache")

    def run_case(case):
        out, cache = _out(_call(fwd, *case.values()))
        # a random upstream gradient, never ones: an all-ones one hides a swapped transpose or a mean-for-sum
        d_out = rng.standard_normal() if pair.scalar_output else rng.standard_normal(np.shape(out))
        try:
            got = as_grads(student_bwd(copy.deepcopy(d_out), cache), pair.grads)
        except NotImplementedError:
            raise
        except Exception as exc:
            if not forward_failed:
                raise
            raise _Failed(f"not checked: fix {pair.name}_forward first, the backward reads its cache") from exc
        expected = as_grads(ref_bwd(d_out, ref_fwd(*case.values())[1]), pair.grads) if ref_bwd else {}
        numerical = _numerical(pair, fwd, case, d_out)
        scale = scale_of([*expected.values(), *numerical.values()])
        for name in pair.grads:
            problem = compare(f"d{name}", got.get(name), expected.get(name, numerical[name]), scale) or compare(
                f"d{name} vs finite differences", got.get(name), numerical[name], scale, FD_RTOL
            )
            if problem:

                def run_variant(bug):
                    return as_grads(bug.impl(d_out, (bug.forward or ref_fwd)(*case.values())[1]), pair.grads)

                raise _Failed(problem, lambda: matching_bug(function, got, run_variant, scale))

    return run_cases(function, pair.make_cases(rng), run_case)


def online_softmax_cases(rng):
    rising = np.cumsum(np.abs(rng.standard_normal((2, 3, 7))), axis=-1) * 3  # the max grows block after block
    masked = rng.standard_normal((2, 3, 7))
    masked[0, 1, :3] = -np.inf  # the first block of this row has no key allowed
    masked[1, 2, :] = -np.inf  # this row has none at all: context 0
    v = rng.standard_normal((2, 7, 4))
    return [
        cases.Case(f"scores {s.shape}, block {b}{extra}", [("scores", s), ("v", v), ("block", b)])
        for s, extra in [(rising, ", rising scores"), (masked, ", masked blocks")]
        for b in (2, 3)
    ]


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

    return run_cases(function, online_softmax_cases(rng), run_case)


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
