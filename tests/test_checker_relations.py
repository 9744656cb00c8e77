"""The relation finders of mha_numpy/checker/relations.py, one test each, and the student files they name.

Each finder gets a wrong gradient built from a right one by the relation it must see, and a gradient that is wrong
some other way (it must say nothing). Then every tests/data/students/rel_*.py (bugs outside the catalogue and
near-variants of catalogued ones, issue 41) FAILs with the relation its ``# relation: FUNCTION SENTENCE`` line says,
and its other functions pass.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.checker import check_namespace, load_student
from mha_numpy.checker import relations as R

RNG = np.random.default_rng(41)
WANT = RNG.standard_normal((2, 3, 4))
SCALE = float(np.abs(WANT).max())
NOISE = WANT + 1e-3 * RNG.standard_normal(WANT.shape)  # wrong, but by no relation


def test_missing_says_none_and_zeros_where_the_reference_is_not_zero():
    assert "None was returned" in R.missing(None, WANT, SCALE)
    assert "all zeros" in R.missing(np.zeros_like(WANT), WANT, SCALE)
    assert R.missing(np.zeros_like(WANT), np.zeros_like(WANT), 1.0) is None  # zero is right there
    assert R.missing(NOISE, WANT, SCALE) is None
    assert R.missing(np.where(WANT > 0, np.nan, 0.0), WANT, SCALE) is None  # NaN is not zero


def test_constant_factor_is_named_when_it_is_a_size_and_given_as_a_number_otherwise():
    names = R.factor_names(d=4, **{"the batch size": 3})
    assert "√d or 2 (= 2) times" in R.constant_factor(2 * WANT, WANT, SCALE, names)
    assert "a factor 1/√d or 1/2 is missing" in R.constant_factor(2 * WANT, WANT, SCALE, names)
    assert "1/(the batch size) (= 0.333333) times" in R.constant_factor(WANT / 3, WANT, SCALE, names)
    assert "wrong sign" in R.constant_factor(-WANT, WANT, SCALE, names)
    assert "−√d or −2 (= -2) times" in R.constant_factor(-2 * WANT, WANT, SCALE, names)
    assert "1.37 times" in R.constant_factor(1.37 * WANT, WANT, SCALE, names)
    assert R.constant_factor(NOISE, WANT, SCALE, names) is None
    assert R.constant_factor(WANT, WANT, SCALE, names) is None


def test_a_factor_is_named_by_the_computation_before_the_arrays_sizes_and_by_every_size_that_fits():
    """cap = 2 and the batch = 2: "cap or 2"; no factor of the computation fits: every size that does, and 2."""
    names = R.factor_names({"the batch size": 2, "the number of heads": 3}, cap=2.0)
    assert "is cap or 2 (= 2) times" in R.constant_factor(2 * WANT, WANT, SCALE, names)
    names = R.factor_names({"the batch size": 2, "the number of heads": 3}, cap=5.0)
    assert "is the batch size or 2 (= 2) times" in R.constant_factor(2 * WANT, WANT, SCALE, names)
    assert "a factor 1/(the number of heads) is missing" in R.constant_factor(3 * WANT, WANT, SCALE, names)


def test_a_factor_found_on_several_cases_is_named_by_the_labels_that_fit_it_on_every_one():
    """√d = the heads = 2 on the first case, √d = √3 on the second (trial o03, dv divided by the heads): the heads fit
    both, √d only the first; a factor that is 1/√d on both is named 1/√d alone; one case, or a sentence that is not a
    constant factor's, is left as it was."""
    sizes = {"the batch size": 2, "the number of heads": 2}
    first, second = R.factor_names(sizes, d=4), R.factor_names(sizes, d=3)

    def said(c1, c2):
        return [(f"dv {R.constant_factor(c1 * WANT, WANT, SCALE, first)}.", first),
                (f"dv {R.constant_factor(c2 * WANT, WANT, SCALE, second)}.", second)]  # fmt: skip

    over_heads = R.agreed_factor(said(0.5, 0.5))
    assert "is 1/√d or 1/2 (= 0.5)" in said(0.5, 0.5)[0][0]  # the first case alone: √d before the sizes
    assert "1/(the number of heads)" in over_heads and "√d" not in over_heads, over_heads
    assert "a factor the batch size or the number of heads or 2 is missing" in over_heads, over_heads
    unscaled = R.agreed_factor(said(0.5, 1 / np.sqrt(3)))
    assert "is 1/√d (= 0.5) times" in unscaled and "a factor √d is missing" in unscaled, unscaled
    assert R.agreed_factor(said(0.5, 0.5)[:1]) == said(0.5, 0.5)[0][0]
    three = R.factor_names({"the batch size": 2, "the number of heads": 3}, d=3)  # 1/3, said to 6 digits
    heads = [said(0.5, 0.5)[0], (f"dv {R.constant_factor(WANT / 3, WANT, SCALE, three)}.", three)]
    assert "is 1/d (= 0.333333)" in heads[1][0]  # the second case alone: 1/d before the heads
    assert "is 1/(the number of heads) (= 0.5) times" in R.agreed_factor(heads), R.agreed_factor(heads)
    other = [("dv has the wrong sign.", first), said(0.5, 0.5)[1]]
    assert R.agreed_factor(other) == "dv has the wrong sign."


