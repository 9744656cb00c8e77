"""Models built on ``MultiHeadAttention`` and the non-attention pairs they need.

- ``layers``: embedding, residual add, softmax cross-entropy, LayerNorm, GELU, each a forward/backward pair.
- ``tiny``: ``TinyAttentionModel``, the one-layer model that ``mha_numpy.train`` trains.
- ``bert``: a pretrained BERT encoder (all-MiniLM-L6-v2) in NumPy.
"""
