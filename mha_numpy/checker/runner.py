"""Run a student's functions against the reference pairs and finite differences, one Row per function.

The student is an ``InProcess`` namespace or a ``ChildProcess`` file (``checker.student``, ``checker.process``):
every call of a student's function goes through ``student.call``, on copies, and fails the function that
changed its arguments. For each pair the student defines (``NAME_forward`` and/or ``NAME_backward``), on every
case of the pair (``mha_numpy.pairs``): the forward is compared with the reference forward; the backward gets a
random upstream gradient and is compared with the reference backward and with float64 central differences of
the forward. The backward reads the cache of the student's forward when that forward passed, else the
reference forward's cache (so a student can write the backward alone). A wrong gradient is first related to the
right one (``relations``: a factor, a transpose, a sum, a path, a part), then matched against the buggy variants in
``bugs`` for a diagnosis. All the judging happens here, in the checker's process.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import numpy as np

from ..gradcheck import numerical_gradient
from ..pairs import Case, Pair, ReturnConventionError, gradients
from . import bugs, cases, pair_hints, relations
from . import reference as R
from .capstone import MODEL, Capstone
from .capstone_block import BLOCK
from .diagnose import compare, crash_bug, matching_bug, scale_of
from .load import StudentFileError
from .student import Abort, Mutated, StudentFault

FD_RTOL = 1e-5  # central differences with eps = 1e-6 in float64 agree to ~1e-9 of the largest entry
NOT_DONE = "not done yet"
CAPSTONES = (MODEL, BLOCK)  # the whole-backward exercises (checker.capstone)
ONLINE_ARGS = ("m", "l", "acc", "scores", "v")  # online_softmax_update's arguments


@dataclass
class Row:
    """The verdict on one function: PASS, FAIL (detail; the relation of the wrong gradient to the right one when
    ``checker.relations`` finds one, and a diagnosis when a known bug matches) or not done yet."""

    function: str
    status: str
    detail: str = ""
    bug: bugs.Bug | None = None
    relation: str = ""

    @property
    def diagnosis(self) -> str:
        return self.bug.diagnosis() if self.bug else ""


class _Failed(Exception):
    """A case failed: the message is the row's detail; ``find_bug()`` looks for the known bug it matches."""

    def __init__(self, detail: str, find_bug=None, crash: bool = False, relation: str = "", names=None):
        super().__init__(detail)
        self.names = names  # the case's factor names (``_names``): a factor is named by what fits on every case
        self.find_bug = find_bug
        self.crash = crash  # the student's function raised: its diagnosis matched an error message, not values
        self.relation = relation  # how the wrong gradient relates to the right one (checker.relations), or ""


def _out(result):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise _Failed(f"must return (out, cache), returned {type(result).__name__}")
    return result


def finite(out) -> np.ndarray:
    """The forward's output with -inf (a blocked score, constant under any perturbation) read as 0."""
    out = np.asarray(out, dtype=np.float64)
    return np.where(np.isinf(out), 0.0, out)


def finite_differences(forward_many, case: Case, names, d_out) -> dict:
    """Central differences of sum(forward(*case) * d_out) with respect to each input in ``names``.

    ``forward_many(list of argument lists) -> list of outputs`` runs the forward on every perturbed copy of the
    case at once (a student's forward in a child process: one message instead of two per element). The
    perturbed copies are recorded by a first pass of ``numerical_gradient``, whose second pass reads the outputs.
    """
    return {name: _finite_difference(forward_many, case, name, d_out) for name in names}


def _finite_difference(forward_many, case: Case, name: str, d_out) -> np.ndarray:
    recorded: list = []

    def record(_x):
        recorded.append(copy.deepcopy(case.values()))
        return np.zeros(np.shape(d_out))

    numerical_gradient(record, case.array(name), d_out)
    outputs = iter(forward_many(recorded))
    return numerical_gradient(lambda _x: finite(next(outputs)), case.array(name), d_out)


def raised(exc: BaseException) -> str:
    """A student's exception as its row's detail says it: "raised ValueError: <its first line>" (a StudentFault, from
    a child process, already says so)."""
    if isinstance(exc, StudentFault):
        return str(exc)
    message = (str(exc).splitlines() or [""])[0][:100]
    return f"raised {type(exc).__name__}{': ' + message if message else ''}"


