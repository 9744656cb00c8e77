"""For your own CI: the case matrix as pytest parameters, and one case as an assertion.

    import pytest
    from mha_numpy.testing import assert_attention_close, attention_cases, from_torch

    @pytest.mark.parametrize("case", attention_cases("quick"))
    def test_my_kernel(case):
        assert_attention_close(from_torch(my_attention), case)

A case the function does not take (n/a) is skipped with its reason; a failing one raises AssertionError with
its error, budget and detected convention.
"""

from __future__ import annotations

from .adapters import Implementation, from_numpy
from .cases import Case, matrix
from .report import CaseResult, describe
from .verify import run_case


def attention_cases(cases: str = "quick") -> list:
    """The matrix as ``pytest.param(case, id=case.id)`` for ``pytest.mark.parametrize("case", ...)``."""
    import pytest

    return [pytest.param(case, id=case.id) for case in matrix(cases)]


def assert_attention_close(fn, case: Case, vjp=None, **numpy_options) -> CaseResult:
    """Run one case (``fn`` an Implementation, or a NumPy function with ``vjp`` and ``from_numpy``'s options);
    AssertionError when it fails, pytest.skip when the function does not take the case; -> the CaseResult."""
    impl = fn if isinstance(fn, Implementation) else from_numpy(fn, vjp, **numpy_options)
    result = run_case(impl, case)
    if result.status == "n/a":
        import pytest

        pytest.skip(f"{impl.name} {result.message}")
    if result.failed:
        w = result.worst
        where = f"{w.name} error {w.error:.2e} > budget {w.budget:.2e} ({w.ratio:.3g}x)" if w else ""
        found = f"detected: {result.detected}: {describe(result.detected)}" if result.detected else result.message
        raise AssertionError(f"{impl.name} on {case.id}: {result.status} {where}; {found}")
    return result
