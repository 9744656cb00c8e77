"""Models built on ``MultiHeadAttention`` and the non-attention pairs they need.

- ``layers``: embedding, residual add, softmax cross-entropy, LayerNorm, RMSNorm, GELU, SiLU, SwiGLU, each a
  forward/backward pair.
- ``block``: ``Block``, the one Transformer block (pre/post norm, LayerNorm/RMSNorm, GELU MLP/SwiGLU, the attention
  passed in, checkpoint names as a table); the models below are configurations of it.
- ``tiny``: ``TinyAttentionModel``, the one-layer model that ``mha_numpy.train`` trains.
- ``bert``: a pretrained BERT encoder (all-MiniLM-L6-v2) in NumPy; ``bert_layer``: BERT's names for the block.
- ``decoder``: ``DecoderModel``, a Llama-style decoder (causal, RoPE, GQA, RMSNorm, SwiGLU) under LlamaModel's names.
- ``seq2seq``: ``Seq2SeqModel``, a tiny pre-norm encoder–decoder (``Block`` encoder layers, a ``DecoderLayer`` with
  cross-attention), greedy decoding with the KV cache, and the reversal task its cross-attention learns.
"""
