"""masks: helpers in our convention (True = may attend) and converters at the edges."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import MultiHeadAttention, masks


def test_padding_mask_from_lengths_and_from_hf_attention_mask_agree():
    m = masks.padding_mask(np.array([3, 1, 4]))
    assert m.shape == (3, 1, 1, 4) and m.dtype == bool
    np.testing.assert_array_equal(m[:, 0, 0], [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    hf = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(masks.padding_mask(attention_mask=hf), m)
    np.testing.assert_array_equal(masks.from_hf_attention_mask(hf), m)
    np.testing.assert_array_equal(masks.to_hf_attention_mask(m), hf)
    assert masks.padding_mask(np.array([2]), max_len=5).shape == (1, 1, 1, 5)


def test_causal_mask_top_left_and_bottom_right():
    np.testing.assert_array_equal(masks.causal_mask(3), np.tril(np.ones((3, 3), bool)))
    m = masks.causal_mask(2, 4)
    np.testing.assert_array_equal(m, [[1, 0, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(masks.causal_mask(2, 4, diagonal=2), [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_combine_bool_is_and_and_float_is_sum():
    pad = masks.padding_mask(np.array([3, 2]))
    causal = masks.causal_mask(3)
    both = masks.combine_masks(pad, None, causal)
    assert both.shape == (2, 1, 3, 3) and both.dtype == bool
    np.testing.assert_array_equal(both, pad & causal)
    bias = np.full((3, 3), 0.5)
    mixed = masks.combine_masks(pad, bias)
    assert mixed.dtype == np.float64
    np.testing.assert_array_equal(np.isneginf(mixed), np.broadcast_to(~pad, mixed.shape))
    assert np.all(mixed[np.isfinite(mixed)] == 0.5)
    assert masks.combine_masks(None, None) is None


def test_bool_and_additive_forms_give_the_same_attention():
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(8, 2, rng=0)
    x = rng.standard_normal((2, 4, 8))
    m = masks.combine_masks(masks.padding_mask(np.array([4, 2])), masks.causal_mask(4))
    out_b, c_b = mha.forward(x, x, x, mask=m)
    out_f, c_f = mha.forward(x, x, x, mask=masks.to_additive(m))
    np.testing.assert_array_equal(out_b, out_f)
    np.testing.assert_array_equal(c_b.attn_weights, c_f.attn_weights)


def test_torch_mha_conventions_are_inverted():
    kpm_torch = np.array([[False, False, True], [False, True, True]])  # torch: True = ignore
    ours = masks.from_torch_key_padding_mask(kpm_torch)
    np.testing.assert_array_equal(ours, masks.padding_mask(np.array([2, 1]), 3))
    np.testing.assert_array_equal(masks.to_torch_key_padding_mask(ours), kpm_torch)
    float_kpm = np.array([[0.0, -np.inf, 0.0]])
    np.testing.assert_array_equal(masks.from_torch_key_padding_mask(float_kpm)[0, 0, 0], float_kpm[0])

    am_torch = np.triu(np.ones((3, 3), bool), k=1)  # torch's causal attn_mask: True above the diagonal = ignore
    np.testing.assert_array_equal(masks.from_torch_attn_mask(am_torch), masks.causal_mask(3))
    np.testing.assert_array_equal(masks.to_torch_attn_mask(masks.causal_mask(3)), am_torch)
    per_head = np.random.default_rng(1).random((2 * 3, 4, 5)) < 0.5  # (B*H, Lq, Lk)
    back = masks.from_torch_attn_mask(per_head, num_heads=3)
    assert back.shape == (2, 3, 4, 5)
    np.testing.assert_array_equal(masks.to_torch_attn_mask(back, batch_size=2, num_heads=3), per_head)


def test_sdpa_convention_is_ours():
    m = masks.causal_mask(3)
    np.testing.assert_array_equal(masks.to_sdpa_mask(m), m)
    np.testing.assert_array_equal(masks.from_sdpa_mask(m), m)
    assert masks.to_sdpa_mask(m) is not m  # a copy, never a view the caller could mutate


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: masks.padding_mask(), "exactly one"),
        (lambda: masks.padding_mask(np.array([[1, 0]])), "lengths must be a 1-D integer"),
        (lambda: masks.padding_mask(attention_mask=np.array([1, 0])), r"\(B, Lk\)"),
        (lambda: masks.padding_mask(attention_mask=np.array([[2, 0]])), "only 0 and 1"),
        (lambda: masks.padding_mask(np.array([5]), max_len=3), "max_len"),
        (lambda: masks.causal_mask(0, 3), "positive"),
        (lambda: masks.from_torch_attn_mask(np.ones((6, 2, 2), bool)), "num_heads"),
        (lambda: masks.from_torch_key_padding_mask(np.ones(3, bool)), r"\(B, Lk\)"),
        (lambda: masks.to_hf_attention_mask(np.ones((2, 3), bool)), r"\(B, 1, 1, Lk\)"),
        (lambda: masks.padding_mask(np.array([2]), max_len=-1), "max_len"),
        (lambda: masks.padding_mask([], max_len=2.5), "max_len"),
        (lambda: masks.combine_masks(np.array([[1, 0]])), r"masks\[0\].*int64"),
        (lambda: masks.combine_masks(None, masks.causal_mask(2), np.array([[1, 0], [1, 1]])), r"masks\[2\]"),
        (lambda: masks.combine_masks(np.zeros((2, 3)), np.zeros((2, 4))), "do not broadcast"),
        (lambda: masks.to_additive(np.array([[1, 0]], dtype=np.int8)), "mask must be bool"),
    ],
)
def test_bad_mask_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_integer_masks_are_refused_not_turned_into_a_bias_or_int64_min():
    """Issue 11, defect 9: an int 0/1 mask became a +1 bias (alone) or INT64_MIN (with a bool mask)."""
    hf_style = np.array([[1, 1, 0]])
    for call in (
        lambda: masks.combine_masks(hf_style),
        lambda: masks.combine_masks(masks.padding_mask(np.array([2]), 3), hf_style),
        lambda: masks.combine_masks(np.zeros((1, 3)), hf_style),
        lambda: masks.to_additive(hf_style),
    ):
        with pytest.raises(ValueError, match="padding_mask\\(attention_mask=...\\)"):
            call()
    # the explicit conversions the message names give what was meant
    np.testing.assert_array_equal(masks.padding_mask(attention_mask=hf_style)[0, 0, 0], [True, True, False])
    np.testing.assert_array_equal(masks.combine_masks(hf_style.astype(bool)), [[True, True, False]])


def test_combining_finite_minimum_masks_saturates_to_blocked_without_a_warning():
    hf = masks.to_hf_extended_mask(np.array([[True, False]]))  # 0, finfo.min
    with np.errstate(all="raise"):
        both = masks.combine_masks(hf, hf)
    assert both[0, 0] == 0 and both[0, 1] == -np.inf


def test_an_empty_batch_has_a_defined_padding_mask():
    """Issue 11, defect 5: padding_mask([]) failed inside NumPy. B = 0 is an empty batch: (0, 1, 1, Lk)."""
    assert masks.padding_mask([]).shape == (0, 1, 1, 0)
    m = masks.padding_mask([], max_len=5)
    assert m.shape == (0, 1, 1, 5) and m.dtype == bool
    assert masks.padding_mask(np.array([], dtype=np.int32), 3).shape == (0, 1, 1, 3)
    assert masks.padding_mask(attention_mask=np.zeros((0, 4), dtype=np.int64)).shape == (0, 1, 1, 4)
    assert masks.padding_mask(np.array([0, 2])).shape == (2, 1, 1, 2)  # a length 0 is a fully masked sequence


def _window_reference(Lq, Lk, window, causal, offset):
    """The rule of sliding_window_mask's docstring, entry by entry in Python ints."""
    out = np.zeros((Lq, Lk), bool)
    for i in range(Lq):
        for j in range(Lk):
            delta = i + offset - j
            out[i, j] = 0 <= delta < window if causal else abs(delta) < window
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_and_causal_masks_follow_their_rule_for_every_offset_even_huge_ones(causal):
    """Reliability 4: an offset beyond the keys overflowed (OverflowError); it is clamped where nothing changes."""
    for Lq, Lk, window in ((3, 3, 2), (2, 5, 1), (4, 2, 3), (1, 1, 1)):
        for offset in (*range(-Lq - window - 2, Lk + window + 3), -(10**20), 10**20, np.int8(-3), np.uint64(2)):
            got = masks.sliding_window_mask(Lq, Lk, window, causal=causal, offset=offset)
            np.testing.assert_array_equal(got, _window_reference(Lq, Lk, window, causal, int(offset)))
            if causal:
                np.testing.assert_array_equal(
                    masks.causal_mask(Lq, Lk, diagonal=offset), _window_reference(Lq, Lk, 10**30, True, int(offset))
                )