def test_swapped_axes_sees_a_transpose_and_two_swapped_axes():
    square = RNG.standard_normal((4, 4))
    assert "transpose" in R.swapped_axes(square.T, square, 1.0)
    four = RNG.standard_normal((2, 3, 3, 5))
    assert "axes (1, 2) swapped" in R.swapped_axes(four.swapaxes(1, 2), four, 1.0)
    wide = RNG.standard_normal((3, 5))  # W (out, in): a transposed dW has the wrong shape, and is still named
    assert "transpose" in R.swapped_axes(wide.T, wide, 1.0)
    symmetric = square + square.T
    assert R.swapped_axes(symmetric, symmetric, 1.0) is None  # the transpose equals it: nothing to tell
    assert R.swapped_axes(NOISE, WANT, SCALE) is None


def test_reordered_sees_heads_tiled_for_repeated_and_rows_reversed_not_a_changed_row():
    kv = RNG.standard_normal((2, 2, 3, 4))
    repeated, tiled = np.repeat(kv, 3, axis=1), np.tile(kv, (1, 3, 1, 1))  # (2, 6, 3, 4) each, heads in two orders
    assert "has the right heads in another order" in R.reordered(tiled, repeated, 1.0)
    rows = RNG.standard_normal((4, 5))
    assert "indices of axis 0 in another order" in R.reordered(rows[::-1], rows, 1.0)
    changed = rows[::-1].copy()
    changed[0] += 1.0  # one slice that is none of want's: no reordering
    assert R.reordered(changed, rows, 1.0) is None
    assert R.reordered(rows, rows, 1.0) is None and R.reordered(NOISE, WANT, SCALE) is None


def test_scrambled_sees_a_reshape_without_its_transpose_not_a_changed_value():
    heads = RNG.standard_normal((2, 2, 3, 3))  # (B, H, L, d)
    right = heads.transpose(0, 2, 1, 3).reshape(2, 3, 6)  # merged: (B, L, H·d)
    assert "right values in other places" in R.scrambled(heads.reshape(2, 3, 6), right, 1.0)
    changed = heads.reshape(2, 3, 6).copy()
    changed[0, 0, 0] += 1.0
    assert R.scrambled(changed, right, 1.0) is None and R.scrambled(NOISE, WANT, SCALE) is None
    assert R.scrambled(np.ones((2, 3)), np.ones((2, 3)), 1.0) is None  # nothing to move: every value the same


def test_summed_wrong_sees_a_missing_sum_and_a_sum_too_many():
    per_row = RNG.standard_normal((2, 3, 5))  # a bias gradient left per position
    assert "not summed over axes (0, 1)" in R.summed_wrong(per_row, per_row.sum(axis=(0, 1)), 1.0)
    sink = RNG.standard_normal((2, 1))  # one sink a head; the student gave each the total
    assert "summed over axes (0,), a sum too many" in R.summed_wrong(np.full((2, 1), sink.sum()), sink, 1.0)
    assert "summed over axes (2,)" in R.summed_wrong(WANT.sum(axis=2), WANT, SCALE)
    assert R.summed_wrong(NOISE, WANT, SCALE) is None


