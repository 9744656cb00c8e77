"""Ground truth for a torch FlexAttention call and its backward (issue 36): torch's eager ``flex_attention`` forward
on the CPU in float64 against ``mha_numpy.flex``'s, and your backward (your GPU kernel's gradients, FA4's
``score_mod_bwd``, your own Triton) against ours in float64, naming the first wrong gradient.

    report = verify_flex(soft_cap, causal, params={"cap": cap}, backward=my_backward)
    print(report); report.passed; report.first_wrong      # e.g. ("dq", 3.2e-02, the case's id)

The mods are torch's, ``score_mod(score, b, h, q_idx, kv_idx)`` and ``mask_mod(b, h, q_idx, kv_idx)`` (callables
or "MODULE:FUNCTION"); a tensor the score_mod captures is a keyword of it (``def soft_cap(score, b, h, q, kv, *,
cap)``) bound to ``params[name]``: a float64 tensor for torch, the array for ours, so both read the same numbers and
ours returns its gradient. Ours runs each mod's NumPy twin; with no twin given, the torch function itself runs on
NumPy arrays (``score * 2``, ``q_idx >= kv_idx`` do; ``torch.tanh`` does not) and the report says so.

Your backward: ``backward(q, k, v, params, d_out) -> (dq, dk, dv, d_params)`` on float64 NumPy arrays in torch's
layout, q (B, Hq, Lq, d), k, v (B, Hkv, Lk, d) (Hkv < Hq on the GQA case: enable_gqa), d_out (B, Hq, Lq, d),
``d_params`` {name: gradient}; it may return torch tensors (on any device). It is handed copies; one it writes into
is named and fails the case.

The cases (``flex_cases``): batch 2 with Lq < Lk; Lq > Lk; GQA when asked (``gqa=True``); a row the mask blocks
entirely, at the first shape where the mask_mod blocks one. Judged in this order, the first wrong one named: out and
lse (ours, running the twins, against torch's: a twin that means something else is caught here, and the gradients
are then not judged), then dq, dk, dv and each parameter in ``params``' order (yours against
``flex_attention_backward`` of the twins: the score's derivative by complex steps, probed against central
differences, or the twin's VJP). A tensor passes within ``tol`` (1e-10) times the largest magnitude of what it is
judged against (the case's largest such tensor where that one is zero everywhere). Nothing is judged against itself:
the forward against torch's, your gradients against ours.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import types
import warnings
import zlib
from dataclasses import dataclass

import numpy as np

from .. import flex
from .._optional import require
from .flex_cases import FlexCase, flex_cases
from .flex_report import TOL, FlexReport
from .flex_twins import as_float64, known_twin, numpy_twin, read_params, resolve
from .report import CaseResult
from .tolerance import Check, largest, max_error
from .verify import Exited, exit_guard, select

# --------------------------------------------------------------------------- the run


def verify_flex(score_mod=None, mask_mod=None, **options):
    """Check a torch FlexAttention call (its ``score_mod`` and/or ``mask_mod``) and, if given, your ``backward``
    against ours -> a FlexReport (module docstring); the options are ``plan_flex``'s."""
    plan = plan_flex(score_mod, mask_mod, **options)
    start, cpu = time.perf_counter(), time.process_time()
    results = [plan.run.case(c) for c in plan.cases]
    return FlexReport(plan.name, f"{len(plan.cases)} flex", results, plan.notes, time.perf_counter() - start,
                      time.process_time() - cpu, tol=plan.run.tol)  # fmt: skip


@dataclass
class FlexPlan:
    """A ``verify_flex`` call before it runs: what runs each case, the cases, the notes, the report's name."""

    run: FlexRun
    cases: list
    notes: list
    name: str