NOT_AN_INT = [1.5, 2.0, np.float64(2.0), "1", None, [2], np.array([2]), True, False, np.True_, float("nan")]


@pytest.mark.parametrize("bad", NOT_AN_INT, ids=repr)
def test_every_integer_argument_of_masks_refuses_floats_strings_and_bools_naming_it(bad):
    """Reliability 4: offset=1.5 was accepted and query i then saw key i + 1 (the future) under causal=True;
    offset="1", causal_mask(2.5), True as a length gave TypeErrors from NumPy. Each is now a ValueError that
    names the argument (None is the default of Lk, max_len, num_heads and batch_size, so it is left out there)."""
    bool3 = np.ones((4, 2, 2), bool)
    calls = {
        "Lq": [lambda v: masks.causal_mask(v), lambda v: masks.sliding_window_mask(v, 3, 2)],
        "Lk": [lambda v: masks.causal_mask(3, v), lambda v: masks.sliding_window_mask(3, v, 2)],
        "diagonal": [lambda v: masks.causal_mask(3, 3, v)],
        "window": [lambda v: masks.sliding_window_mask(3, 3, v)],
        "offset": [lambda v: masks.sliding_window_mask(3, 3, 2, offset=v)],
        "max_len": [lambda v: masks.padding_mask([1, 2], max_len=v)],
        "num_heads": [
            lambda v: masks.from_torch_attn_mask(bool3, num_heads=v),
            lambda v: masks.to_torch_attn_mask(bool3[None], batch_size=1, num_heads=v),
        ],
        "batch_size": [lambda v: masks.to_torch_attn_mask(bool3[None], batch_size=v, num_heads=4)],
    }
    for name, fns in calls.items():
        if bad is None and name in ("Lk", "max_len", "num_heads", "batch_size"):
            continue
        for fn in fns:
            with pytest.raises(ValueError, match=rf"^{name} must be"):
                fn(bad)