def test_missing_path_names_the_path_whose_contribution_is_missing():
    paths = {"the query path": RNG.standard_normal(WANT.shape), "the value path": RNG.standard_normal(WANT.shape)}
    want = WANT + sum(paths.values())
    scale = float(np.abs(want).max())
    assert "the value path" in R.missing_path(want - paths["the value path"], want, scale, paths)
    both = R.missing_path(want - sum(paths.values()), want, scale, paths)
    assert "contributions of the query path and the value path" in both
    assert R.missing_path(NOISE, WANT, SCALE, None) is None
    two_bent = want - 0.5 * paths["the value path"] - 0.3 * paths["the query path"]
    assert R.missing_path(two_bent, want, scale, paths) is None  # two paths bent: no one path explains it


def test_missing_path_names_a_factor_or_a_sign_on_one_path_only():
    """got = want + (c − 1) · one path: the path named, and c as constant_factor names it."""
    paths = {"the cos term": RNG.standard_normal(WANT.shape), "the sin term": RNG.standard_normal(WANT.shape)}
    want = sum(paths.values())
    scale = float(np.abs(want).max())
    flipped = R.missing_path(want - 2 * paths["the sin term"], want, scale, paths)
    assert "the sin term with the wrong sign" in flipped, flipped
    halved = R.missing_path(want - 0.5 * paths["the cos term"], want, scale, paths, R.factor_names(d=9))
    assert "the cos term 1/2 (= 0.5) times its right value" in halved and "a factor 2 is missing" in halved, halved
    assert R.missing_path(want + 1e-3 * RNG.standard_normal(WANT.shape), want, scale, paths) is None
    term = np.ones(WANT.shape[:-1] + (1,))  # a term constant along the last axis (a mean's) is broadcast
    assert "the mean's term" in R.missing_path(WANT - term, WANT, SCALE, {"the mean's term": term})


def test_wrong_on_part_names_the_first_row_one_head_and_the_masked_rows():
    want = RNG.standard_normal((2, 3, 4, 5))
    first = want.copy()
    first[..., 0, :] = 0
    assert "the first row" in R.wrong_on_part(first, want, 1.0)
    table = want[0, 0].copy()  # (4, 5): row 0 of a table is token 0, not a first position
    assert "index 0 of axis 0" in R.wrong_on_part(np.where(np.arange(4)[:, None] == 0, 0.0, table), table, 1.0)
    repeated = {"the rows of ids that occur more than once": np.array([[True], [True], [False], [True]])}
    row0 = np.where(np.arange(4)[:, None] == 0, 0.0, table)  # token 0 skipped (trial o14), and 0 is a repeated id
    assert "right except on row 0" in R.wrong_on_part(row0, table, 1.0, parts=repeated)  # the smaller place
    rows01 = np.where(np.arange(4)[:, None] < 2, 0.0, table)  # two of the repeated rows: the part, as before
    assert "wrong only on the rows of ids that occur more than once" in R.wrong_on_part(rows01, table, 1.0,
                                                                                        parts=repeated)  # fmt: skip
    head = want.copy()
    head[:, 2] *= 2
    assert "head 2" in R.wrong_on_part(head, want, 1.0)
    masked = np.zeros((2, 3, 4), dtype=bool)
    masked[1, 0, 1] = masked[0, 2, 3] = True
    blocked = np.where(masked[..., None], np.nan, want)  # NaN where no key is allowed
    assert "fully masked rows" in R.wrong_on_part(blocked, want, 1.0, masked)
    assert R.wrong_on_part(want + 1e-3, want, 1.0) is None  # wrong everywhere: no part to name


def test_wrong_on_part_names_a_part_the_caller_gives_when_every_wrong_entry_is_in_it():
    want = RNG.standard_normal((2, 2, 3, 5))
    blocked = RNG.random(want.shape) < 0.3
    parts = {"the blocked entries": blocked, "everything": np.ones(want.shape, dtype=bool)}
    leak = np.where(blocked, want + 1.0, want)  # wrong on some blocked entries only
    assert R.wrong_on_part(leak, want, 1.0, parts=parts) == "is wrong only on the blocked entries"
    outside = leak.copy()
    outside[~blocked] += 1.0  # also wrong outside the part: not that part, and "everything" says nothing
    assert R.wrong_on_part(outside, want, 1.0, parts=parts) is None
    assert R.wrong_on_part(leak, want, 1.0, parts={"bad shape": np.ones((7,), dtype=bool)}) is None


