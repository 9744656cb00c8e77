"""gradcheck's helpers on the inputs a user gets wrong: integer arrays, eps <= 0, read-only and empty arrays."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy import MultiHeadAttention
from mha_numpy.gradcheck import check_functional, check_mha, numerical_gradient


def square(x):
    return x * x


def test_numerical_gradient_of_a_square_is_twice_x():
    x = np.array([[1.0, -2.0], [0.5, 3.0]])
    d = np.array([[1.0, 2.0], [-1.0, 0.5]])
    np.testing.assert_allclose(numerical_gradient(square, x, d), 2 * x * d, rtol=1e-8)


def test_an_integer_array_is_refused():
    """Issue 11, defect 9: x + eps on an int array rounds back to x, so the 'gradient' came out 0."""
    with pytest.raises(ValueError, match="x must be a floating ndarray.*int64"):
        numerical_gradient(square, np.array([1, 2, 3]), np.ones(3))
    with pytest.raises(ValueError, match="x must be a floating ndarray"):
        numerical_gradient(square, [1.0, 2.0], np.ones(2))  # a list cannot be perturbed in place either


@pytest.mark.parametrize("eps", [0, 0.0, -1e-6, np.nan, np.inf, "1e-6", None])
def test_eps_must_be_positive_and_finite(eps):
    """Issue 11, defect 9: eps = 0 gave 0/0 = NaN."""
    with pytest.raises(ValueError, match="eps must be a positive finite number"):
        numerical_gradient(square, np.ones(3), np.ones(3), eps=eps)


def test_a_read_only_array_is_never_mutated():
    """Issue 11, defect 9: a read-only array raised NumPy's 'assignment destination is read-only'."""
    x = np.array([1.0, -2.0, 3.0])
    x.flags.writeable = False
    before = x.copy()
    grad = numerical_gradient(square, x, np.array([1.0, 1.0, -1.0]))
    np.testing.assert_allclose(grad, [2.0, -4.0, -6.0], rtol=1e-8)
    np.testing.assert_array_equal(x, before)
    assert not x.flags.writeable


def test_a_writeable_array_is_perturbed_in_place_and_restored_exactly():
    """The documented in-place behaviour that lets f read a parameter held elsewhere (a model's weights)."""
    held = {"w": np.array([0.1, 0.2, 0.3])}
    before = held["w"].copy()
    grad = numerical_gradient(lambda _w: held["w"] ** 3, held["w"], np.ones(3))
    np.testing.assert_allclose(grad, 3 * before**2, rtol=1e-8)
    np.testing.assert_array_equal(held["w"], before)  # bit for bit


def test_an_empty_array_has_an_empty_gradient():
    """Issue 11, defect 5: the gradient of an array with no element is defined: empty, float64, same shape."""
    x = np.zeros((0, 3), dtype=np.float32)
    grad = numerical_gradient(square, x, np.zeros((0, 3)))
    assert grad.shape == (0, 3) and grad.dtype == np.float64


@pytest.mark.parametrize("name", ["B", "H", "Lq", "Lk", "d"])
@pytest.mark.parametrize("value", [0, -1, 2.0])
def test_check_functional_needs_positive_sizes(name, value):
    with pytest.raises(ValueError, match=f"^{name} must be a positive int"):
        check_functional(**{name: value})


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_check_mha_refuses_empty_inputs(which):
    """A check with nothing to compare cannot fail, so it is refused, naming the empty input."""
    mha = MultiHeadAttention(4, 2, rng=0)
    x = {n: np.ones((1, 2, 4)) for n in ("query", "key", "value")}
    x[which] = np.ones((1, 0, 4)) if which != "query" else np.ones((0, 2, 4))
    with pytest.raises(ValueError, match=f"^{which} with shape"):
        check_mha(mha, x["query"], x["key"], x["value"])


@pytest.mark.parametrize("rng", ["abc", -1, 1.5, True])
def test_a_bad_rng_is_a_value_error_naming_it(rng):
    with pytest.raises(ValueError, match="^rng must be"):
        check_functional(rng=rng)


def test_check_functional_checks_every_pair_of_the_registry_and_a_new_entry_adds_its_rows(monkeypatch):
    """One registry (mha_numpy/pairs.py): the rows are its pairs' samples, ``label:input``; adding a pair is one
    entry (a toy pair here), which check_functional then checks, and a wrong backward in it fails."""
    from mha_numpy import pairs

    rows = [r.name for r in check_functional().rows]
    expected = [
        f"{case.label}:{name}"
        for p in pairs.PAIRS
        if p.sample
        for case in p.sample(pairs.Sizes(), np.random.default_rng(0))
        for name in p.grads
        if case.gives(name)
    ]
    assert rows == expected and len(set(rows)) == len(rows)

    def sample(sizes, rng):
        return [pairs.Case("cube", [("x", rng.standard_normal((sizes.B, 3)))])]

    cube = pairs.Pair("cube", lambda x: (x**3, x), lambda d, x: 3 * x**2 * d, ("x",), sample=sample)
    wrong = pairs.Pair("cube", cube.forward, lambda d, x: 2 * x**2 * d, ("x",), sample=sample)
    monkeypatch.setattr(pairs, "PAIRS", [*pairs.PAIRS, cube])
    assert check_functional()["cube:x"].passed
    monkeypatch.setattr(pairs, "PAIRS", [wrong])
    assert not check_functional().passed