def _call(student, function: str, args, run_variant, **kw):
    """``student.call``; a crash becomes a FAIL whose diagnosis is the known bug that raises the same error here
    (``.T`` on a 4-D array: NumPy's message names no transpose, the diagnosis does)."""
    try:
        return student.call(function, args, **kw)
    except (NotImplementedError, Mutated, Abort, StudentFileError):
        raise
    except Exception as exc:  # noqa: BLE001 - the student's crash (here, or a StudentFault from a child process)
        same, said = _same_error(exc), relations.from_error(function, raised(exc))
        raise _Failed(raised(exc), lambda: crash_bug(function, same, run_variant), crash=True, relation=said) from exc


def _same_error(exc: Exception):
    """``same(variant's exception) -> bool``: the same type and message (as far as a child process sent it)."""
    if isinstance(exc, StudentFault):  # from a child process: only its first 100 characters came back
        return lambda other: raised(other) == str(exc)
    return lambda other: type(other) is type(exc) and str(other) == str(exc)


def _padded(pair: Pair, result, case: Case) -> dict:
    """A backward's result that owes more gradients than it returned, read as the first ones with None for the
    rest (a forgotten bias gradient: ``return dx, dW``), so that a diagnosis can recognise it."""
    given = pair.owed(case)
    result = list(result) if isinstance(result, tuple | list) else [result]
    return dict(zip(given, result + [None] * (len(given) - len(result))))


def run_cases(function: str, case_list, run_case, student) -> Row:
    """Row for ``function``: PASS if ``run_case(case)`` passes on every case; else the first failure, diagnosed.

    The diagnosis: the first known bug whose output the student's reproduces on a case, else the first whose error
    a crash of the student's function repeats (equal values say more than an equal message: a swapped transpose
    crashes where Lq != Lk, as `.T` does, and only the square case tells them apart).
    """
    student.start(function)
    first, bug, crash_guess, relation, crash_said, factors = None, None, None, "", "", []
    for case in case_list:
        try:
            with np.errstate(all="ignore"):  # a student's NaN is reported in the row, not as a warning
                run_case(case)
        except NotImplementedError:
            return Row(function, NOT_DONE)
        except Abort as stop:  # out of time, or the process died: no further case
            return Row(function, "FAIL", f"{stop} [case {case.label}]")
        except (_Failed, Mutated, StudentFault) as failure:
            first = first or f"{failure} [case {case.label}]"
            said = getattr(failure, "relation", "")
            if getattr(failure, "crash", False):  # what an error message says: only when no case's values say more
                crash_said = crash_said or said
            else:
                relation = relation or said
                factors += [(said, getattr(failure, "names", None))] if said else []
            if getattr(failure, "find_bug", None) is None:
                continue
            if getattr(failure, "crash", False):
                crash_guess = crash_guess or failure.find_bug()
            elif bug is None:
                bug = failure.find_bug()
        except StudentFileError:  # the file cannot be run again: not a verdict on this function
            raise
        except Exception as exc:  # noqa: BLE001 - a student's crash (in this process) is a FAIL, not ours
            first = first or f"{raised(exc)} [case {case.label}]"
    if first is None:
        return Row(function, "PASS")
    if relation and factors and factors[0][0] == relation:
        relation = relations.agreed_factor(factors)
    if bug is not None and relations.ONE_INDEX in relation:  # the catalogue's match of the values says more
        relation = ""
    return Row(function, "FAIL", first, bug or crash_guess, relation or crash_said)


def check_forward(pair: Pair, student, rng) -> Row:
    function = f"{pair.name}_forward"

    def run_case(case):
        def run_variant(bug):
            return {"out": bug.impl(*case.values())[0]}

        got = _out(_call(student, function, case.args, run_variant, keep_cache=False))[0]
        expected = pair.forward(*case.values())[0]
        scale = scale_of([expected])
        problem = compare("out", got, expected, scale)
        if problem:
            try:
                paths, parts = pair_hints.forward_hints(pair, case)
                variants = pair_hints.forward_variants(pair, case)
            except (ValueError, TypeError, KeyError, ArithmeticError):
                paths, parts, variants = {}, {}, {}
            said = relations.explain("out", f"of {function}", _first(got), expected, scale, names=_names(case),
                                     paths=paths, masked_rows=_masked_rows(case), parts=parts,
                                     variants=variants)  # fmt: skip
            find = lambda: matching_bug(function, {"out": got}, run_variant, scale, {"out": expected})  # noqa: E731
            raise _Failed(problem, find, relation=said)

    return run_cases(function, pair.cases(rng), run_case, student)