def plan_flex(score_mod=None, mask_mod=None, *, numpy_score_mod=None, numpy_mask_mod=None,
              numpy_score_mod_vjp=None, params=None, backward=None, heads: int = 4, gqa: bool = False,
              cases=None, only: str | None = None, tol: float = TOL, name: str | None = None) -> FlexPlan:  # fmt: skip
    """The mods resolved and their twins found, the cases chosen -> a FlexPlan (``verify_flex`` runs it, and so does
    ``verify --flex``'s child process, a case at a time). numpy_score_mod, numpy_mask_mod: the twins (default: the
    torch functions, tried on NumPy arrays); numpy_score_mod_vjp: the twin's VJP, where complex steps cannot derive
    it (np.abs); params: {name: array or tensor} bound to the score_mod's keywords; heads: Hq of the cases; gqa: add
    a GQA case; cases: a list of ``FlexCase`` instead; only: the cases whose id contains it; tol: the tolerance.
    ValueError naming the argument for what cannot run at all; MissingDependency without torch."""
    score_mod, mask_mod, backward = (resolve(f, n) for f, n in ((score_mod, "score_mod"), (mask_mod, "mask_mod"),
                                                                 (backward, "backward")))  # fmt: skip
    numpy_score_mod, numpy_mask_mod, numpy_score_mod_vjp = (resolve(f, n) for f, n in (
        (numpy_score_mod, "numpy_score_mod"), (numpy_mask_mod, "numpy_mask_mod"),
        (numpy_score_mod_vjp, "numpy_score_mod_vjp")))  # fmt: skip
    if score_mod is None and mask_mod is None:
        raise ValueError("give score_mod, mask_mod or both: torch's call to check")
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be a positive integer, got {heads!r}")
    if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    params = read_params(params)
    if params and score_mod is None:
        raise ValueError("params are given but no score_mod reads them")
    torch = require("torch", "verify_flex (torch's eager flex_attention is the forward's reference)")
    notes = []
    np_score, np_mask = None, None
    if score_mod is not None:
        np_score = numpy_twin(score_mod, numpy_score_mod, "score_mod", "numpy_score_mod= / --numpy-twin", params,
                              notes, "score")  # fmt: skip
    if mask_mod is not None:
        np_mask = numpy_twin(mask_mod, numpy_mask_mod or known_twin(torch, mask_mod), "mask_mod",
                             "numpy_mask_mod= / --numpy-mask-twin", {}, notes, "mask")  # fmt: skip
    if backward is None:
        notes.append("no backward given: the forward alone is checked (torch's against ours)")
    chosen = flex_cases(np_mask, heads, gqa) if cases is None else list(cases)
    chosen = select(chosen, only)
    if not any("fully masked row" in c.name for c in chosen) and mask_mod is not None and cases is None:
        notes.append("the mask_mod blocks no whole row at the shapes tried: no fully masked row was checked")
    run = FlexRun(torch, score_mod, mask_mod, np_score, np_mask, numpy_score_mod_vjp, params, backward, tol)
    label = name or " + ".join(getattr(f, "__name__", "mod") for f in (score_mod, mask_mod) if f is not None)
    return FlexPlan(run, chosen, notes, f"flex {label}")


