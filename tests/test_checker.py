"""The checker: a correct file passes, each known bug is caught with its diagnosis, the CLI's exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.checker import NOT_DONE, CannotRun, bugs, check_file, check_namespace
from mha_numpy.checker import reference as R
from mha_numpy.checker.cases import PAIRS
from mha_numpy.checker.runner import CAPSTONES

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "exercises" / "solutions"
BUGGY = Path(__file__).parent / "data" / "students" / "buggy_softmax_scores.py"


def correct_namespace() -> dict:
    """Every function the checker knows, written correctly: the exercise solutions."""
    ns: dict = {}
    for path in sorted(SOLUTIONS.glob("*.py")):
        ns.update({k: v for k, v in vars(_load(path)).items() if callable(v)})
    return ns


def _load(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spec(name: str):
    return next(p for p in PAIRS if p.name == name)


def _pair(function: str) -> str:
    return "online_softmax" if function == "online_softmax_update" else function.rsplit("_", 1)[0]


def test_the_solutions_pass_every_function_the_checker_knows():
    report = check_namespace(correct_namespace())
    names = {r.function for r in report.rows}
    expected = {f"{p.name}_{s}" for p in PAIRS for s in ("forward", "backward")} | {"online_softmax_update"}
    expected |= {c.function for c in CAPSTONES}  # exercises 9 and 10
    assert names == expected, f"the solutions miss {expected - names}"
    assert report.passed, str(report)


@pytest.mark.parametrize("bug", bugs.BUGS, ids=lambda b: f"{b.function}:{b.key}:{b.wrote[:20]}")
def test_each_known_bug_is_caught_with_its_diagnosis(bug):
    ns = correct_namespace()
    ns[bug.function] = bug.impl
    if bug.function.endswith("_backward"):  # the forward whose cache the buggy backward reads
        ns[bug.function.replace("_backward", "_forward")] = bug.forward or _spec(bug.pair).forward
    if bug.key == "dropout_not_inverted":  # the solutions' dropout cache is (keep_mask, p), the reference's
        del ns["dropout_backward"]  # (keep_mask, 1/(1-p)): a backward fed the reference cache misreads it
    report = check_namespace(ns, only=[_pair(bug.function)])
    row = report[bug.function]
    assert row.status == "FAIL"
    assert row.bug == bug, f"diagnosed {row.bug and row.bug.title!r}, expected {bug.title!r}: {row.detail}"
    assert bug.wrote in str(report)
    others = [
        r.function
        for r in report.rows
        if r.function != bug.function and r.status != "PASS" and "fix " + bug.function not in r.detail
    ]
    assert not others, f"only {bug.function} should fail, also failed: {others}"


def test_a_correct_function_gets_no_diagnosis_when_another_one_fails():
    ns = correct_namespace()
    ns["softmax_backward"] = bugs.softmax_backward_diagonal
    report = check_namespace(ns, only=["softmax", "linear"])
    assert report["softmax_forward"].status == "PASS" and report["linear_backward"].status == "PASS"
    assert report["linear_backward"].bug is None and not report.passed


def test_not_implemented_is_not_done_yet_not_a_crash():
    def blank(*args):
        raise NotImplementedError

    report = check_namespace({"softmax_forward": blank, "softmax_backward": blank, "online_softmax_update": blank})
    assert [r.status for r in report.rows] == [NOT_DONE] * 3
    assert not report.passed


def test_the_composed_attention_without_bugs_is_the_reference():
    from mha_numpy import functional as F

    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 4))
    mask = rng.random((2, 1, 3, 5)) > 0.3
    fwd, bwd = bugs.sdpa_pair()
    out, cache = fwd(q, k, v, mask)
    ref, ref_cache = F.scaled_dot_product_attention_forward(q, k, v, mask)
    d = rng.standard_normal(out.shape)
    assert np.abs(out - ref).max() <= 1e-14 * np.abs(ref).max()
    for a, b in zip(bwd(d, cache), F.scaled_dot_product_attention_backward(d, ref_cache)):
        assert np.abs(a - b).max() <= 1e-14 * np.abs(b).max()


def test_online_softmax_reference_loop_matches_the_direct_softmax_with_the_solution():
    update = correct_namespace()["online_softmax_update"]
    rng = np.random.default_rng(3)
    s, v = rng.standard_normal((2, 3, 7)), rng.standard_normal((2, 7, 4))
    s[0, 0, :] = -np.inf
    got = R.online_softmax_attention(update, s, v, 3)
    assert np.abs(got - R.direct_attention(s, v)).max() <= 1e-14 and np.all(got[0, 0] == 0)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mha_numpy", "check", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_on_a_buggy_file_prints_the_diagnoses_and_exits_1():
    r = run_cli(str(BUGGY))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("softmax_forward") and "FAIL" in line for line in lines)
    assert "A fully masked row gives NaN" in r.stdout
    assert "The diagonal-only softmax backward" in r.stdout
    assert "dQ computed from Sᵀ" in r.stdout
    assert any(line.startswith("linear_backward") and NOT_DONE in line for line in lines)
    assert "Traceback" not in r.stdout + r.stderr


def test_cli_on_the_solutions_exits_0(tmp_path):
    """Every solution in one file but exercise 6's, which composes mha_numpy.functional's pairs: a checked file cannot
    import the library (issue 35; its functions are checked in a notebook's namespace, test_checker_grading)."""
    student = tmp_path / "student.py"
    student.write_text("".join(p.read_text() for p in sorted(SOLUTIONS.glob("*.py")) if not p.name.startswith("ex06")))
    r = run_cli(str(student))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout


@pytest.mark.parametrize(
    "name, content, message, code",
    [
        ("student.py", None, "no such file", 2),
        ("notes.txt", "my notes\n", "not a Python file or a notebook", 2),
        ("student.py", "def softmax_forward(x):\n    return x +\n", "line 2: syntax error", 3),
        ("student.py", "import nope_xyz\n", "failed on import: ModuleNotFoundError", 3),
        ("hand_in.ipynb", "{not json", "is not a notebook", 3),
        ("hand_in.ipynb", '{"cells": [1, {"cell_type": "code", "source": "x = 1"}]}', "not a list of cell objects", 3),
    ],
)
def test_cli_a_file_it_cannot_take_or_run_is_one_line_and_exit_2_or_3(tmp_path, name, content, message, code):
    """2: not a file the checker takes (a usage error); 3: a file it could not run. Never a traceback."""
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    r = run_cli(str(path))
    assert r.returncode == code, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


@pytest.mark.parametrize("cells", ["5", "[1]", '[{"cell_type": "code"}, "x = 1"]', '{"a": 1}'])
def test_a_notebook_whose_cells_are_not_cell_objects_cannot_be_run_with_one_line(tmp_path, cells):
    """Such a file crashed the child process, which was reported as "the process ended: os._exit or a crash"."""
    from mha_numpy.checker.load import code_cells

    path = tmp_path / "hand_in.ipynb"
    path.write_text(f'{{"cells": {cells}}}')
    with pytest.raises(CannotRun, match="hand_in.ipynb is not a notebook"):
        code_cells(path)


def test_cli_a_directory_is_a_usage_error_not_no_such_file(tmp_path):
    r = run_cli(str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr and "no such file" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_cli_checks_an_exercise_notebook_handed_in_as_is(tmp_path):
    """The likeliest mistake: handing in the notebook. Its code cells run in order (its own checker cell is
    skipped): blank, every function is not done yet (exit 1); filled with the solutions, every one passes."""
    blank = run_cli(str(ROOT / "exercises" / "ex05_softmax.ipynb"))
    assert blank.returncode == 1, blank.stdout + blank.stderr
    rows = [line for line in blank.stdout.splitlines() if line.startswith("softmax")]
    assert len(rows) == 4 and all(row.endswith(NOT_DONE) for row in rows), blank.stdout
    solved = tmp_path / "ex05_softmax.ipynb"
    fill = [sys.executable, str(ROOT / "scripts" / "fill_exercises.py"), str(ROOT / "exercises" / solved.name)]
    subprocess.run([*fill, "-o", str(solved)], check=True, capture_output=True)
    r = run_cli(str(solved))
    assert r.returncode == 0 and "4 of 4 functions pass" in r.stdout, r.stdout + r.stderr


def test_cli_help_documents_the_exit_codes():
    r = subprocess.run([sys.executable, "-m", "mha_numpy", "check", "--help"], capture_output=True, text=True)
    text = " ".join(r.stdout.split())
    for code in ("0 = every function found was checked and passed", "1 = a function failed", "2 = usage error",
                 "3 = the file could not be run"):  # fmt: skip
        assert code in text, code


def test_check_file_from_python_returns_a_printable_report():
    report = check_file(BUGGY)
    assert not report.passed and "softmax_backward" in str(report)
    assert report["softmax_backward"].bug.key == "softmax_diagonal"


def test_functions_of_unknown_pairs_are_listed_not_failed():
    ns = {"softmax_forward": correct_namespace()["softmax_forward"], "my_helper_forward": lambda x: (x, None)}
    report = check_namespace(ns)
    assert report.passed and report.ignored == ["my_helper_forward"]
    assert "my_helper_forward" in str(report)


def test_the_checker_grades_the_registry_pairs_with_the_registry_functions():
    """One registry: each pair of mha_numpy.pairs with course cases is graded (the same object, so the same
    reference functions and cases); the only course-only pairs are self-attention, exercise 13's flash pair and
    exercise 14's delta rule."""
    from mha_numpy import pairs

    graded = {p.name: p for p in PAIRS}
    assert all(graded[p.name] is p for p in pairs.PAIRS if p.cases is not None)
    assert set(graded) - {p.name for p in pairs.PAIRS} == {"self_attention", "flash_attention", "delta_rule_recurrent"}


def _sdpa(backward):
    return {"scaled_dot_product_attention_forward": correct_namespace()["scaled_dot_product_attention_forward"],
            "scaled_dot_product_attention_backward": backward}  # fmt: skip


def test_attention_backward_returns_one_gradient_per_input_of_its_forward():
    """Exercise 6's forward has no bias: (dq, dk, dv) is right; the library's pair returns (dq, dk, dv, None), right
    too (its forward has an optional bias, not given); any other count is a FAIL saying what is owed."""
    from mha_numpy import functional as F

    student = correct_namespace()["scaled_dot_product_attention_backward"]
    assert check_namespace(_sdpa(student)).passed
    library = {"scaled_dot_product_attention_forward": F.scaled_dot_product_attention_forward,
               "scaled_dot_product_attention_backward": F.scaled_dot_product_attention_backward}  # fmt: skip
    assert check_namespace(library).passed
    report = check_namespace(_sdpa(lambda d, cache: student(d, cache)[:2]))
    row = report["scaled_dot_product_attention_backward"]
    assert row.status == "FAIL" and "returned 2 gradients, expected 3 (dq, dk, dv)" in row.detail
    row = check_namespace(_sdpa(lambda d, cache: (*student(d, cache), d)))["scaled_dot_product_attention_backward"]
    assert row.status == "FAIL" and "returned 4 gradients, expected 3" in row.detail


STUDENTS = sorted((Path(__file__).parent / "data" / "students").glob("*.py"))


def _expected(path: Path) -> dict[str, str]:
    """{function: bug key} from the file's ``# expect: FUNCTION KEY`` lines (a file without one: no catalogued bug)."""
    lines = [line.split()[2:] for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("# expect:")]
    return {function: key for function, key in lines}


@pytest.mark.parametrize("path", [p for p in STUDENTS if _expected(p)], ids=lambda p: p.stem)
def test_each_buggy_student_file_fails_where_the_bug_is_and_names_it(path):
    """A student's file written by hand (not a variant of bugs.py): the function with the catalogued bug FAILs with
    that bug's diagnosis, every other function of the file passes."""
    from mha_numpy.checker import load_student

    expected = _expected(path)
    report = check_namespace(load_student(path), source=path.name)
    for row in report.rows:
        if row.function in expected:
            assert row.status == "FAIL", str(report)
            assert row.bug is not None and row.bug.key == expected[row.function], str(report)
            assert row.bug.wrote in str(report)
        else:
            assert row.status == "PASS", str(report)
    assert set(expected) <= {r.function for r in report.rows}


@pytest.mark.parametrize("name", ["scores_dot_t", "linear_no_db"])
def test_a_crash_and_a_missing_gradient_are_diagnosed_through_the_child_process_too(name):
    """check_file runs the file in a child process, which sends back only the start of an error message: `.T` on
    4-D arrays is still named; ``return dx, dW`` (a gradient short) is named, not only counted."""
    path = next(p for p in STUDENTS if p.stem == name)
    report = check_file(path)
    for function, key in _expected(path).items():
        assert report[function].status == "FAIL" and report[function].bug.key == key, str(report)


def test_exercise_13s_reference_pair_is_attention():
    """The flash pair of checker.reference (the key-block loop, whole query rows) against the library's attention, with
    a block that does not divide Lk, a mask and a fully masked row (context and gradients 0 there)."""
    from mha_numpy import functional as F

    rng = np.random.default_rng(5)
    q, k, v = (
        3 * rng.standard_normal((2, 2, 4, 3)),
        rng.standard_normal((2, 2, 7, 3)),
        rng.standard_normal((2, 2, 7, 5)),
    )
    mask = rng.random((2, 1, 4, 7)) > 0.4
    mask[1, 0, 3] = False
    out, cache = R.flash_attention_forward(q, k, v, mask, 3)
    ref, ref_cache = F.scaled_dot_product_attention_forward(q, k, v, mask)
    assert np.abs(out - ref).max() <= 1e-14 * np.abs(ref).max() and np.all(out[1, :, 3] == 0)
    d = rng.standard_normal(out.shape)
    got, want = R.flash_attention_backward(d, cache), F.scaled_dot_product_attention_backward(d, ref_cache)[:3]
    scale = max(np.abs(w).max() for w in want)
    assert all(np.abs(g - w).max() <= 1e-13 * scale for g, w in zip(got, want))
    assert np.all(got[0][1, :, 3] == 0)


def test_a_right_backward_behind_a_wrong_cache_is_told_so():
    """A forward whose output is right but whose cache holds ℓ for 1/ℓ: its backward fails, and the row says that
    the same backward is right on the reference forward's cache (the forward's cache is the mistake). Without the
    hint a student would hunt for the bug in a correct backward."""
    from mha_numpy.checker import load_student

    report = check_namespace(load_student(Path(__file__).parent / "data" / "students" / "flash_cache_l.py"))
    assert report["flash_attention_forward"].status == "PASS"
    row = report["flash_attention_backward"]
    assert row.status == "FAIL" and "with the reference forward's cache it is right" in row.detail, str(report)
    ns = correct_namespace()  # a backward that is wrong on any cache gets no such hint
    ns["softmax_backward"] = bugs.softmax_backward_diagonal
    assert "reference forward's cache" not in check_namespace(ns, only=["softmax"])["softmax_backward"].detail


def test_a_cache_that_the_next_forward_overwrites_fails_and_is_told_so():
    """A forward that returns one module-level buffer as its cache (trial h13): the checker calls the forward on
    other values between a forward and its backward, as two layers would, so the backward reads the later call's
    weights and FAILs, and the relation says the cache shares memory with what the next call overwrites. The
    solutions (every other test here) pass with that extra call."""
    ns = correct_namespace()
    buffers: dict = {}

    def softmax_forward(x):
        p, _ = ns["softmax_forward"](x)
        buffer = buffers.setdefault(p.shape, np.empty(p.shape))
        buffer[...] = p
        return p, buffer

    report = check_namespace({"softmax_forward": softmax_forward, "softmax_backward": ns["softmax_backward"]})
    assert report["softmax_forward"].status == "PASS", str(report)
    row = report["softmax_backward"]
    assert row.status == "FAIL" and "shares memory with state the next call overwrites" in row.relation, str(report)


def test_right_gradients_returned_in_the_wrong_order_are_told_so():
    """A backward returning (dk, dq) for (dq, dk) (trial o29): the relation says the order it returns and the
    right one, whether the shapes differ (Lq != Lk) or not; a wrong gradient in the right order gets no such line."""
    ns = correct_namespace()

    def swapped(d_out, cache):
        dq, dk = ns["attention_scores_backward"](d_out, cache)
        return dk, dq

    ns_swapped = {"attention_scores_forward": ns["attention_scores_forward"], "attention_scores_backward": swapped}
    row = check_namespace(ns_swapped)["attention_scores_backward"]
    assert row.status == "FAIL" and "it returns (dk, dq); the order is (dq, dk)" in row.relation, row.relation

    def halved(d_out, cache):
        dq, dk = ns["attention_scores_backward"](d_out, cache)
        return dq, dk / 2

    ns_halved = {"attention_scores_forward": ns["attention_scores_forward"], "attention_scores_backward": halved}
    row = check_namespace(ns_halved)["attention_scores_backward"]
    assert row.status == "FAIL" and "order" not in row.relation, row.relation


def test_a_backward_right_only_on_the_reference_cache_is_also_told_its_own_relation():
    """Dropout caching keep = 1 − p and multiplying by it (trial n05), where the library caches 1/(1 − p): the backward
    is right on the reference's cache, but nothing was changed after it was stored; the relation also says what the
    student's own result is ((1 − p)² times the right one)."""

    def dropout_forward(x, p, rng, keep_mask):
        return np.where(keep_mask, x / (1.0 - p), 0.0), (keep_mask, 1.0 - p)

    def dropout_backward(d_out, cache):
        keep_mask, keep = cache
        return np.where(keep_mask, d_out * keep, 0.0)

    report = check_namespace({"dropout_forward": dropout_forward, "dropout_backward": dropout_backward})
    row = report["dropout_backward"]
    assert row.status == "FAIL" and "with its own cache, dx is (1 − p)² (= " in row.relation, row.relation
    assert "a factor 1/(1 − p)² is missing" in row.relation, row.relation  # the factor of every case, p = 0.3 and 0.5


@pytest.mark.parametrize("rescaled", ["l", "acc"])
def test_an_online_update_rescaling_only_one_running_sum_is_the_catalogued_no_rescale(rescaled):
    """Trial n07: l rescaled when the max grows and acc not (or the converse) is a variant of online_no_rescale, and
    that match is said instead of the weak "right except on the first row" (the rows whose max grows in the case)."""

    def update(m, l_sum, acc, s, v):
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)
        alpha, e = np.exp(m - shift), np.exp(s - shift)
        l_alpha, acc_alpha = (alpha, 1.0) if rescaled == "l" else (1.0, alpha)
        return m_new, l_alpha * l_sum + e.sum(-1, keepdims=True), acc_alpha * acc + e @ v

    row = check_namespace({"online_softmax_update": update})["online_softmax_update"]
    assert row.status == "FAIL" and row.bug is not None and row.bug.key == "online_no_rescale", str(row)
    assert f"({rescaled} is)" in row.bug.title and "right except" not in row.relation, str(row)


def test_a_flash_backward_with_d_from_the_whole_rows_p_dp_passes():
    """D = Σ_j P_j ∘ dP_j over the whole row equals rowsum(dO ∘ O): a correct variant, not the tile-D bug."""
    from mha_numpy.checker import load_student

    report = check_namespace(load_student(Path(__file__).parent / "data" / "students" / "flash_D_from_p_dp.py"))
    assert report.passed and len(report.rows) == 2, str(report)