def test_elementwise_factor_sees_a_chain_rules_factor_forgotten_or_twice_not_another_array():
    want = RNG.standard_normal((2, 3, 4))
    p = RNG.uniform(0.1, 1.0, want.shape)
    p[0, 0, 0] = 0.0  # where the factor is 0 the right one is 0 too: tested as got · p = want, no division
    want = want * p
    forgot = np.where(p > 0, want / np.where(p > 0, p, 1.0), 7.0)
    assert "divided by p, entry by entry" in R.elementwise_factor(forgot, want, 1.0, {"p": p})
    assert "times p, entry by entry: a factor p too many" in R.elementwise_factor(want * p, want, 1.0, {"p": p})
    other = RNG.uniform(0.1, 1.0, want.shape)
    assert R.elementwise_factor(want * other, want, 1.0, {"p": p}) is None
    assert R.elementwise_factor(2 * want, want, 1.0, {"a constant": np.full(want.shape, 2.0)}) is None


def test_varying_factor_sees_a_factor_per_row_and_per_head_not_a_constant_or_noise():
    want = RNG.standard_normal((2, 3, 4, 5))
    per_row = want * RNG.uniform(0.5, 2.0, (2, 3, 4, 1))  # a wrong normaliser, one per row
    assert "row by row" in R.varying_factor(per_row, want, 1.0)
    per_head = want * np.array([1.0, 2.0, 0.5])[:, None, None]  # (3, 1, 1): one factor a head
    assert "from one head to the next" in R.varying_factor(per_head, want, 1.0)
    assert R.varying_factor(2 * want, want, 1.0) is None  # one constant: constant_factor's
    assert R.varying_factor(want + 1e-3 * RNG.standard_normal(want.shape), want, 1.0) is None
    narrow = RNG.standard_normal((3, 2))  # rows of two entries fit any factor: not told
    assert R.varying_factor(narrow * RNG.uniform(0.5, 2, (3, 1)), narrow, 1.0) is None


def test_from_error_reads_numpys_message_and_says_nothing_of_another():
    """The start of NumPy's message (all a child process sends back) says what the code did; another error, nothing."""
    try:
        np.ones((2, 3, 5)) @ np.ones((2, 3, 4))
    except ValueError as e:
        said = R.from_error("linear_backward", f"raised ValueError: {str(e)[:100]}")
    assert said.startswith("linear_backward raised: a matrix product whose inner sizes differ"), said
    try:
        np.ones((2, 3, 5)) - np.ones((2, 3))
    except ValueError as e:
        assert "keepdims=True" in R.from_error("softmax_backward", str(e))
    assert R.from_error("softmax_backward", "raised ValueError: my own check failed") == ""


def test_explain_stays_bounded_and_quiet_on_hostile_answers():
    """A student's array of 40 axes, of complex numbers, of objects, of NaN, a list: no crash, no relation, and the
    search bounded (2⁴⁰ subsets of axes would never end)."""
    import time

    start = time.perf_counter()
    huge = np.ones((2, 3, 4, 4000))  # 4000 times the right one's size: not searched
    for got in (
        np.ones((1,) * 39 + (25,)),
        WANT + 1j,
        np.full(WANT.shape, np.nan),
        [[1, 2], [3]],
        np.array([None]),
        huge,
    ):
        assert R.explain("dk", "here", got, WANT, SCALE) == ""
    assert time.perf_counter() - start < 2.0


def test_explain_says_nothing_of_a_right_answer_even_with_paths_parts_and_blocked_scores():
    want = RNG.standard_normal((2, 3, 4))
    want[0, 1, :] = -np.inf  # a blocked row of scores: −inf where −inf is right is equal
    got = want + 1e-9 * np.where(np.isinf(want), 0, 1)
    paths = {"a path": np.ones(want.shape)}
    parts = {"a part": np.ones(want.shape, dtype=bool)}
    assert R.explain("out", "here", got, want, 3.0, paths=paths, parts=parts) == ""
    assert "wrong sign" in R.explain("out", "here", np.where(np.isinf(want), want, -want), want, 3.0)