def _first(out):
    """A forward's output as an array, or None when it is not one (a tuple returned for the output)."""
    try:
        return np.asarray(out, dtype=np.float64)
    except (ValueError, TypeError):
        return None


def check_backward(pair: Pair, student, own_forward: bool, rng, forward_failed: bool = False) -> Row:
    """``own_forward``: the student's forward passed, so the backward reads its cache (else the reference's)."""
    function, forward_name = f"{pair.name}_backward", f"{pair.name}_forward"

    def run_case(case):
        names = [name for name, _ in case.args]

        def forward_many(value_lists) -> list:
            if own_forward:
                results = student.call_many(forward_name, [list(zip(names, values)) for values in value_lists])
                return [_out(result)[0] for result in results]
            return [pair.forward(*values)[0] for values in value_lists]

        if own_forward:
            out, cache = _out(student.call(forward_name, case.args))
            _another_forward(student, forward_name, case)  # a cache that a later call overwrites shows now
        else:
            out, cache = pair.forward(*case.values())
        # a random upstream gradient, never ones: an all-ones one hides a swapped transpose or a mean-for-sum
        d_out = rng.standard_normal() if pair.scalar_output else rng.standard_normal(np.shape(out))

        def run_variant(bug):
            return gradients(pair, bug.impl(d_out, (bug.forward or pair.forward)(*case.values())[1]), case)

        try:
            result = _call(student, function, [("d_out", d_out), ("cache", cache)], run_variant)
        except _Failed as failed:
            if not forward_failed:
                raise
            detail = f"not checked: fix {forward_name} first, the backward reads its cache"
            raise _Failed(detail, failed.find_bug, crash=True) from failed  # a crash a known bug makes: named
        expected = gradients(pair, pair.backward(d_out, pair.forward(*case.values())[1]), case)
        try:
            got = gradients(pair, result, case)
        except ReturnConventionError as e:
            padded, scale = _padded(pair, result, case), scale_of(expected.values())
            said = next((s for n in pair.owed(case) if padded.get(n) is None
                         for s in [_relation(pair, case, n, padded, expected, scale, d_out)] if s), "")  # fmt: skip
            said = said or _zeros_for_absent(pair, result, case)
            find = lambda: matching_bug(function, padded, run_variant, scale, expected)  # noqa: E731
            raise _Failed(str(e), find, relation=said) from None
        numerical = finite_differences(forward_many, case, pair.owed(case), d_out)
        scale = scale_of([*expected.values(), *numerical.values()])
        for name in pair.owed(case):
            problem = compare(f"d{name}", got.get(name), expected[name], scale) or compare(
                f"d{name} vs finite differences", got.get(name), numerical[name], scale, FD_RTOL
            )
            if problem:
                if own_forward and _right_on_reference_cache(student, pair, case, d_out, expected, scale):
                    problem += (
                        f"; with the reference forward's cache it is right: {forward_name}'s output passed, but its"
                        " cache holds something else than what the backward reads"
                    )
                    said = (f"d{name} (in {function}) is right when it reads the reference forward's cache: the cache "
                            f"{forward_name} returns is what is wrong (a value changed after it was stored, or "
                            "another quantity than the backward reads); store what the backward needs")  # fmt: skip
                    own = _relation(pair, case, name, got, expected, scale, d_out)
                    prefix = f"d{name} (in {function}) "
                    if own.startswith(prefix):  # the pair as it stands: said by its own result, no mutation claimed
                        said = (f"{prefix}is right when it reads the reference forward's cache: the cache "
                                f"{forward_name} returns holds another quantity than the backward reads (a convention "
                                "of its own, or a value changed after it was stored); with its own cache, "
                                f"d{name} {own[len(prefix):-1]}")  # fmt: skip
                    if _right_straight_after_forward(student, pair, case, d_out, expected, scale):
                        said = (f"d{name} (in {function}) is right when the backward runs straight after its forward, "
                                f"wrong when another {forward_name} call comes between: the cache shares memory with "
                                "state the next call overwrites (a module-level buffer, an attribute kept between "
                                "calls); return this call's own arrays")  # fmt: skip
                    raise _Failed(problem, lambda: matching_bug(function, got, run_variant, scale, expected),
                                  relation=said + ".", names=_names(case))  # fmt: skip
                said = _order(pair, case, result, expected, scale) or _relation(
                    pair, case, name, got, expected, scale, d_out
                )
                find = lambda: matching_bug(function, got, run_variant, scale, expected)  # noqa: E731
                raise _Failed(problem, find, relation=said, names=_names(case))

    return run_cases(function, pair.cases(rng), run_case, student)


