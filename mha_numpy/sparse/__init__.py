"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2) by hand: the lightning indexer, top-k selection, attention over the
selected keys only, and the indexer's training loss, each a forward/backward pair (docs/derivation.md, § 32).

    indexer.py           the indexer's queries, keys, weights and scores I = Σ_h w_h · relu(q_h · k · scale)
    topk.py              topk_select (ties by index, masked keys never) and TopKSelection, the selection as a mask
    sparse_attention.py  attention over the selected keys (gathered, O(L · k)) and SparseKernel
    indexer_loss.py      KL(main attention's distribution ‖ softmax(I)), dense warm-up or over the selected keys
    dsa.py               DeepSeekSparseAttention: MLA with the indexer's selection, as DeepseekV32Attention wires it
"""

from .dsa import DeepSeekSparseAttention, DSACache
from .indexer import IndexerConfig, indexer_backward, indexer_forward, indexer_topk
from .indexer_loss import indexer_loss_backward, indexer_loss_forward, indexer_target
from .sparse_attention import SparseKernel, sparse_attention_backward, sparse_attention_forward
from .topk import TopKSelection, topk_select

__all__ = ["DeepSeekSparseAttention", "DSACache", "IndexerConfig", "indexer_forward", "indexer_backward"]
__all__ += ["indexer_topk", "indexer_target", "indexer_loss_forward", "indexer_loss_backward", "SparseKernel"]
__all__ += ["sparse_attention_forward", "sparse_attention_backward", "TopKSelection", "topk_select"]