def test_explain_says_gradient_and_place_and_never_crashes_on_odd_answers():
    said = R.explain("dk", "in attention_scores_backward", -WANT, WANT, SCALE)
    assert said.startswith("dk (in attention_scores_backward) has the wrong sign")
    assert R.explain("dk", "here", np.array(["a"] * 24).reshape(WANT.shape), WANT, SCALE) == ""
    assert R.explain("dk", "here", np.ones((7,)), WANT, SCALE) == ""
    assert R.explain("dk", "here", NOISE, WANT, SCALE) == ""


STUDENTS = sorted((Path(__file__).parent / "data" / "students").glob("rel_*.py"))


def _relation(path: Path) -> tuple[str, str]:
    """(function, sentence) of the file's ``# relation: FUNCTION SENTENCE`` line, continued on the ``#   ...`` lines
    right after it (a long F-line does not fit in one)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("# relation:"))
    more = [x.removeprefix("#  ").strip() for x in itertools.takewhile(lambda x: x.startswith("#   "), lines[i + 1 :])]
    function, sentence = " ".join([lines[i].removeprefix("# relation:").strip(), *more]).split(" ", 1)
    return function, sentence


@pytest.mark.parametrize("path", STUDENTS, ids=lambda p: p.stem)
def test_each_student_file_outside_the_catalogue_is_named_by_its_relation(path):
    """Ten files main's checker names 0 of (near-variants of catalogued bugs and bugs outside the catalogue): each
    FAILs where its bug is, with the relation in the report's relation line; its other functions pass."""
    function, sentence = _relation(path)
    report = check_namespace(load_student(path), source=path.name)
    for row in report.rows:
        if row.function == function:
            assert row.status == "FAIL" and sentence in row.relation, str(report)
            assert f"relation: {row.relation}" in str(report)
        else:
            assert row.status == "PASS", str(report)
    assert function in {r.function for r in report.rows}


def test_there_are_student_files_for_every_kind_of_relation():
    """The set covers each finder at least once (a deleted file would leave a relation untested end to end)."""
    said = " ".join(_relation(p)[1] for p in STUDENTS)
    kinds = (
        "all zeros",
        "is an array of zeros",
        "fully masked rows",
        "times the right one",
        "wrong sign",
        "transpose",
        "per-item part",
        "a sum too many",
        "lacks the contribution",
        "right except on the first row",
        "has the contribution of",  # a factor or a sign on one path
        "times its right value",  # a factor on one path
        "row by row",
        "is wrong only on the blocked entries",
        "is wrong only on the dropped entries",
        "is wrong only on the rows of ids",
        "has its axes (1, 2) swapped",
        "in another order",
        "raised: a matrix product whose inner sizes differ",
        "entry by entry",
        "right when it reads the reference forward's cache",
    )
    for words in kinds:
        assert words in said


def test_the_relation_reaches_the_score_file_and_comes_back_from_a_child_process():
    """The teacher's score file carries the relation in the test's output; ``check_file`` (the file in a child
    process, which sends back arrays only) finds the same relation as the notebook's in-process check."""
    from mha_numpy.checker import check_file
    from mha_numpy.checker.grading import grade_namespace

    path = next(p for p in STUDENTS if p.stem == "rel_softmax_sign")
    function, sentence = _relation(path)
    test = next(t for t in grade_namespace(load_student(path)).tests if t["name"] == function)
    assert test["score"] == 0 and f"(relation: {sentence}" in test["detail"], test
    assert sentence in check_file(path)[function].relation


def test_zeros_for_none_sees_zeros_returned_for_an_input_never_given():
    assert "return None in its place" in R.zeros_for_none(np.zeros((2, 3)))
    assert R.zeros_for_none(None) is None and R.zeros_for_none(WANT) is None


FACTORS = [
    ("dropout_no_scale", "is 1 − p (= 0.7) times"),
    ("soft_cap_times_cap", "is cap (= 2) times"),  # cap ≠ 2 on the second case: 2 is not the factor
    ("repeat_kv_mean", "is 1/n_rep (= 0.333333) times"),
    ("cross_entropy_no_mean", "is N (the rows, every axis but the last) (= 6) times"),
]