def _order(pair: Pair, case: Case, result, expected: dict, scale: float) -> str:
    """The sentence for a backward that returns the right gradients in another order than the forward's inputs
    ("returns (dk, dq); the order is (dq, dk)"), or "" (a dict, another count, or no order of them is right)."""
    given = pair.owed(case)
    if not isinstance(result, tuple | list) or len(result) != len(given) or not 2 <= len(given) <= 5:
        return ""
    for order in itertools.permutations(range(len(given))):  # order[i]: the position that holds d(given[i])
        if order != tuple(range(len(given))) and all(
            compare(n, result[j], expected[n], scale) is None for n, j in zip(given, order)
        ):
            returned = [given[order.index(j)] for j in range(len(given))]
            said, right = ", ".join(f"d{n}" for n in returned), ", ".join(f"d{n}" for n in given)
            return (f"{pair.name}_backward returns the right gradients in the wrong order: it returns ({said}); the "
                    f"order is ({right}), the forward's inputs' order.")  # fmt: skip
    return ""


def _zeros_for_absent(pair: Pair, result, case: Case) -> str:
    """One gradient per entry of ``pair.grads`` where the case gives fewer inputs: the first absent input's gradient
    that is an array of zeros, said by ``relations.zeros_for_none`` ("" when none is)."""
    if not isinstance(result, tuple | list) or len(result) != len(pair.grads):
        return ""
    for name, grad in zip(pair.grads, result):
        said = None if case.gives(name) else relations.zeros_for_none(grad)
        if said:
            return f"d{name} (in {pair.name}_backward) {said}."
    return ""


def _names(case: Case) -> dict[str, float]:
    """The factors worth naming on ``case``: the call's own numbers (scale, p and 1 − p, cap, n_rep, block), √d and d
    of attention's q, the batch size, N (the rows), the number of heads, the positions (Lq) and the keys (Lk)."""
    args = dict(case.args)
    first = next((np.asarray(v) for v in args.values() if isinstance(v, np.ndarray) and v.ndim >= 2), None)
    features = np.shape(args["q"])[-1] if np.ndim(args.get("q")) >= 2 else 0  # attention's d: its scale is 1/√d
    sizes = {n: v for n, v in args.items() if isinstance(v, int | float) and not isinstance(v, bool)}  # scale, p, cap
    sizes.update({f"1 − {n}": 1 - v for n, v in sizes.items() if 0 < v < 1 and n != "scale"})  # dropout's keep
    sizes["d"] = features  # √d: attention's scale
    shapes = {"the batch size": 0 if first is None else first.shape[0]}
    if first is not None and first.ndim >= 3:
        shapes["N (the rows, every axis but the last)"] = int(np.prod(first.shape[:-1]))
    if first is not None and first.ndim == 3:
        shapes["L (axis 1, the positions)"] = first.shape[1]
    if first is not None and first.ndim == 4:
        shapes["the number of heads"] = first.shape[1]
        shapes["Lq (the query positions)"] = first.shape[2]
    if np.ndim(args.get("k")) == 4:
        shapes["Lk (the keys)"] = np.shape(args["k"])[2]
    names = relations.factor_names(shapes, **sizes)
    p = args.get("p")
    if isinstance(p, float) and 0 < p < 1:  # dropout's 1/p where 1/(1 − p) belongs, and the reverse
        keep = 1 - p
        names.update({"(1 − p)/p": keep / p, "p/(1 − p)": p / keep})
        names.update({"(1 − p)²": keep**2, "1/(1 − p)²": 1 / keep**2})  # 1 − p where 1/(1 − p) belongs
    return names