def test_causal_must_be_a_bool_and_sizes_positive_and_numpy_integers_are_accepted():
    for bad in (1, 0, 1.5, "yes", None):
        with pytest.raises(ValueError, match="^causal must be True or False"):
            masks.sliding_window_mask(3, 3, 2, causal=bad)
    for call in (
        lambda: masks.causal_mask(-2),
        lambda: masks.sliding_window_mask(3, 0, 2),
        lambda: masks.sliding_window_mask(3, 3, -1),
        lambda: masks.from_torch_attn_mask(np.ones((4, 2, 2), bool), num_heads=0),  # was ZeroDivisionError
        lambda: masks.to_torch_attn_mask(np.ones((1, 1, 2, 2), bool), batch_size=2, num_heads=-1),
    ):
        with pytest.raises(ValueError, match="must be a positive int"):
            call()
    n = np.int32(3)
    np.testing.assert_array_equal(masks.causal_mask(n, np.int64(4), np.int16(1)), masks.causal_mask(3, 4, 1))
    np.testing.assert_array_equal(
        masks.sliding_window_mask(n, n, np.uint8(2), causal=np.bool_(False), offset=np.int64(-1)),
        masks.sliding_window_mask(3, 3, 2, causal=False, offset=-1),
    )
    np.testing.assert_array_equal(masks.padding_mask([1, 2], max_len=np.int64(3)), masks.padding_mask([1, 2], 3))
    assert masks.from_torch_attn_mask(np.ones((4, 2, 2), bool), num_heads=np.int8(2)).shape == (2, 2, 2, 2)
    assert masks.to_torch_attn_mask(np.ones((2, 1, 2, 2), bool), np.int64(2), np.int64(3)).shape == (6, 2, 2)


