"""Exercise 15's grading (checker.capstone_gpt): the GPT built from exercise 10's block, its reference gradients
against central differences, the worked solution through every fast stage, planted bugs stopped where they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import rel_err

from mha_numpy.checker import capstone_gpt as G
from mha_numpy.gradcheck import numerical_gradient

SOLUTION = Path(__file__).resolve().parents[1] / "exercises" / "solutions" / "ex10_capstone_block.py"
GAMMA2 = 'g["gamma2"] = (g["n2"] * c["xhat2"]).sum(axis=(0, 1))'
W1 = 'g["W_" + name] = d_out.reshape(N, -1).T @ inp.reshape(N, -1)'


def _student(replace: tuple[str, str] | None = None):
    source = SOLUTION.read_text()
    if replace is not None:
        assert replace[0] in source
        source = source.replace(*replace)
    namespace: dict = {}
    exec(compile(source, "student.py", "exec"), namespace)  # noqa: S102 - the worked solution, or a bug planted in it
    return namespace["capstone_block_backward"]


def test_the_gpt_reference_gradients_against_central_differences():
    s = G.GPTSizes(vocab_size=7, context=4, hidden=6, layers=2, heads=2, inner=10)
    P = {k: v + 0.3 * np.random.default_rng(5).standard_normal(v.shape) for k, v in G.gpt_params(s).items()}
    ids = np.random.default_rng(3).integers(0, 7, (2, 5))
    loss, grads = G.loss_and_grads(P, ids, s, None)
    assert loss == G._loss(P, ids, s)
    for name in ("W_head", "gamma_f", "layers.1.W_1", "layers.0.W_q", "layers.0.gamma1", "pos_emb", "tok_emb"):
        numeric = numerical_gradient(lambda _: np.array(G._loss(P, ids, s)), P[name], np.array(1.0))
        assert rel_err(grads[name], numeric) < 1e-7, name


def test_the_worked_solution_passes_every_fast_stage():
    stages = G.grade(_student())
    assert [(st.name, st.ok) for st in stages] == [("block", True), ("causal block", True), ("step", True)]


def test_a_planted_block_bug_is_stopped_at_the_block_stage_and_named():
    stages = G.grade(_student((GAMMA2, 'g["gamma2"] = g["n2"] * c["xhat2"]')))
    assert len(stages) == 1 and not stages[0].ok
    assert "first wrong: F16 gamma2" in stages[0].report and "not summed over the tokens" in stages[0].report


def test_the_step_stage_names_the_first_parameter_the_backward_gets_wrong():
    stage = G.stage_step(_student((W1, "g['W_' + name] = 2 * d_out.reshape(N, -1).T @ inp.reshape(N, -1)")))
    assert not stage.ok and stage.report.startswith("the gradient of layers.1.W_2 ")  # nearest the loss