@dataclass
class FlexRun:
    """What every case of one ``verify_flex`` call runs: the torch mods, their twins, the params, the backward."""

    torch: object
    score_mod: object
    mask_mod: object
    np_score: object
    np_mask: object
    np_vjp: object
    params: dict
    backward: object
    tol: float

    def case(self, case: FlexCase) -> CaseResult:
        """One case: torch's forward, ours, then your backward against ours; PASS, FAIL or ERROR."""
        rng = np.random.default_rng(zlib.crc32(case.id.encode()))
        q = rng.standard_normal((case.B, case.H, case.Lq, case.d))
        k, v = (rng.standard_normal((case.B, case.Hkv, case.Lk, case.d)) for _ in range(2))
        d_out = rng.standard_normal(q.shape)
        try:
            t_out, t_lse = self.torch_forward(q, k, v, case)
        except Exception as e:  # noqa: BLE001 - the torch mods are the user's code
            return CaseResult(case, "ERROR", message=_raised("torch's flex_attention with your mods", e))
        try:
            out, cache = flex.flex_attention_forward(q, k, v, self.np_score, None, None, case.enable_gqa,
                                                     self.params or None, self.np_vjp, self.np_mask)  # fmt: skip
        except ValueError as e:  # the twin: refused by ours (a probe asking for its VJP, a wrong shape)
            return CaseResult(case, "ERROR", message=_raised("the NumPy twin in mha_numpy.flex", e))
        checks = {"out": self.check("out", out, t_out, [t_out, t_lse]),
                  "lse": self.check("lse", cache.lse, t_lse, [t_out, t_lse])}  # fmt: skip
        if not all(c.passed for c in checks.values()):
            first = _first(checks)
            return CaseResult(case, "FAIL", checks, message=f"first wrong: {first.name}: ours (the NumPy twins) "
                              "against torch's forward; the twin does not compute what the torch mod does (gradients "
                              "not judged)")  # fmt: skip
        if self.backward is None:
            return CaseResult(case, "PASS", checks)
        ours = flex.flex_attention_backward(d_out, cache)
        return self.judge_backward(case, (q, k, v, d_out), ours, checks)

    def torch_forward(self, q, k, v, case: FlexCase):
        """torch's eager flex_attention on the CPU in float64 -> (out, lse) as NumPy arrays."""
        torch = self.torch
        from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

        bound = {n: torch.tensor(p) for n, p in self.params.items()}
        mod = self.score_mod
        if mod is not None and bound:
            mod = lambda s, b, h, m, n: self.score_mod(s, b, h, m, n, **bound)  # noqa: E731 - captured, as torch's
        default = torch.get_default_dtype()
        with warnings.catch_warnings(), importable(self.score_mod, self.mask_mod):
            warnings.simplefilter("ignore")  # "called without torch.compile()": eager is the reference wanted
            torch.set_default_dtype(torch.float64)  # a float made inside a mod (torch.tan(b)): float64 too
            try:
                block = None
                if self.mask_mod is not None:
                    block = create_block_mask(self.mask_mod, case.B, case.H, case.Lq, case.Lk, device="cpu")
                out, aux = flex_attention(*map(torch.tensor, (q, k, v)), mod, block, enable_gqa=case.enable_gqa,
                                          return_aux=AuxRequest(lse=True))  # fmt: skip
            finally:
                torch.set_default_dtype(default)
        return out.numpy(), aux.lse.numpy()

    def check(self, name: str, got, ref: np.ndarray, of_case: list) -> Check:
        """got against ref: within tol times max|ref| (max over the case's tensors where ref is zero)."""
        scale = largest(ref) or max((largest(a) for a in of_case), default=0.0) or 1.0
        budget = self.tol * scale
        return Check(name, math.inf if got is None else max_error(got, ref), 0.0, budget, budget)

    def judge_backward(self, case, inputs, ours, checks) -> CaseResult:
        """Your backward on copies of the inputs, each gradient against ours in order."""
        q, k, v, d_out = inputs
        before = {"q": q, "k": k, "v": v, "d_out": d_out, **{f"params[{n!r}]": p for n, p in self.params.items()}}
        handed = {n: a.copy() for n, a in before.items()}
        given_params = {n: handed[f"params[{n!r}]"] for n in self.params}
        try:
            with np.errstate(all="ignore"), exit_guard():
                got = self.backward(handed["q"], handed["k"], handed["v"], given_params, handed["d_out"])
                got, problem = _gradients(got, list(self.params))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - its exception or exit is this case's result
            if isinstance(e, (SystemExit, Exited)):
                return CaseResult(case, "ERROR", checks, message=f"your backward exited ({e!r:.80}): it must return")
            return CaseResult(case, "ERROR", checks, message=_raised("your backward", e))
        written = tuple(n for n in before if not np.array_equal(handed[n], before[n]))
        dq, dk, dv, d_params = ours
        refs = {"dq": dq, "dk": dk, "dv": dv, **d_params}
        for n, ref in refs.items():
            if got[n] is not None and got[n].shape != ref.shape:
                problem[n] = f"shape {got[n].shape}, expected {ref.shape}"
            checks[n] = self.check(n, got[n], ref, list(refs.values()))
        wrong = [n for n in refs if not checks[n].passed]
        messages = []
        if written:
            messages.append(f"wrote into its input {', '.join(written)} (a backward must leave its arguments as given)")
        if wrong:
            first = checks[wrong[0]]
            shape = problem.get(first.name)
            messages.append(f"first wrong: {first.name}" + (f" ({shape})" if shape else ""))
        status = "FAIL" if wrong or written else "PASS"
        return CaseResult(case, status, checks, message="; ".join(messages), written=written)


@contextlib.contextmanager
def importable(*functions):
    """While torch runs: each function's module importable by its name. torch's dynamo, which runs inside eager
    flex_attention, imports a mod's ``__module__``; a mod defined by exec'd code (a snippet, a REPL tool) has one
    that is in no ``sys.modules``: a stand-in holding its globals is put there for the call, then taken out."""
    added = []
    for f in functions:
        name = getattr(f, "__module__", None)
        if isinstance(name, str) and name not in sys.modules and isinstance(getattr(f, "__globals__", None), dict):
            stand_in = types.ModuleType(name)
            stand_in.__dict__.update(f.__globals__)
            sys.modules[name] = stand_in
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def _gradients(got, names: list) -> tuple[dict, dict]:
    """(dq, dk, dv, d_params) -> {name: float64 array or None}, {name: what is wrong with it}."""
    if not isinstance(got, (tuple, list)) or len(got) != 4:
        raise TypeError(f"it returned {type(got).__name__}, expected (dq, dk, dv, d_params)")
    dq, dk, dv, d_params = got
    d_params = {} if d_params is None else d_params
    if not isinstance(d_params, dict):
        raise TypeError(f"its d_params is a {type(d_params).__name__}, expected a dict {{name: gradient}}")
    arrays, problems = {}, {}
    for n, a in [("dq", dq), ("dk", dk), ("dv", dv)] + [(n, d_params.get(n)) for n in names]:
        if a is None:
            arrays[n], problems[n] = None, "none returned"
            continue
        arrays[n] = as_float64(a, n)
    return arrays, problems


def _first(checks: dict) -> Check:
    return next(c for c in checks.values() if not c.passed)


def _raised(who: str, e: BaseException) -> str:
    return f"{who} raised {type(e).__name__}: {' '.join(str(e).split())}"[:300]


# --------------------------------------------------------------------------- the report