def _masked_rows(case: Case):
    """bool, True on a row with no key allowed (a bool mask's empty row, or a row of −inf scores), or None."""
    args = dict(case.args)
    first = next((np.asarray(v) for v in args.values() if isinstance(v, np.ndarray) and v.ndim >= 2), None)
    if isinstance(args.get("mask"), np.ndarray) and args["mask"].dtype == bool:
        return ~args["mask"].any(axis=-1)
    if first is not None and np.issubdtype(first.dtype, np.floating) and np.isneginf(first).any():
        return np.isneginf(first).all(axis=-1)
    return None


def _relation(pair: Pair, case: Case, name: str, got: dict, expected: dict, scale: float, d_out) -> str:
    """``relations.explain`` for the gradient ``name`` of a pair's backward, with what the case tells: the sizes whose
    factors are named, the fully masked rows, and the paths and parts of ``pair_hints`` (run only here, on a wrong
    gradient)."""
    try:
        (paths, parts), arrays = pair_hints.hints(pair, case, name, d_out), pair_hints.factor_arrays(pair, case, name)
        axes = pair_hints.axes(pair, case, name, d_out)
        weights = pair_hints.transposed_weights(pair, case, name, d_out)
    except (ValueError, TypeError, KeyError, ArithmeticError):  # a case the hints do not fit: the other relations
        paths, parts, arrays, axes, weights = {}, {}, {}, {}, {}
    return relations.explain(f"d{name}", f"in {pair.name}_backward", got.get(name), expected[name], scale,
                             names=_names(case), paths=paths, masked_rows=_masked_rows(case), parts=parts,
                             arrays=arrays, axes=axes, weights=weights)  # fmt: skip


def _right_on_reference_cache(student, pair: Pair, case: Case, d_out, expected: dict, scale: float) -> bool:
    """True when the student's backward, given the reference forward's cache, returns the expected gradients: then
    the student's forward is what is wrong, in the cache it returns (1/ℓ stored as ℓ, a NaN kept for a masked row)."""
    try:
        result = student.call(f"{pair.name}_backward", [("d_out", d_out), ("cache", pair.forward(*case.values())[1])])
        got = gradients(pair, result, case)
    except (Abort, StudentFileError):
        raise
    except Exception:  # noqa: BLE001 - a backward written for its own cache's layout: no hint
        return False
    return all(compare(n, got.get(n), expected[n], scale) is None for n in pair.owed(case))


def _another_forward(student, forward_name: str, case: Case) -> None:
    """Call the student's forward once on other values of the same shapes (every float array halved and shifted),
    its result dropped: between a forward and its backward, as when two layers run forward before either runs
    backward. A cache that shares memory with what that call overwrites then gives a wrong backward. A crash here is
    not this check's verdict (the case's own calls give it)."""
    other = [(n, v * 0.5 + 0.25 if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v) for n, v in case.args]
    try:
        student.call(forward_name, other, keep_cache=False)
    except (Abort, StudentFileError):
        raise
    except Exception:  # noqa: BLE001, S110 - the student's forward on other values: judged on the case's own
        pass


def _right_straight_after_forward(student, pair: Pair, case: Case, d_out, expected: dict, scale: float) -> bool:
    """True when the student's backward is right on the cache of a forward called just before it (no other call
    between): its wrong gradient came from the forward call that ``_another_forward`` made in between."""
    try:
        cache = _out(student.call(f"{pair.name}_forward", case.args))[1]
        got = gradients(pair, student.call(f"{pair.name}_backward", [("d_out", d_out), ("cache", cache)]), case)
    except (Abort, StudentFileError):
        raise
    except Exception:  # noqa: BLE001 - any other failure: not this hint
        return False
    return all(compare(n, got.get(n), expected[n], scale) is None for n in pair.owed(case))


