"""Attention as a recurrence: a matrix-valued state S written token by token (a new family beside the softmax
kernels, docs/derivation.md § 30).

- ``gated_delta``: ``gated_delta_rule_forward`` / ``gated_delta_rule_backward`` (Gated DeltaNet as in Qwen3-Next;
  DeltaNet with g ≡ 0; Kimi Delta Attention with g per key channel) and ``gated_delta_rule_step`` (decoding).
- ``delta_rule``: the recurrent form (the definition) and its backward through time.
- ``delta_chunked``: the chunked form (the WY/UT representation within a chunk, the state carried across chunks)
  and its backward.
- ``linear``: causal linear attention with the elu+1 feature map, recurrent and chunked.
- ``decayed``: a chunk's products weighted by the decay between positions (one gate a head, or one a channel).
- ``ssd``: Mamba-2's SSD, the chunked scan, its (L, L) matrix form and ``ssd_step``; ``mamba2``: its layer.
- ``features``: the maps of q and k (l2norm, elu+1), each a pair. ``checks``: the family's argument checks.
"""

from .gated_delta import gated_delta_rule_backward, gated_delta_rule_forward, gated_delta_rule_step
from .linear import linear_attention_backward, linear_attention_forward
from .ssd import ssd_backward, ssd_forward, ssd_matrix_backward, ssd_matrix_forward, ssd_step

__all__ = ["gated_delta_rule_forward", "gated_delta_rule_backward", "gated_delta_rule_step"]
__all__ += ["linear_attention_forward", "linear_attention_backward"]
__all__ += ["ssd_forward", "ssd_backward", "ssd_matrix_forward", "ssd_matrix_backward", "ssd_step"]
