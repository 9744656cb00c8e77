"""mha_numpy.testing on ``jax.nn.dot_product_attention`` through ``from_jax`` (forward, and the backward by
``jax.vjp``): its documented differences (docs/verify.md) are found on a few shrunk cases, one of each kind, and
nothing else. JAX compiles every new shape, so a handful of cases only; the whole quick matrix is in the docs."""

from __future__ import annotations

import pytest

from mha_numpy import testing as T
from mha_numpy.testing.cases import shrink

SMALL = {c.id: c for c in (shrink(c) for c in T.matrix("quick"))}

EXPECTED = {  # case -> what the tool must say
    "no mask [float32 B2 H3 8x13 d111]": "PASS",
    "padding, MQA 4/1 [float32 B3 H4/1 8x13 d64]": "PASS",  # its GQA is grouped, as ours
    "no mask [float16 B2 H3 8x13 d64]": "PASS",  # eagerly: XLA's CPU jit refuses this float16 dot
    "blocked rows [float32 B3 H2 8x13 d64]": "uniform rows",  # a bool mask becomes a finite large negative number
    "blocked rows (-inf) [float32 B3 H2 8x13 d64]": "NaN rows",  # an added -inf: the softmax of a row of -inf
    "is_causal [float32 B2 H3 8x33 d64]": "causal top-left",
    "no mask [float64 B2 H3 8x13 d59]": "float32 inside",  # the logits are cast to float32 for the softmax
}


@pytest.fixture(scope="module")
def report():
    jax = pytest.importorskip("jax", reason="jax is not installed: pip install -r requirements-dev.txt")
    impl = T.from_jax(jax.nn.dot_product_attention)
    return T.verify_attention(impl, cases=[SMALL[i] for i in EXPECTED])


def test_jax_dot_product_attention_differs_as_documented_and_nothing_else(report):
    said = {r.case.id: r.detected if r.failed else r.status for r in report.results}
    assert said == EXPECTED, str(report)


def test_the_jax_backward_is_judged_in_every_tensor(report):
    passed = [r for r in report.results if r.status == "PASS"]
    assert passed and all(set(r.checks) == {"out", "dq", "dk", "dv"} for r in passed)  # no weights returned