@pytest.mark.parametrize(("key", "factor"), FACTORS, ids=[k for k, _ in FACTORS])
def test_a_catalogued_factor_is_named_by_the_calls_own_argument_not_by_a_size_that_happens_to_equal_it(key, factor):
    """soft-cap's cap is 2 and so is the batch: the factor is named by the argument (before, "the batch size")."""
    from mha_numpy.checker import bugs, cases

    bug = bugs.find(key)
    pair = cases.find(bug.pair)
    ns = {f"{pair.name}_forward": bug.forward or pair.forward, f"{pair.name}_backward": bug.impl}
    row = check_namespace(ns, only=[pair.name])[bug.function]
    assert row.status == "FAIL" and factor in row.relation and row.bug == bug, row


def test_the_block_capstones_skip_path_is_named_at_its_f_line():
    """Exercise 10's d_h without F20's skip: the relation names the skip and the LayerNorm's F-line (F15)."""
    from mha_numpy.checker import capstone_block as K

    _, caches = K.block_case()
    g = K.block_reference(caches)
    _, wrong, _, said = K.BLOCK.judge({**g, "h": g["h"] - g["y"]}, {"seed": 0})  # the case block_case() built
    assert wrong.name == "h" and said.startswith("d_h (at F15: xhat2 = "), said
    assert "lacks the contribution of F20's skip" in said, said


def _hinted_gradients():
    """(pair, case, gradient name) for every graded pair's case and owed gradient that ``pair_hints`` gives paths."""
    from mha_numpy.checker import cases, pair_hints

    for pair in cases.PAIRS:
        if pair.name not in pair_hints.HINTS and pair.name not in pair_hints.NEEDS_FORWARD:
            continue
        for case in pair.cases(np.random.default_rng(5)):
            for name in pair.owed(case):
                yield pair, case, name


def test_each_pairs_paths_add_up_to_its_reference_gradient_and_its_parts_fit_it():
    """A path that is not one of the gradient's terms would name a wrong path: the paths pair_hints gives of every
    graded pair's gradient sum to the reference's, on every course case, and every part broadcasts to it."""
    from mha_numpy.checker import pair_hints
    from mha_numpy.pairs import gradients

    seen = set()
    for pair, case, name in _hinted_gradients():
        out, cache = pair.forward(*case.values())
        d_out = RNG.standard_normal() if pair.scalar_output else RNG.standard_normal(np.shape(out))
        want = gradients(pair, pair.backward(d_out, cache), case)[name]
        paths, parts = pair_hints.hints(pair, case, name, d_out)
        # two ways to cut one gradient: flash's dq by the softmax's terms and by tiles; the delta rule's by step and
        # by token (through time)
        other = [v for k, v in paths.items() if "tile" in k or "through time" in k]
        for family in filter(None, ([v for k, v in paths.items() if "tile" not in k and "through time" not in k],
                                    other)):  # fmt: skip
            seen.add(pair.name)
            total = sum(np.broadcast_to(v, want.shape) for v in family)
            assert np.allclose(total, want, atol=1e-12 * np.abs(want).max()), (pair.name, case.label, name)
        for where in parts.values():
            np.broadcast_to(where, want.shape)
    assert seen >= {"softmax", "sink_softmax", "scaled_dot_product_attention", "flash_attention", "layer_norm",
                    "repeat_kv", "rope", "soft_cap", "softmax_cross_entropy", "self_attention",
                    "delta_rule_recurrent"}, seen  # fmt: skip


def test_each_forwards_terms_add_up_to_its_output():
    """The terms forward_hints gives of an output (linear's bias, LayerNorm's beta, rope's cos and sin, the float mask,
    self-attention's b_o) sum to the reference forward's output on every course case."""
    from mha_numpy.checker import cases, pair_hints

    seen = set()
    for pair in cases.PAIRS:
        for case in pair.cases(np.random.default_rng(6)):
            paths, _ = pair_hints.forward_hints(pair, case)
            if paths:
                out = pair.forward(*case.values())[0]
                seen.add(pair.name)
                assert np.allclose(sum(np.broadcast_to(v, out.shape) for v in paths.values()), out), pair.name
    assert seen == {"linear", "layer_norm", "rope", "apply_mask", "self_attention"}, seen


