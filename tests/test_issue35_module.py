"""Issue 35's smaller defects of the module's boundary: each a ValueError naming the argument, before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from mha_numpy import MultiHeadAttention


def test_describe_refuses_a_kv_cache_that_is_no_kind_of_cache():
    mha = MultiHeadAttention(8, 2)
    for kind in (True, "keys after RoPE", "keys before RoPE"):
        assert "AppendToCache" in mha.describe(kv_cache=kind)
    with pytest.raises(ValueError, match="kv_cache must be True, False"):
        mha.describe(kv_cache="garbage")


def test_block_size_assigned_after_construction_is_the_kernels_and_is_checked():
    mha = MultiHeadAttention(8, 2, impl="chunked", block_size=4)
    with pytest.raises(ValueError, match="block_size"):
        mha.block_size = 0  # it was accepted as a stray attribute that nothing read
    mha.block_size = 2
    assert mha.kernel.block_size == 2 and mha.block_size == 2
    plain = MultiHeadAttention(8, 2)
    plain.params = {n: p.copy() for n, p in mha.params.items()}
    x = np.random.default_rng(0).standard_normal((1, 5, 8))
    assert np.abs(mha(x)[0] - plain(x)[0]).max() <= 1e-13  # 2 x 2 tiles: the same numbers
    with pytest.raises(ValueError, match="num_threads"):
        mha.num_threads = -1
    with pytest.raises(ValueError, match="block_size is a setting of the chunked kernel"):
        MultiHeadAttention(8, 2).block_size = 64
