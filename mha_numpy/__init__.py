"""mha_numpy: multi-head attention (as in BERT) in pure NumPy, forward and hand-written backward.

Public names:
- ``MultiHeadAttention``: the module (``forward`` / ``backward``), PyTorch weight layout.
- ``functional``: every step as a ``NAME_forward`` / ``NAME_backward`` pair.
- ``masks``: mask helpers and converters (our convention: bool True = may attend, float = added).
- ``gradcheck``: finite-difference checks with a printable report.
- ``KVCache``: keys and values of earlier calls, for decoding one token at a time (``forward(..., kv_cache=)``);
  ``StreamingKVCache``: StreamingLLM's, sink tokens and a window, for decoding without end in bounded memory.
- ``MultiHeadLatentAttention``, ``LatentCache``: DeepSeek's multi-head latent attention and its latent KV cache.
torch is never imported here; only ``mha_numpy.interop`` (also ``mha_numpy.torch_compat``) uses it, lazily.
"""

from . import functional, gradcheck, masks
from .attention import MHACache, MultiHeadAttention
from .kv_cache import KVCache, LatentCache, StreamingKVCache
from .latent import MultiHeadLatentAttention

__all__ = ["MultiHeadAttention", "MHACache", "KVCache", "StreamingKVCache", "functional", "masks", "gradcheck"]
__all__ += ["MultiHeadLatentAttention", "LatentCache"]
__version__ = "0.3.0"
