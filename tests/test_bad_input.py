"""Every bad input gets a ValueError naming the argument and the shapes, before any arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy import MultiHeadAttention
from mha_numpy import functional as F


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(embed_dim=10, num_heads=3), "embed_dim=10 is not divisible by num_heads=3"),
        (dict(embed_dim=8, num_heads=0), "num_heads must be a positive int"),
        (dict(embed_dim=8, num_heads=-2), "num_heads must be a positive int"),
        (dict(embed_dim=0, num_heads=1), "embed_dim must be a positive int"),
        (dict(embed_dim=8, num_heads=2, kdim=0), "kdim must be a positive int"),
        (dict(embed_dim=8, num_heads=2, dropout=1.0), r"dropout must be in \[0, 1\)"),
        (dict(embed_dim=8, num_heads=2, dropout=-0.1), r"dropout must be in \[0, 1\)"),
        (dict(embed_dim=8, num_heads=2, dtype=np.int32), "dtype must be np.float32 or np.float64"),
    ],
)
def test_constructor_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


MHA = MultiHeadAttention(8, 2, kdim=6, vdim=5, rng=0)
Q, K, V = np.zeros((2, 3, 8)), np.zeros((2, 4, 6)), np.zeros((2, 4, 5))


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros((2, 3, 7)), K, V), r"query with shape \(2, 3, 7\): last dim must be embed_dim=8"),
        ((Q, np.zeros((2, 4, 8)), V), r"key with shape \(2, 4, 8\): last dim must be kdim=6"),
        ((Q, K, np.zeros((2, 4, 8))), r"value with shape \(2, 4, 8\): last dim must be vdim=5"),
        ((np.zeros((3, 3, 8)), K, V), r"batch sizes differ: query \(3, 3, 8\), key \(2, 4, 6\)"),
        ((Q, K, np.zeros((2, 5, 5))), r"key and value lengths differ: key \(2, 4, 6\), value \(2, 5, 5\)"),
        ((np.zeros((3, 8)), K, V), r"query must have 3 dimensions, got shape \(3, 8\)"),
        ((np.zeros((1, 2, 3, 8)), K, V), r"query must have 3 dimensions, got shape \(1, 2, 3, 8\)"),
        ((np.zeros((2, 3, 8), dtype=np.int64), K, V), r"query must be a floating-point array .* shape \(2, 3, 8\)"),
        ((Q, K.astype(np.float32), V), r"key has dtype float32 \(shape \(2, 4, 6\)\) but the parameters are float64"),
        ((Q, K, [[["a"]]]), "value must be a floating-point array"),
    ],
)
def test_forward_rejects_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        MHA.forward(*args)


@pytest.mark.parametrize(
    "mask, match",
    [
        (np.ones((2, 2, 3, 5), bool), r"mask with shape \(2, 2, 3, 5\) does not broadcast"),
        (np.ones((4, 3), bool), r"mask with shape \(4, 3\) does not broadcast to .* \(2, 2, 3, 4\)"),
        (np.ones((3, 1, 3, 4), bool), r"mask with shape \(3, 1, 3, 4\) does not broadcast"),
        (np.ones((1, 1, 1, 3, 4), bool), r"mask with shape \(1, 1, 1, 3, 4\) does not broadcast"),
        (np.ones((3, 4), np.int64), r"mask must be boolean .* got dtype int64 with shape \(3, 4\)"),
    ],
)
def test_forward_rejects_bad_masks(mask, match):
    with pytest.raises(ValueError, match=match):
        MHA.forward(Q, K, V, mask=mask)


def test_backward_and_dropout_arguments_are_checked():
    out, cache = MHA.forward(Q, K, V)
    with pytest.raises(ValueError, match=r"d_output has shape \(2, 3, 7\) and dtype float64; expected \(2, 3, 8\)"):
        MHA.backward(np.zeros((2, 3, 7)), cache)
    with pytest.raises(ValueError, match="dropout_mask is only used with training=True"):
        MHA.forward(Q, K, V, dropout_mask=np.ones((2, 2, 3, 4), bool))
    with pytest.raises(ValueError, match=r"dropout_mask must be boolean with shape \(2, 2, 3, 4\)"):
        MultiHeadAttention(8, 2, kdim=6, vdim=5, dropout=0.5).forward(
            Q, K, V, training=True, dropout_mask=np.ones((2, 3, 4), bool)
        )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: F.linear_forward(np.zeros((2, 3)), np.zeros((4, 5))), r"x with shape \(2, 3\) does not match W"),
        (lambda: F.linear_forward(np.zeros((2, 5)), np.zeros((4, 5)), np.zeros(3)), r"b with shape \(3,\)"),
        (lambda: F.linear_forward(np.zeros((2, 5), int), np.zeros((4, 5))), "x must be a floating-point array"),
        (lambda: F.split_heads_forward(np.zeros((2, 3, 7)), 2), r"shape \(2, 3, 7\): last dim 7 is not divisible"),
        (lambda: F.split_heads_forward(np.zeros((3, 8)), 2), r"x must have 3 dimensions, got shape \(3, 8\)"),
        (lambda: F.merge_heads_forward(np.zeros((2, 3, 8))), r"x must have 4 dimensions"),
        (lambda: F.dropout_forward(np.zeros(3), 1.0), r"p must be in \[0, 1\)"),
        (lambda: F.dropout_forward(np.zeros(3), 0.5), "needs rng"),
        (
            lambda: F.scaled_dot_product_attention_forward(
                np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 5, 3)), np.zeros((1, 2, 5, 4))
            ),
            r"q and k must share the head dim d: got q \(1, 2, 3, 4\), k \(1, 2, 5, 3\)",
        ),
        (
            lambda: F.scaled_dot_product_attention_forward(
                np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 5, 4)), np.zeros((1, 2, 6, 4))
            ),
            r"k and v must have the same length Lk: got k \(1, 2, 5, 4\), v \(1, 2, 6, 4\)",
        ),
        (
            lambda: F.scaled_dot_product_attention_forward(
                np.zeros((1, 2, 3, 4)), np.zeros((2, 2, 5, 4)), np.zeros((2, 2, 5, 4))
            ),
            r"q, k, v must share \(B, H\)",
        ),
        (
            lambda: F.scaled_dot_product_attention_forward(
                np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 5, 4)), np.zeros((1, 2, 5, 4)), mask=np.ones((3, 4), bool)
            ),
            r"mask with shape \(3, 4\) does not broadcast .* \(1, 2, 3, 5\)",
        ),
        (
            lambda: F.scaled_dot_product_attention_forward(
                np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 2, 2)), dropout_p=1.5
            ),
            r"dropout_p must be in \[0, 1\)",
        ),
    ],
)
def test_functional_rejects(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_errors_come_before_any_arithmetic(monkeypatch):
    """A bad mask is refused before the first projection runs."""
    calls = []
    import mha_numpy.functional as func

    real = func.linear_forward
    monkeypatch.setattr(func, "linear_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(ValueError):
        MHA.forward(Q, K, V, mask=np.ones((5, 5), bool))
    assert calls == []


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: F.alibi_bias(2, 3, 3, offset=1.5), "offset must be an int"),
        (lambda: F.alibi_bias(2, 3, True), "Lk must be a non-negative int, got the bool True"),
        (lambda: F.alibi_bias(2, "1"), "Lq must be a non-negative int"),
        (lambda: F.alibi_slopes(2.0), "num_heads must be a positive int"),
        (lambda: F.relative_position_bias_forward(np.zeros((2, 5)), 1.5, 3), "Lq must be a non-negative int"),
        (lambda: F.rope_cos_sin([0, 1], "1", 10.0), "head_dim must be a positive int"),
        (lambda: F.rope_cos_sin([0, 1], 4, -1.0), "theta must be a finite number > 0"),
        (lambda: F.softmax_forward(np.arange(3)), "x must be a floating-point array"),
        (lambda: F.dropout_forward(np.zeros((2, 2)), 0.5, keep_mask=[[True], [True, False]]), "keep_mask is not"),
        (lambda: F.check_positions([[1], [1, 2]], 1, 2), "positions is not a rectangular array"),
    ],
)
def test_the_pairs_name_a_bad_size_offset_or_array(call, match):
    """The same class of defect as the masks' (a float offset, a bool size, a ragged list), in functional's pairs."""
    with pytest.raises(ValueError, match=match):
        call()


def test_the_kernel_of_a_module_is_checked_when_assigned():
    mha = MultiHeadAttention(8, 2, rng=0)
    mha.kernel = "chunked"
    assert mha.impl == "chunked" and type(mha.kernel).__name__ == "ChunkedKernel"
    mha.impl = "naive"
    assert mha.kernel.name == "naive"
    for bad in (None, "xyz", 3):
        with pytest.raises(ValueError, match="impl must be one of"):
            mha.kernel = bad
    assert mha.impl == "naive"  # unchanged by the refused assignments


def test_the_interop_converters_name_a_ragged_mask_and_refuse_an_int_dtype():
    pytest.importorskip("torch", reason="pip install -r requirements-dev.txt")
    from mha_numpy import interop

    with pytest.raises(ValueError, match="key_padding_mask is not a rectangular array"):
        interop.mask_from_torch_mha([[True], [True, False]])
    with pytest.raises(ValueError, match="dtype must be a floating dtype"):
        interop.mask_to_torch_mha(np.zeros((2, 3)), 1, 2, dtype=np.int32)  # -inf would become INT_MIN