def check_online_softmax(student, rng) -> Row:
    function = cases.ONLINE_SOFTMAX

    def update(*args):
        return student.call(function, list(zip(ONLINE_ARGS, args)), keep_cache=False)

    def run_case(case):
        scores, v, block = case.values()
        got = R.online_softmax_attention(update, scores, v, block)
        expected = R.direct_attention(scores, v)
        scale = scale_of([expected])
        problem = compare("context = acc / l", got, expected, scale)
        if problem:
            masked = np.isneginf(scores).all(axis=-1)
            said = relations.explain("the context acc / l", f"from {function}'s running m, l and acc", _first(got),
                                     expected, scale, names=relations.factor_names(block=block),
                                     masked_rows=masked)  # fmt: skip

            def run_variant(bug):
                return {"out": R.online_softmax_attention(bug.impl, scores, v, block)}

            find = lambda: matching_bug(function, {"out": got}, run_variant, scale, {"out": expected})  # noqa: E731
            raise _Failed(problem, find, relation=said)

    return run_cases(function, cases.online_softmax_cases(rng), run_case, student)


def check_capstone(student, capstone: Capstone, seed: int | None = None) -> Row:
    """Row for a capstone's whole backward: every gradient of every case of ``capstone.cases`` against the
    library's; a FAIL names the first wrong one (the step where the bug is) and the catalogued bug it matches.
    ``seed``: other random inputs and parameters (the same shapes), e.g. a teacher's hidden cases."""
    function = capstone.function
    student.start(function)
    shifted = [case if seed is None else {**case, "seed": seed + case.get("seed", 0)} for case in capstone.cases]
    for case in shifted:
        label = ", ".join(f"{k}={v}" for k, v in case.items())
        try:
            with np.errstate(all="ignore"):
                got = student.call(function, [("cache", capstone.make_case(**case)[0])], keep_cache=False)
        except NotImplementedError:
            return Row(function, NOT_DONE)
        except (Mutated, StudentFault) as failure:
            return Row(function, "FAIL", f"{failure} [case {label}]")
        except StudentFileError:
            raise
        except Exception as exc:  # noqa: BLE001 - a student's crash (in this process) is a FAIL, not ours
            message = (str(exc).splitlines() or [""])[0][:100]
            return Row(function, "FAIL", f"raised {type(exc).__name__}: {message} [case {label}]")
        if not isinstance(got, dict):
            return Row(function, "FAIL", f"must return a dict of gradients by name, returned {type(got).__name__}")
        _, wrong, bug, said = capstone.judge(got, case)
        if wrong is not None:
            why = wrong.problem or f"max diff {wrong.max_diff:.1e}"
            return Row(function, "FAIL", f"first wrong: {wrong.label} d_{wrong.name} ({why}) [case {label}]", bug, said)
    return Row(function, "PASS")


def plan(names, only=None) -> list[str]:
    """The functions of ``names`` the checker knows, in the order they are checked (``only``: pair names)."""
    names = set(names)
    out = []
    for pair in cases.PAIRS:
        if only is None or pair.name in only:
            out += [f for f in (f"{pair.name}_forward", f"{pair.name}_backward") if f in names]
    if cases.ONLINE_SOFTMAX in names and (only is None or "online_softmax" in only):
        out.append(cases.ONLINE_SOFTMAX)
    out += [c.function for c in CAPSTONES if c.function in names and (only is None or c.name in only)]
    return out


def check_student(student, only=None, on_row=None, seed: int | None = None) -> list[Row]:
    """One Row per function of ``plan(student.names, only)``; ``on_row(row)`` is called as each one is known.

    ``seed``: None, the cases every student sees (seeds 0, 1, 2); an int, other random inputs of the same shapes
    (the teacher's hidden cases of ``checker.grading``).
    """
    todo, rows = plan(student.names, only), []

    def rng(i: int) -> np.random.Generator:
        return np.random.default_rng(i if seed is None else [seed, i])

    def done(row: Row) -> Row:
        rows.append(row)
        if on_row is not None:
            on_row(row)
        return row

    for pair in cases.PAIRS:
        fwd, bwd = f"{pair.name}_forward", f"{pair.name}_backward"
        fwd_row = done(check_forward(pair, student, rng(0))) if fwd in todo else None
        if bwd in todo:
            passed = fwd_row is not None and fwd_row.status == "PASS"
            failed = fwd_row is not None and fwd_row.status == "FAIL"
            done(check_backward(pair, student, passed, rng(1), failed))
    if cases.ONLINE_SOFTMAX in todo:
        done(check_online_softmax(student, rng(2)))
    for c in CAPSTONES:
        if c.function in todo:
            done(check_capstone(student, c, seed))
    return rows