def test_each_capstones_paths_add_up_to_its_reference_gradient():
    """The model's d_x, d_scores, d_logits, d_pos_emb; the block's d_x and d_h (the skip and the norm, the norm's
    three), d_n1, d_u, d_scores: each sums to the reference."""
    from mha_numpy.checker import capstone as C
    from mha_numpy.checker import capstone_block as K

    for capstone, names in ((C.MODEL, ("x", "scores", "logits", "pos_emb")), (K.BLOCK, ("x", "h", "n1", "u",
                                                                                      "scores"))):  # fmt: skip
        cache, caches = capstone.make_case(**capstone.cases[0])
        g = capstone.reference(caches)
        for name in names:
            paths = list(capstone.paths(name, cache, g).values())
            whole = sum(paths[:2]) if capstone is K.BLOCK and name in ("x", "h") else sum(paths)
            assert np.allclose(whole, g[name], atol=1e-12 * np.abs(g[name]).max()), (capstone.name, name)
            if capstone is K.BLOCK and name in ("x", "h"):  # the LayerNorm's own three sum to its path
                assert np.allclose(sum(paths[2:]), paths[1], atol=1e-12 * np.abs(g[name]).max()), name


CORRECT = sorted((Path(__file__).parent / "data" / "students").glob("ok_*.py"))


@pytest.mark.parametrize("path", CORRECT, ids=lambda p: p.stem)
def test_each_correct_file_in_an_unusual_style_passes_and_is_related_to_nothing(path):
    """No false alarm: einsum, explicit Jacobians, one-hot products, the inverse rotation, the sink as a column, D as
    rowsum(dO ∘ O): every function passes, no row carries a relation."""
    report = check_namespace(load_student(path), source=path.name)
    assert report.passed and len(report.rows) >= 10, str(report)
    assert not any(r.relation for r in report.rows), str(report)


@pytest.mark.parametrize("pair_name", ["softmax", "sink_softmax", "layer_norm"])
def test_a_reduction_over_the_wrong_axis_is_named_with_the_axis_used_and_the_right_one(pair_name):
    """Trial n03 (the softmax's row sum over the heads) and o26 (LayerNorm's mean over the batch): each variant of
    ``pair_hints.axes`` is said as the axis taken instead of the last, and the right gradient (the library's) gets no
    relation; on the variant, no other finder's sentence comes first."""
    from mha_numpy.checker import cases, pair_hints

    pair = next(p for p in cases.PAIRS if p.name == pair_name)
    case = pair.cases(np.random.default_rng(5))[0]
    out, cache = pair.forward(*case.values())
    d_out = np.random.default_rng(6).standard_normal(out.shape)
    want = pair.backward(d_out, cache)
    want = want[0] if isinstance(want, tuple) else want
    variants = pair_hints.axes(pair, case, "x", d_out)
    assert len(variants) >= want.ndim - 1, list(variants)
    scale = float(np.abs(want).max())
    for said, got in variants.items():
        line = R.explain("dx", "in a backward", got, want, scale, axes=variants)
        assert f"is right with {said}" in line and "instead of axis -1" in line, line
    assert R.explain("dx", "in a backward", want, want, scale, axes=variants) == ""
    assert R.wrong_axis(NOISE, WANT, SCALE, {"a sum over axis 0 instead of axis -1": WANT + 1}) is None


def test_a_path_through_its_weight_transposed_is_named_with_the_path_and_the_weight():
    """Trial3 n14: self-attention's dx with the query path through W_qᵀ (square: no shape error) is said as that path
    and that weight, by the student file's own backward; the right dx, and noise, get no such sentence."""
    from mha_numpy.checker import cases, pair_hints

    path = Path(__file__).parent / "data" / "students" / "trial3" / "n14_self_attention_dx_query_w_transposed.py"
    student = load_student(path)
    pair = next(p for p in cases.PAIRS if p.name == "self_attention")
    case = pair.cases(np.random.default_rng(5))[0]
    out, cache = pair.forward(*case.values())
    d_out = np.random.default_rng(6).standard_normal(out.shape)
    want = pair.backward(d_out, cache)["x"]
    got = student["self_attention_backward"](d_out, student["self_attention_forward"](*case.values())[1])["x"]
    weights = pair_hints.transposed_weights(pair, case, "x", d_out)
    assert len(weights) == 7, list(weights)  # each of the three paths, and every set of them
    scale = float(np.abs(want).max())
    line = R.explain("dx", "in self_attention_backward", got, want, scale, weights=weights)
    assert "the query path uses W_qᵀ where W_q belongs" in line and "lacks the contribution of" in line, line
    assert R.explain("dx", "in self_attention_backward", want, want, scale, weights=weights) == ""
    assert R.transposed_weight(NOISE, WANT, SCALE, {"the query path uses W_qᵀ where W_q belongs": WANT + 1}) is None
    assert pair_hints.transposed_weights(pair, case, "W_q", d_out) == {}


