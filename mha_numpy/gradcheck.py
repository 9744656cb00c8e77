"""Finite-difference gradient checks for the functional pairs and for ``MultiHeadAttention``.

The analytic gradient of L = sum(f(x) * d_out) with respect to x is compared with central
differences, (L(x + eps) - L(x - eps)) / (2 eps), element by element. ``d_out`` is *random*:
with an all-ones upstream gradient, bugs such as a swapped transpose cancel out and go unseen.
Run the checks in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import pairs as P
from ._checks import as_generator
from .attention import MultiHeadAttention


def numerical_gradient(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, d_out: np.ndarray, eps: float = 1e-6):
    """Central-difference gradient of sum(f(x) * d_out) with respect to x (float64, same shape as x).

    ``x`` must be a floating ndarray (an integer array cannot be perturbed by eps; ValueError) and ``eps`` a
    positive finite number (ValueError). A writeable ``x`` is perturbed in place one element at a time and
    restored exactly afterwards, so ``f`` may read it from elsewhere (a parameter held by a model); a read-only
    ``x`` is never touched: a copy is perturbed and passed to ``f``. An empty ``x`` has an empty gradient.
    """
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(
            f"x must be a floating ndarray, got {type(x).__name__} of dtype {np.asarray(x).dtype} with shape "
            f"{np.shape(x)}: an integer array cannot carry the perturbation eps (convert it with x.astype(float))"
        )
    if not (isinstance(eps, (int, float, np.floating, np.integer)) and np.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")
    if not x.flags.writeable:
        x = x.copy()  # perturb a copy; the caller's read-only array stays as it is
    grad = np.zeros(x.shape, dtype=np.float64)
    for i in np.ndindex(x.shape):  # no iteration at all for an empty x
        old = x[i].copy()
        x[i] = old + eps
        plus = np.sum(f(x) * d_out, dtype=np.float64)
        x[i] = old - eps
        minus = np.sum(f(x) * d_out, dtype=np.float64)
        x[i] = old  # restore
        grad[i] = (plus - minus) / (2 * eps)
    return grad


def _check_not_empty(**arrays) -> None:
    """A gradient check of an array with no element compares nothing and cannot fail: refuse it."""
    for name, a in arrays.items():
        if np.size(a) == 0:
            raise ValueError(
                f"{name} with shape {np.shape(a)} is empty: a gradient check needs at least one element "
                "(numerical_gradient itself gives an empty gradient for an empty array)"
            )


@dataclass
class GradcheckRow:
    """One named gradient compared with its finite-difference estimate."""

    name: str
    shape: tuple
    max_abs_err: float
    max_rel_err: float  # max |a - n| / max(|a|, |n|): the error relative to the gradient's scale
    worst_index: tuple
    numerical: float  # the numerical value at worst_index
    analytic: float  # the analytic value at worst_index
    passed: bool
    zero_gradient: bool = False  # both gradients are 0 to within atol: no scale, max_rel_err is set to 0


@dataclass
class GradcheckReport:
    """A table of GradcheckRow; ``passed`` is True when every row passes."""

    rows: list[GradcheckRow] = field(default_factory=list)
    atol: float = 1e-8
    rtol: float = 1e-6

    @property
    def passed(self) -> bool:
        """True when every row passes."""
        return all(r.passed for r in self.rows)

    def __getitem__(self, name: str) -> GradcheckRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def add(self, name: str, analytic: np.ndarray, numerical: np.ndarray) -> GradcheckRow:
        """Compare an analytic gradient with its numerical one (same shape) and append the row -> the GradcheckRow."""
        a, n = np.asarray(analytic, dtype=np.float64), np.asarray(numerical, dtype=np.float64)
        if a.shape != n.shape:
            raise ValueError(f"{name}: analytic shape {a.shape} != numerical shape {n.shape}")
        err = np.abs(a - n)
        allowed = self.atol + self.rtol * np.abs(n)
        worst = np.unravel_index(np.argmax(err / allowed), a.shape) if a.size else ()
        max_err = float(err.max()) if a.size else 0.0
        scale = float(max(np.abs(a).max(), np.abs(n).max())) if a.size else 0.0
        zero = scale <= self.atol  # e.g. b_k: softmax ignores a shift shared by all keys
        row = GradcheckRow(
            name=name,
            shape=a.shape,
            max_abs_err=max_err,
            max_rel_err=0.0 if zero else max_err / scale,
            worst_index=tuple(int(i) for i in worst),
            numerical=float(n[worst]) if a.size else 0.0,
            analytic=float(a[worst]) if a.size else 0.0,
            passed=bool(np.all(err <= allowed)),
            zero_gradient=zero,
        )
        self.rows.append(row)
        return row

    def __str__(self) -> str:
        w = max([10, *(len(r.name) for r in self.rows)])
        head = (
            f"{'name':<{w}} {'shape':<16} {'max abs err':>11} {'max rel err':>11} "
            f"{'worst index':<16} {'numerical':>13} {'analytic':>13}  ok"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows:
            rel = " zero grad" if r.zero_gradient else f"{r.max_rel_err:11.2e}"
            lines.append(
                f"{r.name:<{w}} {str(r.shape):<16} {r.max_abs_err:11.2e} {rel:>11} "
                f"{str(r.worst_index):<16} {r.numerical:13.6e} {r.analytic:13.6e}  {'PASS' if r.passed else 'FAIL'}"
            )
        lines.append(f"pass rule: |analytic - numerical| <= {self.atol:g} + {self.rtol:g} * |numerical|, element-wise")
        lines.append("max rel err = max |analytic - numerical| / max(|analytic|, |numerical|) over the tensor")
        if any(r.zero_gradient for r in self.rows):
            lines.append(
                "zero grad: the true gradient is 0 (both estimates within atol), so only the abs error is meaningful"
            )
        return "\n".join(lines)


def check_function(
    forward: Callable[..., np.ndarray],
    analytic: dict[str, np.ndarray],
    inputs: dict[str, np.ndarray],
    d_out: np.ndarray,
    eps: float = 1e-6,
    atol: float = 1e-8,
    rtol: float = 1e-6,
    report: GradcheckReport | None = None,
) -> GradcheckReport:
    """Check ``analytic[name]`` against central differences of sum(forward(**inputs) * d_out).

    ``forward`` takes the inputs as keyword arguments and returns the output array. Only the
    names in ``analytic`` are checked; the arrays in ``inputs`` are restored after the check.
    """
    report = report or GradcheckReport(atol=atol, rtol=rtol)
    for name, grad in analytic.items():
        x = inputs[name]

        def f(x_, name=name):
            return forward(**{**inputs, name: x_})

        report.add(name, grad, numerical_gradient(f, x, d_out, eps))
    return report


def check_mha(
    mha: MultiHeadAttention,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    training: bool = False,
    d_output: np.ndarray | None = None,
    rng: int | np.random.Generator | None = 0,
    eps: float = 1e-6,
    atol: float = 1e-8,
    rtol: float = 1e-6,
) -> GradcheckReport:
    """Finite-difference check of every input and parameter gradient of ``mha``.

    ``mha``: a ``MultiHeadAttention`` (query, key, value) or a ``MultiHeadLatentAttention`` (query and key only:
    its values come from the key's latent; ``value`` must then be None).
    ``d_output`` defaults to a random upstream gradient. With ``training=True`` and dropout,
    the dropout mask sampled by the first forward is held fixed for every perturbed forward.
    The arrays passed in and ``mha.params`` are left as they were. Empty inputs raise ValueError (nothing to check).
    """
    takes_value = not getattr(getattr(mha, "config", None), "latent", False)  # latent attention: no value
    if takes_value == (value is None):
        raise ValueError(
            f"value is {'None' if value is None else f'an array of shape {np.shape(value)}'}: "
            f"{type(mha).__name__} takes {'query, key and value' if takes_value else 'query and key only'}"
        )
    arrays = {"query": query, "key": key, **({"value": value} if takes_value else {})}
    _check_not_empty(**arrays)
    gen = as_generator(rng)
    inputs = {name: np.array(x, copy=True) for name, x in arrays.items()}
    out, cache = mha.forward(**inputs, mask=mask, training=training)
    keep = cache.dropout_mask if training else None
    if d_output is None:
        d_output = gen.standard_normal(out.shape).astype(out.dtype)
    grads = mha.backward(d_output, cache)

    def run(**xs):
        return mha.forward(**xs, mask=mask, training=training, dropout_mask=keep)[0]

    report = GradcheckReport(atol=atol, rtol=rtol)
    check_function(run, {n: grads[n] for n in inputs}, inputs, d_output, eps, report=report)
    for name, param in mha.params.items():
        report.add(name, grads[name], numerical_gradient(lambda _p: run(**inputs), param, d_output, eps))
    return report


def check_functional(
    B: int = 2,
    H: int = 2,
    Lq: int = 3,
    Lk: int = 4,
    d: int = 3,
    mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    rng: int | np.random.Generator | None = 0,
    eps: float = 1e-6,
    atol: float = 1e-8,
    rtol: float = 1e-6,
) -> GradcheckReport:
    """Check every pair of ``pairs.PAIRS`` that has a sample, on random float64 data; rows are named ``pair:input``.

    B, H, Lq, Lk and d must be positive ints (ValueError naming the argument): a zero size checks nothing.
    ``mask`` and ``dropout_p`` (with a fixed keep-mask) apply to the attention pair (``sdpa``).
    """
    for name, n in dict(B=B, H=H, Lq=Lq, Lk=Lk, d=d).items():
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    gen = as_generator(rng)
    report = GradcheckReport(atol=atol, rtol=rtol)
    sizes = P.Sizes(B, H, Lq, Lk, d, mask, dropout_p)
    for pair in P.PAIRS:
        for case in pair.sample(sizes, gen) if pair.sample else ():
            check_pair(pair, case, gen, eps, report)
    return report


def check_pair(pair: P.Pair, case: P.Case, rng: np.random.Generator, eps: float, report: GradcheckReport) -> None:
    """Add the rows ``case.label:input`` for each gradient the pair's backward owes on ``case`` (random d_out)."""
    out, cache = pair.forward(*case.values())
    if isinstance(out, tuple):  # several outputs (merge_attention: context, lse): backward(d_out, cache, *d_rest)
        d_outs = [rng.standard_normal(np.shape(o)) for o in out]
        result = pair.backward(d_outs[0], cache, *d_outs[1:])
        d_out = np.concatenate([d.ravel() for d in d_outs])  # the loss is Σ over every output of out ∘ d_out

        def run(_x):
            return np.concatenate([np.ravel(o) for o in pair.forward(*case.values())[0]])
    else:
        d_out = rng.standard_normal(np.shape(out))
        result = pair.backward(d_out, cache)

        def run(_x):
            return pair.forward(*case.values())[0]

    for name, grad in P.gradients(pair, result, case).items():
        report.add(f"{case.label}:{name}", grad, numerical_gradient(run, case.array(name), d_out, eps))
