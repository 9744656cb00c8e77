"""``DeepSeekSparseAttention``: multi-head latent attention whose queries read only the keys the lightning indexer
selects, wired as Hugging Face's ``DeepseekV32Attention`` wires it:

    q_resid = rms_norm(x W_qaᵀ + b_qa)                      MLA's query latent, read by the indexer too
    index   = top-k of indexer(x, q_resid) under the mask   (B, L, k), no gradient (``indexer.indexer_topk``)
    output  = MLA(x) with the mask "j in S_i"               ``TopKSelection`` as the mask, ``SparseKernel`` as kernel

The hook is the kernel protocol, not a new step: ``MultiHeadLatentAttention`` runs with ``impl=SparseKernel()``
and ``mask=TopKSelection(index, L)``, so MLA's own steps (projections, norms, interleaved RoPE, expansion, merge,
output) and their backward are the ones every MLA call runs; the kernel gathers each query's k keys. The selection
is fixed in the backward: the indexer's parameters get no gradient from the attention (transformers runs its
indexer under ``no_grad``) and learn from ``indexer_loss`` instead.

Decoding (``forward(x_new, cache=DSACache())``): MLA's ``LatentCache`` keeps c_kv and the rope key, and beside it
the indexer's keys K (B, length, dI), after their norm and RoPE, as transformers' indexed cache keeps them; each
call's queries select among every cached key (causally within the call).
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import masks as M
from .._checks import as_float_array, as_int
from ..kv_cache import LatentCache
from ..latent import MultiHeadLatentAttention
from .indexer import IndexerConfig, indexer_keys_forward, indexer_queries_forward, indexer_topk
from .sparse_attention import SparseKernel
from .topk import QUERY_BLOCK, TopKSelection, check_selection_mask


class DSACache:
    """Decoding state of one ``DeepSeekSparseAttention``: ``latent`` (MLA's ``LatentCache``) and ``index_keys``
    (B, length, dI), the indexer's keys of every cached position (None while empty)."""

    def __init__(self) -> None:
        self.latent, self.index_keys = LatentCache(), None

    def __len__(self) -> int:
        return len(self.latent)

    @property
    def nbytes(self) -> int:
        """The latent cache's bytes and the indexer keys': B · length · (r + dr + dI) · itemsize."""
        return self.latent.nbytes + (0 if self.index_keys is None else self.index_keys.nbytes)


class DSACall:
    """A forward's cache: the ``selection`` (``TopKSelection``) and MLA's cache ``mla`` (``MHACache``)."""

    def __init__(self, selection: TopKSelection, mla) -> None:
        self.selection, self.mla = selection, mla


class DeepSeekSparseAttention:
    """DeepSeek-V3.2's attention: ``MultiHeadLatentAttention`` (``mla``, its parameters ``mla.params``) and the
    lightning indexer (``indexer``, an ``IndexerConfig``, its parameters ``indexer_params``), each query attending
    to the ``index_topk`` keys of highest indexer score among those the mask allows (all of them when fewer).

    Sizes as ``MultiHeadLatentAttention``'s, q_lora_rank required (the indexer reads the query latent);
    index_n_heads nI, index_head_dim dI (>= qk_rope_head_dim), index_topk k. Self-attention only, causal by
    default. ``forward(x, mask=None, positions=None, cache=None) -> (output, DSACall)``; ``backward(d_output,
    call) -> {"x", and every entry of mla.params}`` (the indexer's: none, see the module docstring). block_size:
    queries a block, for the selection (None: 256) and for ``SparseKernel`` (None: its own choice by what a block
    gathers).
    """

    def __init__(
        self, embed_dim: int, num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, qk_nope_head_dim: int,
        v_head_dim: int, q_lora_rank: int, index_n_heads: int, index_head_dim: int, index_topk: int,
        bias: bool = False, dtype=np.float64, rng=None, rope_theta: float = 10000.0, norm_eps: float = 1e-6,
        block_size: int | None = None,
    ) -> None:  # fmt: skip
        self.index_topk = as_int(index_topk, "index_topk", minimum=1)
        q_lora_rank = as_int(q_lora_rank, "q_lora_rank", minimum=1)  # the indexer's queries come from its latent
        rng = np.random.default_rng(rng)
        self.mla = MultiHeadLatentAttention(
            embed_dim, num_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
            q_lora_rank=q_lora_rank, bias=bias, dtype=dtype, rng=rng, impl=SparseKernel(block_size),
            rope_theta=rope_theta, norm_eps=norm_eps,
        )  # fmt: skip
        self.indexer = IndexerConfig(index_n_heads, index_head_dim, qk_rope_head_dim, rope_theta)
        self.indexer_params = self.indexer.init_params(embed_dim, q_lora_rank, rng, dtype)
        self.block_size = QUERY_BLOCK if block_size is None else as_int(block_size, "block_size", minimum=1)

    @property
    def dtype(self) -> np.dtype:
        return self.mla.dtype

    def query_latent(self, x: np.ndarray) -> np.ndarray:
        """q_resid (B, L, rq) = rms_norm(x W_qaᵀ + b_qa): MLA's query latent, which the indexer reads."""
        P = self.mla.params
        c_q, _ = F.linear_forward(x, P["W_qa"], P.get("b_qa"), check=False)  # (B, L, rq)
        return F.rms_norm_forward(c_q, P["q_a_norm"], self.mla.config.norm_eps, check=False)[0]

    def _check(self, x, positions):
        x = as_float_array(x, "x", ndim=3)
        E = self.mla.config.embed_dim
        if x.shape[2] != E or x.dtype != self.dtype:
            raise ValueError(f"x with shape {x.shape} and dtype {x.dtype} must be (B, L, {E}) {self.dtype}")
        self.indexer.check_params(self.indexer_params, E, self.mla.config.q_lora_rank, self.dtype)
        if positions is not None:
            F.check_positions(positions, *x.shape[:2])
        return x

    def select(self, x, mask=None, positions=None, cache: DSACache | None = None) -> TopKSelection:
        """The indexer's selection for the queries x (B, Lq, E) among every key (the cached ones first) ->
        ``TopKSelection`` (b, 1, Lq, Lk). mask: the keys allowed (default causal, bottom-right after a cache's
        keys). ``cache`` is read, not changed (``forward`` appends)."""
        return self._select(x, mask, positions, cache)[0]

    def _select(self, x, mask, positions, cache):
        """-> (the selection, the indexer's keys of every position (B, Lk, dI)); every argument checked first."""
        x = self._check(x, positions)
        (B, Lq, _), cached = x.shape, 0 if cache is None else len(cache)
        kept = None if cache is None else cache.index_keys
        if kept is not None and (kept.shape[0] != B or kept.dtype != x.dtype):
            raise ValueError(f"cache holds indexer keys {kept.shape} {kept.dtype}, x is {x.shape} {x.dtype}")
        Lk = cached + Lq
        if mask is None:
            mask = M.causal_mask(Lq, Lk, diagonal=Lk - Lq, structured=True)  # bottom-right: after the cache
        mask = check_selection_mask(mask, (B, Lq, Lk))
        pos = np.arange(cached, Lk) if positions is None else positions
        q_resid = self.query_latent(x)  # (B, Lq, rq)
        p = self.indexer_params
        (Q, w), _ = indexer_queries_forward(x, q_resid, p, self.indexer, pos, check=False)  # (B, nI, Lq, dI)
        K, _ = indexer_keys_forward(x, p, self.indexer, pos, check=False)  # (B, Lq, dI)
        K = K if kept is None else np.concatenate([kept, K], axis=1)  # (B, Lk, dI)
        index = indexer_topk(Q, w, K, self.index_topk, mask, self.block_size)  # (B, Lq, k)
        return TopKSelection(index, Lk), K

    def forward(self, x, mask=None, positions=None, cache: DSACache | None = None):
        """x (B, L, E) -> output (B, L, E), DSACall. mask: as ``select``'s; cache: a ``DSACache`` to decode with
        (forward only, as MLA's caches): the call's latents and indexer keys are appended to it."""
        if cache is not None and not isinstance(cache, DSACache):
            raise ValueError(f"cache must be a sparse.DSACache, got {type(cache).__name__}")
        if cache is not None and positions is not None:
            raise ValueError("positions: a cache gives the positions (its length, length + 1, ...)")
        selection, index_keys = self._select(x, mask, positions, cache)
        kv = None if cache is None else cache.latent
        out, mla_cache = self.mla.forward(x, mask=selection, positions=positions, kv_cache=kv)
        if cache is not None:
            cache.index_keys = index_keys  # after MLA's call: a refused call leaves both caches as they were
        return out, DSACall(selection, mla_cache)

    __call__ = forward

    def backward(self, d_output, call: DSACall) -> dict[str, np.ndarray]:
        """d_output (B, L, E) -> {"x": (B, L, E), W_qa, ..., W_o}: the selection fixed."""
        g = self.mla.backward(d_output, call.mla)
        g["x"] = g.pop("query") + g.pop("key") + g.pop("value")  # self-attention: x is all three
        return g