def test_a_relative_bias_read_at_the_mirrored_distance_is_named_not_a_transpose():
    """Trial3 o13: the table read at i − j where j − i belongs, with Lq ≠ Lk (no transpose), is said as the table read
    at the mirrored distance; the right bias, and noise, get no such sentence."""
    from mha_numpy.checker import cases, pair_hints

    pair = next(p for p in cases.PAIRS if p.name == "relative_position_bias")
    case = next(c for c in pair.cases(np.random.default_rng(5)) if dict(c.args)["Lq"] != dict(c.args)["Lk"])
    table, Lq, Lk = (dict(case.args)[n] for n in ("table", "Lq", "Lk"))
    R_ = (table.shape[1] - 1) // 2
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    got = table[:, np.clip(i - j, -R_, R_) + R_][None]  # (1, H, Lq, Lk): the distance i − j
    want = pair.forward(*case.values())[0]
    variants = pair_hints.forward_variants(pair, case)
    scale = float(np.abs(want).max())
    line = R.explain("out", "of relative_position_bias_forward", got, want, scale, variants=variants)
    assert "at the mirrored distance i − j where j − i belongs" in line and "wrong order" in line, line
    assert R.explain("out", "of relative_position_bias_forward", want, want, scale, variants=variants) == ""
    assert R.known_variant(NOISE, WANT, SCALE, {"reads the table mirrored": WANT + 1}) is None


def test_a_repeat_kv_sum_over_the_kv_heads_instead_of_the_copies_is_named_though_its_shape_differs():
    """Trial3 o12: repeat_kv's backward summing each copy's heads (B, n_rep, L, d) where the copies of each group belong
    (B, Hkv, L, d) is said as a sum over the wrong axis; the right dx gets no such sentence."""
    from mha_numpy.checker import cases, pair_hints

    pair = next(p for p in cases.PAIRS if p.name == "repeat_kv")
    case = next(c for c in pair.cases(np.random.default_rng(5)) if dict(c.args)["x"].shape[1] != dict(c.args)["n_rep"])
    (B, Hkv, L, d), n = dict(case.args)["x"].shape, dict(case.args)["n_rep"]
    d_out = np.random.default_rng(6).standard_normal((B, Hkv * n, L, d))
    want = d_out.reshape(B, Hkv, n, L, d).sum(axis=2)  # head h is a copy of k/v head h // n_rep
    got = np.stack([d_out[:, [h * n + r for h in range(Hkv)]].sum(axis=1) for r in range(n)], axis=1)  # per copy
    variants = pair_hints.axes(pair, case, "x", d_out)
    scale = float(np.abs(want).max())
    line = R.explain("dx", "in repeat_kv_backward", got, want, scale, axes=variants)
    assert "the k/v heads, instead of over axis 2" in line and "wrong axis" in line, line
    assert R.explain("dx", "in repeat_kv_backward", want, want, scale, axes=variants) == ""


def test_the_model_capstones_query_path_through_w_q_transposed_is_named_at_its_f_line():
    """Exercise 9's d_x with F4's path as d_q @ W_qᵀ (square: no shape error) is said as that path and that weight;
    the other catalogued d_x mistakes keep their own sentences."""
    from mha_numpy.checker import capstone as C

    case = C.MODEL.cases[0]
    cache, caches = C.MODEL.make_case(**case)
    g = C.MODEL.reference(caches)
    wrong_x = g["h"] + g["q"] @ cache["W_q"].T + g["k"] @ cache["W_k"] + g["v"] @ cache["W_v"]  # (B, L, E) @ (E, E)
    _, wrong, _, said = C.MODEL.judge({**g, "x": wrong_x}, case)
    assert wrong.name == "x" and "F4's q path uses W_qᵀ where W_q belongs" in said, said
    _, wrong, _, said = C.MODEL.judge({**g, "x": g["x"] - g["h"]}, case)
    assert "lacks the contribution of F15's skip" in said, said
