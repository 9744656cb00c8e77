"""Measure which check catches each known bug: the numbers of notebooks/10_bug_gallery.ipynb.

For a bug of ``bugs.BUGS`` (switched on by its key), seven checks, each an error relative to the
largest entry of the reference (the gradients' common scale):

- unit · ones / unit · random: the buggy function against the reference pair on the checker's cases,
  with an all-ones / a random upstream gradient (a forward bug: its output, whatever the gradient);
- unit · FD: the buggy pair's backward against central differences of the pair's own forward;
- module · ones / module · random: self-attention with the bug (``bugs.self_attention_pair``) against
  the same module without it, every gradient (x and the eight parameters) and the output;
- module · FD: the buggy module's backward against central differences of its own forward;
- module · torch: against a reference supplied by the caller (the notebook passes torch autograd), on the
  same case without its fully masked row (torch's own softmax gives NaN there).

"crash" means the buggy code raised (e.g. a product whose shapes only match when Lq = Lk); "—" means
the check does not apply (no module path, or no unit function).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..gradcheck import numerical_gradient
from ..pairs import gradients
from . import bugs, cases
from . import reference as R
from .runner import finite_differences

CAUGHT = 1e-6  # an error above this fraction of the largest entry is caught
CHECKS = (
    "unit · ones",
    "unit · random",
    "unit · FD",
    "module · ones",
    "module · random",
    "module · FD",
    "module · torch",
)
MODULE_KEYS = {*bugs.STEP_BUGS, *bugs.MODULE_BUGS, "self_attention_paths"}


@dataclass
class Measurement:
    bug: bugs.Bug
    errors: dict = field(default_factory=dict)  # check -> float, "crash" or None (does not apply)

    crashed: set = field(default_factory=set)  # checks whose buggy code raised on some case (e.g. Lq != Lk)

    def caught(self, check: str) -> bool | None:
        e = self.errors.get(check)
        return None if e is None else (isinstance(e, str) or e > CAUGHT)


def rel_error(got: dict, expected: dict):
    """max over names of max |got - expected| / the largest entry of either side (so 1 means unrelated); the
    absolute error when both sides are zero in theory (below 1e-10: rounding only, no scale to judge against);
    "shape" or "NaN" for a mismatch."""
    arrays = [np.asarray(a, dtype=np.float64) for a in [*expected.values(), *got.values()]]
    scale = max((np.abs(a[np.isfinite(a)]).max() for a in arrays if np.isfinite(a).any()), default=0.0)
    scale = scale if scale > 1e-10 else 1.0  # both sides zero in theory (rounding only): judge the absolute error
    worst = 0.0
    for name, e in expected.items():
        g, e = np.asarray(got[name], dtype=np.float64), np.asarray(e, dtype=np.float64)
        if g.shape != e.shape:
            return "shape"
        if not np.array_equal(np.isnan(g), np.isnan(e)):
            return "NaN"
        ok = ~np.isnan(e)
        worst = max(worst, float(np.abs(g[ok] - e[ok]).max(initial=0.0)) / scale)
    return worst


def _worst(values):
    """The worst result over cases: a mismatch ("shape", "NaN") first, then the largest error, "crash" last."""
    values = list(values)
    for word in ("shape", "NaN"):
        if word in values:
            return word
    numbers = [v for v in values if not isinstance(v, str)]
    return max(numbers) if numbers else ("crash" if values else None)


def _unit(bug: bugs.Bug, case: cases.Case, pair: cases.Pair, rng, ones: bool, fd: bool):
    ref_fwd, ref_bwd = pair.forward, pair.backward
    args = case.values()
    if bug.function.endswith("_forward"):
        if not fd:
            return rel_error({"out": bug.impl(*args)[0]}, {"out": ref_fwd(*args)[0]})
        partner = [b for b in bugs.BUGS if b.key == bug.key and b.function == f"{pair.name}_backward"]
        fwd, bwd = bug.impl, partner[0].impl if partner else ref_bwd
    else:
        fwd, bwd = bug.forward or ref_fwd, bug.impl
    out, cache = fwd(*args)
    d_out = np.ones(np.shape(out)) if ones else rng.standard_normal(np.shape(out))
    got = gradients(pair, bwd(d_out, cache), case)
    if fd:
        expected = finite_differences(
            lambda value_lists: [fwd(*v)[0] for v in value_lists], case, pair.owed(case), d_out
        )
    else:
        expected = gradients(pair, ref_bwd(d_out, ref_fwd(*args)[1]), case)
    return rel_error(got, expected)


def _online(bug: bugs.Bug, case: cases.Case):
    scores, v, block = case.values()
    got = R.online_softmax_attention(bug.impl, scores, v, block)
    return rel_error({"context": got}, {"context": R.direct_attention(scores, v)})


def _try(fn, *args):
    try:
        with np.errstate(all="ignore"):
            return fn(*args)
    except (ValueError, IndexError):
        return "crash"


def module_case(full_row: bool = True):
    """x (2, 4, 6), 2 heads, a causal mask (with one fully masked row), dropout 0.2 with a fixed keep-mask, params."""
    rng = np.random.default_rng(7)
    E = 6
    params = {n: rng.standard_normal((E, E)) * 0.5 for n in ("W_q", "W_k", "W_v", "W_o")}
    params.update({n: rng.standard_normal(E) * 0.1 for n in ("b_q", "b_k", "b_v", "b_o")})
    mask = np.broadcast_to(np.tril(np.ones((4, 4), dtype=bool)), (2, 1, 4, 4)).copy()
    mask[1, 0, 0, :] = not full_row  # batch 1, query 0 may attend to nothing (torch's softmax gives NaN there)
    keep = rng.random((2, 2, 4, 4)) >= 0.2
    return dict(x=rng.standard_normal((2, 4, E)), params=params, num_heads=2, mask=mask, dropout_p=0.2, keep_mask=keep)


def _module(key: str, check: str, case: dict, torch_reference: Callable | None, rng):
    fwd, bwd = bugs.self_attention_pair(key)
    args = (case["x"], case["params"], case["num_heads"], case["mask"], case["dropout_p"], case["keep_mask"])
    out, cache = fwd(*args)
    d_out = np.ones(out.shape) if check == "module · ones" else rng.standard_normal(out.shape)
    got = {"out": out, **bwd(d_out, cache)}
    if check == "module · FD":
        arrays = {"x": case["x"], **case["params"]}
        expected = {n: numerical_gradient(lambda _a: fwd(*args)[0], a, d_out) for n, a in arrays.items()}
        return rel_error({n: got[n] for n in expected}, expected)
    if check == "module · torch":
        ref_out, ref_grads = torch_reference(*args, d_out)
    else:
        ref_fwd, ref_bwd = bugs.self_attention_pair()
        ref_out, ref_cache = ref_fwd(*args)
        ref_grads = ref_bwd(d_out, ref_cache)
    return rel_error(got, {"out": ref_out, **ref_grads})


def measure(bug: bugs.Bug, torch_reference: Callable | None = None) -> Measurement:
    """The seven checks of the module docstring for ``bug`` (torch_reference(x, params, H, mask, p, keep, d_out)
    -> (out, grads dict) for the last one; without it that check is None)."""
    m = Measurement(bug)
    pair = next((p for p in cases.PAIRS if p.name == bug.pair), None)
    if pair is not None and bug.pair not in ("scaled_dot_product_attention", "self_attention"):
        for check, ones, fd in [
            ("unit · ones", True, False),
            ("unit · random", False, False),
            ("unit · FD", False, True),
        ]:
            rng = np.random.default_rng(0)
            results = [_try(_unit, bug, c, pair, rng, ones, fd) for c in pair.cases(np.random.default_rng(0))]
            m.errors[check] = _worst(results)
            if "crash" in results:
                m.crashed.add(check)
    if bug.function == "online_softmax_update":  # its unit check: blockwise against a direct softmax
        results = [_try(_online, bug, c) for c in cases.online_softmax_cases(np.random.default_rng(2))]
        m.errors["unit · random"] = _worst(results)
    if bug.key in MODULE_KEYS and not bug.pair == "scaled_dot_product_attention":
        for check in CHECKS[3:]:
            if check == "module · torch" and torch_reference is None:
                continue
            case = module_case(full_row=check != "module · torch")
            m.errors[check] = _try(_module, bug.key, check, case, torch_reference, np.random.default_rng(1))
    return m


def gallery_bugs(every: bool = False) -> list[bugs.Bug]:
    """One entry per bug: the step's function (not the attention-level copies), the query-path-only self-attention.

    ``every``: also the bugs of ``bugs.EXTRA`` (diagnosed by the checker; notebook 10's table does not list them yet).
    """
    seen, out = set(), []
    extra = {id(b) for b in bugs.EXTRA}
    for b in bugs.BUGS:
        if (id(b) in extra and not every) or b.pair == "scaled_dot_product_attention" or (b.key, b.pair) in seen:
            continue
        if b.key == "self_attention_paths" and b.wrote != "dx = d_query":
            continue
        seen.add((b.key, b.pair))
        out.append(b)
    return out


def format_table(measurements: list[Measurement]) -> str:
    """One row per bug, one column per check: the error, and ✗ where the check misses the bug."""
    head = f"{'bug':<22} {'function':<27}" + "".join(f"{c:>16}" for c in CHECKS)
    lines = [head, "-" * len(head)]
    for m in measurements:
        cells = []
        for c in CHECKS:
            e = m.errors.get(c)
            text = "—" if e is None else e if isinstance(e, str) else f"{e:.1e}"
            text += "†" if c in m.crashed else ""
            cells.append(f"{text + ('' if m.caught(c) in (None, True) else ' ✗'):>16}")
        lines.append(f"{m.bug.key:<22} {m.bug.function:<27}" + "".join(cells))
    lines.append(f"error = max |buggy - reference| / largest entry; caught above {CAUGHT:g}; ✗ = the check misses;")
    lines.append("shape / NaN = a wrong shape / NaN where the reference has none; † = crashed on some cases (Lq ≠ Lk)")
    return "\n".join(lines)
