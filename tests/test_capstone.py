"""The capstones (exercises 9 and 10): their forwards are the tiny model's and the pre-norm Block's, their reference
gradients are those modules' backwards, the checker passes the worked solutions, names the FIRST wrong gradient of a
buggy one and the catalogued bug, and training with the student's backward is the library's training run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mha_numpy import train as T
from mha_numpy.attention import MultiHeadAttention
from mha_numpy.checker import capstone as C
from mha_numpy.checker import capstone_block as K
from mha_numpy.checker import check_namespace
from mha_numpy.models.block import Block
from mha_numpy.models.tiny import TinyAttentionModel

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "exercises" / "solutions" / "ex09_capstone_model.py"
BLOCK_SOLUTION = ROOT / "exercises" / "solutions" / "ex10_capstone_block.py"


def _namespace(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "student.py", "exec"), namespace)  # noqa: S102 - a worked solution, or a bug of it
    return namespace


def test_the_capstone_forward_and_its_reference_gradients_are_the_tiny_models():
    cache, caches = C.model_case()
    V, L, E, H = 7, 4, 6, 2  # model_case's defaults
    model = TinyAttentionModel(V, L, E, H, rng=np.random.default_rng(0))
    loss, logits, grads, model_cache = model.loss_and_grads(cache["tokens"], cache["targets"])
    assert abs(loss - cache["loss"]) <= 1e-14 * abs(loss)
    np.testing.assert_allclose(cache["logits"], logits, rtol=0, atol=1e-13)
    np.testing.assert_allclose(cache["weights"], model_cache.attn_weights, rtol=0, atol=1e-14)
    expected = C.reference_grads(caches)
    assert set(expected) == set(C.MODEL_GRADS) and set(C.PARAMS) <= set(expected)
    for name, g in grads.items():
        np.testing.assert_allclose(expected[name], g, rtol=0, atol=1e-13 * np.abs(g).max(), err_msg=name)


def test_the_block_capstone_forward_and_its_reference_gradients_are_the_pre_norm_blocks():
    cache, caches = K.block_case(seed=1, B=1, L=4, E=6, H=3, inner=12)
    params = {name: cache[name].copy() for name in K.PARAMS}
    block = Block(MultiHeadAttention(6, 3, rng=0), params, K.BLOCK_NAMES, norm_position="pre", norm="layer_norm",
                  eps=K.EPS, ffn="gelu", approximate="tanh")  # fmt: skip
    y, block_cache = block.forward(cache["x"])
    np.testing.assert_allclose(cache["y"], y, rtol=0, atol=1e-14 * np.abs(y).max())
    d_x, grads = block.backward(cache["d_y"], block_cache)
    expected = K.block_reference(caches)
    assert set(expected) == set(K.BLOCK_GRADS) and set(grads) == set(K.PARAMS)
    for name, g in {"x": d_x, **grads}.items():
        np.testing.assert_allclose(expected[name], g, rtol=0, atol=1e-13 * np.abs(g).max(), err_msg=name)


def test_the_reference_gradient_of_a_weight_matches_finite_differences():
    cache, caches = C.model_case(seed=1, B=3, L=3, E=4, H=1, V=5)
    params = {name: cache[name].copy() for name in C.PARAMS}
    dW = C.reference_grads(caches)["W_k"]
    numerical, eps = np.zeros_like(dW), 1e-6
    for i in np.ndindex(dW.shape):
        for sign in (1, -1):
            p = {**params, "W_k": params["W_k"].copy()}
            p["W_k"][i] += sign * eps
            numerical[i] += sign * C.model_forward(p, cache["tokens"], cache["targets"], 1)[0]["loss"] / (2 * eps)
    assert np.abs(numerical - dW).max() <= 1e-7 * np.abs(dW).max()


@pytest.mark.parametrize(("capstone", "path"), [(C.MODEL, SOLUTION), (K.BLOCK, BLOCK_SOLUTION)], ids=["model", "block"])
def test_the_worked_solution_passes_and_matches_every_intermediate(capstone, path):
    solution = _namespace(path.read_text())
    report = check_namespace(solution)
    assert [(r.function, r.status) for r in report.rows] == [(capstone.function, "PASS")]
    comparison = C.compare(solution[capstone.function], capstone)
    assert comparison.wrong is None and len(comparison.lines) == len(capstone.order)
    assert "every gradient matches" in str(comparison)


def test_a_blank_backward_is_not_done_yet_and_not_an_unknown_name():
    def capstone_model_backward(cache):
        raise NotImplementedError

    report = check_namespace({"capstone_model_backward": capstone_model_backward})
    assert [(r.function, r.status) for r in report.rows] == [("capstone_model_backward", "not done yet")]
    assert not report.ignored
    assert "not done yet" in str(C.compare(capstone_model_backward))


# (the catalogued bug, the line of the worked solution, what a student wrote instead)
BUGGY = [
    ("ce_no_mean", 'g["logits"] = d_logits / N', 'g["logits"] = d_logits'),
    ("ce_sign", 'g["logits"] = d_logits / N', 'g["logits"] = -d_logits / N'),
    ("ce_no_onehot", "np.add.at(d_logits, (np.arange(B)[:, None], np.arange(L)[None, :], c[\"targets\"]), -1.0)",
     "pass"),
    ("bias_not_summed_out", 'g["b_out"] = g["logits"].sum(axis=(0, 1))', 'g["b_out"] = g["logits"]'),
    ("dw_out_transposed", 'g["W_out"] = g["logits"].reshape(N, -1).T @ c["h"].reshape(N, E)',
     'g["W_out"] = c["h"].reshape(N, E).T @ g["logits"].reshape(N, -1)'),
    ("merge_no_transpose", 'g["ctx"] = g["merged"].reshape(B, L, H, E // H).transpose(0, 2, 1, 3)',
     'g["ctx"] = g["merged"].reshape(B, H, L, E // H)'),
    ("dv_untransposed", 'g["vh"] = c["weights"].swapaxes(-1, -2) @ g["ctx"]', 'g["vh"] = c["weights"] @ g["ctx"]'),
    ("softmax_diagonal", 'g["scores"] = p * (g["weights"] - (p * g["weights"]).sum(axis=-1, keepdims=True))',
     'g["scores"] = p * (1 - p) * g["weights"]'),
    ("softmax_wrong_axis", '(p * g["weights"]).sum(axis=-1, keepdims=True)', '(p * g["weights"]).sum(axis=-2, '
     "keepdims=True)"),
    ("scale_forgotten", 'g["qh"] = g["scores"] @ c["kh"] * scale', 'g["qh"] = g["scores"] @ c["kh"]'),
    ("scale_divided", 'g["qh"] = g["scores"] @ c["kh"] * scale', 'g["qh"] = g["scores"] @ c["kh"] / scale'),
    ("dk_untransposed", 'g["kh"] = g["scores"].swapaxes(-1, -2) @ c["qh"] * scale',
     'g["kh"] = g["scores"] @ c["qh"] * scale'),
    ("split_no_transpose", 'g["q"] = g["qh"].transpose(0, 2, 1, 3).reshape(B, L, E)',
     'g["q"] = g["qh"].reshape(B, L, E)'),
    ("x_skip_missing", 'd_x = g["h"].copy()', 'd_x = np.zeros_like(g["h"])'),
    ("x_only_query", 'd_x += d @ c[f"W_{name}"]', 'd_x += d @ c[f"W_{name}"] if name == "q" else 0'),
    ("x_only_skip", 'd_x += d @ c[f"W_{name}"]', "d_x = d_x"),
    ("pos_not_summed", 'np.add.at(g["pos_emb"], c["positions"], g["pos"])', 'g["pos_emb"] = g["pos"][0]'),
    ("embedding_assign", 'np.add.at(g["tok_emb"], c["tokens"], g["tok"])', 'g["tok_emb"][c["tokens"]] += g["tok"]'),
]  # fmt: skip
NORM = "return rstd * (d_xhat - mean_d - xhat * mean_dx)"
X_LINE = 'g["x"] = g["h"] + norm(g["xhat1"], c["x"])'
RSTD_X = 'np.sqrt(c["x"].var(axis=-1, keepdims=True) + eps)'
MEAN_X = 'g["xhat1"].mean(axis=-1, keepdims=True)'
SPLIT = 'g[name] = g[name + "h"].transpose(0, 2, 1, 3).reshape(B, L, E)'
BLOCK_BUGGY = [
    ("ln_no_mean_terms_h", NORM, "return rstd * d_xhat"),
    ("ln_no_xhat_term_h", NORM, "return rstd * (d_xhat - mean_d)"),
    ("ln_no_mean_term_h", NORM, "return rstd * (d_xhat - xhat * mean_dx)"),
    ("skip_missing_h", 'g["h"] = g["y"] + norm(g["xhat2"], c["h"])', 'g["h"] = norm(g["xhat2"], c["h"])'),
    ("ln_no_mean_terms_x", X_LINE, f'g["x"] = g["h"] + g["xhat1"] / {RSTD_X}'),
    ("ln_no_xhat_term_x", X_LINE, f'g["x"] = g["h"] + (g["xhat1"] - {MEAN_X}) / {RSTD_X}'),
    ("ln_no_mean_term_x", X_LINE, f"{X_LINE} + {MEAN_X} / {RSTD_X}"),
    ("skip_missing_x", X_LINE, 'g["x"] = norm(g["xhat1"], c["x"])'),
    ("gamma_not_summed", 'g["gamma2"] = (g["n2"] * c["xhat2"]).sum(axis=(0, 1))', 'g["gamma2"] = g["n2"] * c["xhat2"]'),
    ("gelu_no_product_rule", 'g["u"] = g["gl"] * (0.5 * (1 + t) + u * d_cdf)', 'g["u"] = g["gl"] * 0.5 * (1 + t)'),
    ("dw1_transposed", 'g["n2"] = linear(g["u"], c["n2"], c["W_1"], "1")',
     'g["n2"] = linear(g["u"], c["n2"], c["W_1"], "1")\n    g["W_1"] = g["W_1"].T'),
    ("split_no_transpose", SPLIT, SPLIT.replace("= g[", '= g[name + "h"].reshape(B, L, E) if name == "q" else g[', 1)),
    *[b for b in BUGGY if b[0] in ("merge_no_transpose", "dv_untransposed", "softmax_diagonal", "softmax_wrong_axis",
                                   "scale_forgotten", "scale_divided", "dk_untransposed")],
]  # fmt: skip
ALL_BUGGY = [(C.MODEL, SOLUTION, *b) for b in BUGGY] + [(K.BLOCK, BLOCK_SOLUTION, *b) for b in BLOCK_BUGGY]


@pytest.mark.parametrize(("capstone", "path", "key", "line", "buggy"), ALL_BUGGY,
                         ids=[f"{c.name}-{key}" for c, _, key, _, _ in ALL_BUGGY])  # fmt: skip
def test_a_buggy_backward_fails_at_its_first_wrong_gradient_with_the_diagnosis(capstone, path, key, line, buggy):
    source = path.read_text()
    assert line in source, f"the worked solution no longer has {line!r}"
    student = _namespace(source.replace(line, buggy, 1))
    bug = next(b for b in capstone.bugs if b.key == key)
    row = check_namespace(student, only=[capstone.name])[capstone.function]
    assert row.status == "FAIL" and f" d_{bug.name} (" in row.detail, row.detail
    assert row.bug is not None and row.bug.key == key, (row.detail, row.bug)
    comparison = C.compare(student[capstone.function], capstone)
    assert comparison.wrong.name == bug.name and f"first wrong: {comparison.wrong.label} {bug.name}" in str(comparison)
    grads = [name for _, name in capstone.order]
    before = grads[: grads.index(bug.name)]
    assert all(line.approximate for line in comparison.lines if line.name in before)


@pytest.mark.parametrize(("key", "inherits"), [("bias_not_summed_out", False), ("scale_forgotten", True)])
def test_the_first_wrong_row_says_whether_later_rows_inherit_it(key, inherits):
    """A parameter's gradient is a leaf: no later row reads it, so the table must not say the rows below inherit it."""
    line, buggy = next((line, buggy) for k, line, buggy in BUGGY if k == key)
    student = _namespace(SOLUTION.read_text().replace(line, buggy, 1))
    text = str(C.compare(student[C.MODEL.function]))
    assert ("inherit the error" in text) is inherits, text
    assert ("a parameter's gradient: no row below is computed from it" in text) is not inherits, text


