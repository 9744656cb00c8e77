"""Llama 4's layers and Gemma 3's (issue 38, items 3 and 4): chunked attention (``masks.chunked_causal_mask``),
the attention temperature of long contexts (``log_length_scale``), the weightless QK-norm (``qk_norm_weight=False``),
NoPE layers, and the importers ``interop.llama4`` and ``interop.gemma3``.

Expected numbers come from transformers (tiny local configs, float64, eager), torch autograd, or central
differences; never from our own output.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy import kernels, masks

KERNELS = {
    "vectorized": "vectorized",
    "naive": "naive",
    "chunked": kernels.get_kernel("chunked", block_size=2, num_threads=2),
    "auto": "auto",
}


@pytest.fixture
def torch():
    t = require_torch()
    t.set_num_threads(1)
    return t


@pytest.fixture
def transformers(torch):
    return pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -r requirements-dev.txt"
    )


# --------------------------------------------------------------------------- chunked attention: the mask


def test_the_chunked_mask_equals_transformers_create_chunked_causal_mask(transformers, torch):
    """Left and right padding (the chunks counted from each item's first real token), chunk 3 of 9 positions."""
    from transformers import Llama4TextConfig
    from transformers.masking_utils import create_chunked_causal_mask

    cfg = Llama4TextConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4, vocab_size=8,
                           attention_chunk_size=3, attn_implementation="eager")  # fmt: skip
    am = np.array([[1] * 9, [0, 0] + [1] * 7, [1] * 7 + [0, 0], [0] * 5 + [1] * 4])
    x = torch.zeros(4, 9, 8, dtype=torch.float64)
    theirs = create_chunked_causal_mask(config=cfg, inputs_embeds=x, attention_mask=torch.tensor(am), cache=None)
    theirs = theirs.numpy() == 0  # (4, 1, 9, 9) additive 0 / finfo.min -> allowed
    left = np.array([0, 2, 0, 5])  # transformers' left_padding_tokens: the leading zeros of each row
    pad = masks.padding_mask(attention_mask=am)
    ours = masks.chunked_causal_mask(9, chunk_size=3, left_padding=left, structured=True) & pad
    np.testing.assert_array_equal(np.asarray(ours), theirs)
    np.testing.assert_array_equal(masks.chunked_causal_mask(9, chunk_size=3, left_padding=left) & pad, theirs)
    mod = masks.chunked_causal_mod(3, left)
    b, q, kv = np.arange(4)[:, None, None, None], np.arange(9)[:, None], np.arange(9)[None, :]
    np.testing.assert_array_equal(mod(b, 0, q, kv) & pad, theirs)
    assert theirs[0, 0, 3, :3].sum() == 0 and theirs[1, 0, 4, 2:5].all() and not theirs[1, 0, 5, 4]  # chunks cut


def test_the_chunked_mask_after_a_cache_is_the_bottom_right_rows():
    full = masks.chunked_causal_mask(11, chunk_size=4)
    for Lq in (1, 3):
        part = masks.chunked_causal_mask(Lq, 11, chunk_size=4, align="bottom-right", structured=True)
        np.testing.assert_array_equal(np.asarray(part)[0, 0], full[11 - Lq :])


def test_the_chunked_kernel_skips_the_tiles_outside_the_chunks(rng):
    """L = 48, chunks of 8, tiles of 4: the rule visits the tiles of the chunks' triangles (and the array the same
    ones), far fewer than a causal mask's; the numbers equal the dense mask's on the vectorized kernel."""
    L = 48
    q, k, v = (rng.standard_normal((2, 2, L, 3)) for _ in range(3))
    rule = masks.chunked_causal_mask(L, chunk_size=8, structured=True)
    kern = kernels.ChunkedKernel(block_size=4, num_threads=1)
    ctx, cache = kern.forward(q, k, v, mask=rule)
    ref = kernels.get_kernel("vectorized").forward(q, k, v, mask=np.asarray(rule))[0]
    assert np.abs(ctx - ref).max() <= 1e-14 * np.abs(ref).max()
    work = {key for key, (state, _) in cache.tile_states.items() if state != masks.EMPTY}
    causal = kern.forward(q, k, v, mask=masks.causal_mask(L, structured=True))[1]
    assert len(work) == 6 * 3  # the rule is shared by the batch: 6 chunks of 2 x 2 tiles, 3 on or under the diagonal
    assert len(work) < 0.3 * sum(state != masks.EMPTY for state, _ in causal.tile_states.values())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(Lq=4, chunk_size=0), "chunk_size must be"),
        (dict(Lq=4, chunk_size=2, left_padding=-1), "left_padding must"),
        (dict(Lq=4, chunk_size=2, left_padding=[1, -2]), "left_padding must hold non-negative ints"),
        (dict(Lq=5, Lk=3, chunk_size=2), "Lq=5 queries at positions 0 ... 4 go past the Lk=3 keys"),
    ],
)
def test_bad_chunked_masks_are_refused_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        masks.chunked_causal_mask(**kwargs)
