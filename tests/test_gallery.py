"""The bug gallery's measurements: the claims notebooks/10_bug_gallery.ipynb makes, checked on fresh numbers."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy.checker import bugs, gallery
from mha_numpy.checker import reference as R


@pytest.fixture(scope="module")
def table() -> dict:
    return {(m.bug.key, m.bug.function): m for m in (gallery.measure(b) for b in gallery.gallery_bugs(every=True))}


def test_self_attention_pair_without_bugs_is_multi_head_attention():
    case = gallery.module_case()
    x, params, mask = case["x"], case["params"], case["mask"]
    fwd, bwd = bugs.self_attention_pair()
    out, cache = fwd(x, params, 2, mask)
    ref, ref_cache = R.self_attention_forward(x, params, 2, mask)
    d = np.random.default_rng(0).standard_normal(out.shape)
    assert np.abs(out - ref).max() <= 1e-14 * np.abs(ref).max()
    got, want = bwd(d, cache), R.self_attention_backward(d, ref_cache)
    scale = max(np.abs(g).max() for g in want.values())
    assert set(got) == set(want) and all(np.abs(got[n] - want[n]).max() <= 1e-13 * scale for n in want)


def test_every_bug_is_caught_by_some_check(table):
    for m in table.values():
        assert any(m.caught(c) for c in gallery.CHECKS), m.bug.key


def test_swapped_transpose_hides_from_a_unit_check_with_all_ones_only(table):
    for key in ("scores_swapped_dq", "scores_swapped_dk"):
        m = table[key, "attention_scores_backward"]
        assert m.errors["unit · ones"] <= 1e-15 and m.caught("unit · random") and m.caught("module · ones")


def test_unweighted_mean_softmax_hides_from_all_ones_in_a_unit_check_only(table):
    m = table["softmax_mean", "softmax_backward"]
    assert not m.caught("unit · ones") and m.caught("unit · random") and m.caught("module · ones")
    assert table["softmax_diagonal", "softmax_backward"].caught("unit · ones")


def test_reshape_only_split_passes_finite_differences_but_not_the_reference(table):
    for key, fn in [("split_heads_reshape", "split_heads_forward"), ("merge_heads_reshape", "merge_heads_forward")]:
        m = table[key, fn]
        assert not m.caught("unit · FD") and not m.caught("module · FD")
        assert m.caught("unit · random") and m.caught("module · random")


def test_mask_leak_is_hidden_by_the_module_and_caught_by_the_unit_check(table):
    m = table["mask_leak", "apply_mask_backward"]
    assert m.caught("unit · random") and not m.caught("module · random") and not m.caught("module · FD")


def test_notebook_10s_table_lists_the_bugs_it_was_written_for_and_every_one_on_request():
    shown, every = gallery.gallery_bugs(), gallery.gallery_bugs(every=True)
    assert not {id(b) for b in shown} & {id(b) for b in bugs.EXTRA}
    listed = {(b.key, b.pair) for b in bugs.EXTRA if b.pair != "scaled_dot_product_attention"}  # one row a pair
    assert listed and listed <= {(b.key, b.pair) for b in every}