@pytest.mark.parametrize(("capstone", "buggy"), [(C.MODEL, BUGGY), (K.BLOCK, BLOCK_BUGGY)], ids=["model", "block"])
def test_every_catalogued_bug_is_tested_and_names_a_gradient(capstone, buggy):
    assert {b.key for b in capstone.bugs} == {key for key, _, _ in buggy}
    assert {b.name for b in capstone.bugs} <= {name for _, name in capstone.order}


def test_a_backward_that_writes_into_its_cache_fails_and_a_missing_gradient_is_named():
    solution = _namespace(SOLUTION.read_text())["capstone_model_backward"]

    def capstone_model_backward(cache):
        g = solution(cache)
        cache["weights"] *= 0  # in place
        return g

    row = check_namespace({"capstone_model_backward": capstone_model_backward})["capstone_model_backward"]
    assert row.status == "FAIL" and "modified its cache in place (at cache['weights'])" in row.detail, row.detail

    def partial(cache):
        return {k: v for k, v in solution(cache).items() if k != "vh"}

    row = check_namespace({"capstone_model_backward": partial})["capstone_model_backward"]
    assert row.status == "FAIL" and "d_vh (missing" in row.detail, row.detail


def test_training_with_the_students_backward_is_the_librarys_training_run():
    solution = _namespace(SOLUTION.read_text())["capstone_model_backward"]
    accuracy, losses = C.train(solution, "reverse", steps=12, seed=3, eval_size=50)
    library = T.train("reverse", steps=12, seed=3, eval_size=50, log=None)
    assert accuracy == library.accuracy
    np.testing.assert_allclose(losses, library.history["loss"], rtol=1e-12)
    assert losses[-1] < losses[0]


def test_cli_checks_a_buggy_capstone_file_and_names_the_bug(tmp_path):
    source = SOLUTION.read_text().replace('g["qh"] = g["scores"] @ c["kh"] * scale', 'g["qh"] = g["scores"] @ c["kh"]')
    path = tmp_path / "my_capstone.py"
    path.write_text(source)
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "check", str(path)], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "capstone_model_backward  FAIL  first wrong: F10 d_qh" in r.stdout, r.stdout
    assert "diagnosis: the scale forgotten" in r.stdout, r.stdout