def test_converters_refuse_integer_masks_ragged_lists_and_non_float_dtypes():
    """An int mask given to a torch converter was bit-inverted by ~ (1 -> -2); a ragged list raised NumPy's
    error; dtype=1.5 or dtype=int a TypeError or an integer "-inf"."""
    as_int = np.array([[0, 1, 1]])
    for fn in (
        masks.from_torch_key_padding_mask,
        masks.to_torch_key_padding_mask,
        masks.from_torch_attn_mask,
        masks.to_torch_attn_mask,
        masks.from_sdpa_mask,
        masks.to_sdpa_mask,
    ):
        with pytest.raises(ValueError, match="must be bool .* or floating"):
            fn(as_int)
    ragged = [[True, False], [True]]
    for call, name in (
        (lambda: masks.combine_masks(ragged), r"masks\[0\]"),
        (lambda: masks.to_additive(ragged), "mask"),
        (lambda: masks.padding_mask(ragged), "lengths"),
        (lambda: masks.padding_mask(attention_mask=[[1, 0], [1]]), "attention_mask"),
        (lambda: masks.from_hf_extended_mask([[0.0], [0.0, 1.0]]), "extended_mask"),
        (lambda: masks.from_sdpa_mask(ragged), "attn_mask"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} is not a rectangular array"):
            call()
    m = masks.causal_mask(2)
    for dtype in (1.5, "1", True, np.int64, "int32", np.bool_, None, [2]):
        with pytest.raises(ValueError, match="^dtype must be one of float32, float64"):
            masks.to_additive(m, dtype)
    with pytest.raises(ValueError, match="^dtype must be one of float16, float32, float64"):
        masks.to_hf_extended_mask(m, np.int32)
    assert masks.to_additive(m, "float32").dtype == np.float32
    assert masks.to_hf_extended_mask(m, np.float16)[0, 1] == np.finfo(np.float16).min


def test_a_per_head_key_mask_reaches_torch_mha_as_the_exact_shape_it_accepts():
    """Issue 35: a per-head key mask (B, H, 1, Lk) became a (B*H, 1, Lk) attn_mask, which torch MHA refuses for
    Lq > 1. With query_len it is (B*H, Lq, Lk) and torch's weights and outputs are ours; without, a size-1 query
    (or key) axis cannot tell torch's length: a ValueError names the argument to pass."""
    torch = require_torch()
    from mha_numpy import interop  # noqa: PLC0415 - torch's side, only where torch is

    B, H, Lq, Lk, E = 2, 3, 4, 5, 12
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(E, H, rng=0)
    q, kv = rng.standard_normal((B, Lq, E)), rng.standard_normal((B, Lk, E))
    per_head = rng.random((B, H, 1, Lk)) < 0.6
    per_head[..., 0] = True  # no fully masked row: torch's need_weights path gives NaN there
    for mask in (per_head, np.where(per_head, rng.normal(0, 1, per_head.shape), -np.inf)):
        kpm, am = interop.mask_to_torch_mha(mask, B, H, query_len=Lq)
        assert kpm is None and tuple(am.shape) == (B * H, Lq, Lk)
        out, cache = mha.forward(q, kv, kv, mask=mask)
        theirs, weights = interop.to_torch_mha(mha)(
            torch.from_numpy(q), torch.from_numpy(kv), torch.from_numpy(kv), attn_mask=am, average_attn_weights=False
        )
        np.testing.assert_allclose(weights.detach().numpy(), cache.attn_weights, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(theirs.detach().numpy(), out, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="pass query_len"):
        interop.mask_to_torch_mha(per_head, B, H)  # was (B*H, 1, Lk): torch's error came only at the call
    with pytest.raises(ValueError, match="pass key_len"):
        interop.mask_to_torch_mha(np.ones((Lq, 1), bool), B, H, query_len=Lq)  # was (Lq, 1)
    assert interop.mask_to_torch_mha(per_head[:, :1], B, H)[0].shape == (B, Lk)  # a key padding mask: no Lq needed
