"""The useful FLOPs of every benchmarked workload: one function per workload, the same count for ours and for the
other side of a row (torch, transformers, a peer), so that the two shares of the GEMM peak in a row compare times.

What is counted: 2·m·k·n for each (m × k) @ (k × n) product the model defines (a multiply and an add per term).
Not counted: softmax, exp, masking, scaling, norms, GELU/SiLU, biases, embeddings (lookups), and any work a kernel
adds on its own (the chunked backward recomputes Q Kᵀ: it pays for that in time and gets no FLOPs for it).
The backward of a product Y = A B is two products of its size, dA = dY Bᵀ and dB = Aᵀ dY; every workload here
needs both (the input's gradient and the weights'), so a forward + backward is 3 × its forward.
A mask counts the allowed (query, key) pairs only: the attention core's products over the entries that may attend
(causal: L(L+1)/2 of the L²; a window; the real tokens of a padded batch), whatever a kernel computes and drops.
"""

from __future__ import annotations


def attention_core(B: int, H: int, d: int, entries: float, backward: bool, dv: int | None = None) -> float:
    """Q Kᵀ and P V over ``entries`` allowed (query, key) pairs per (batch item, head); q, k: d wide, v: dv.

    forward:  S = Q Kᵀ  2·d per entry,  O = P V  2·dv per entry           = 2·B·H·(d + dv)·entries
    backward: dP = dO Vᵀ, dV = Pᵀ dO (2·dv each), dQ = dS K, dK = dSᵀ Q (2·d each) = 2 × forward
    """
    dv = d if dv is None else dv
    forward = 2.0 * B * H * (d + dv) * entries
    return 3.0 * forward if backward else forward


def projections(tokens: float, E: int, H: int, backward: bool, kv_heads: int | None = None) -> float:
    """The four projections of multi-head attention on ``tokens`` rows of width E, head size d = E / H:
    Q (E × H·d), K and V (E × Hkv·d each; Hkv = H unless grouped), output (H·d × E): 2·tokens·in·out each;
    backward 2 × forward (dx and dW of each)."""
    d, kv = E // H, H if kv_heads is None else kv_heads
    forward = 2.0 * tokens * E * (2 * H * d + 2 * kv * d)
    return 3.0 * forward if backward else forward


def causal_entries(L: int) -> int:
    """Allowed (query, key) pairs of an (L, L) causal mask: L(L+1)/2."""
    return L * (L + 1) // 2


def window_entries(L: int, window: int) -> int:
    """Allowed pairs of an (L, L) causal sliding window (query i sees keys i - window < j <= i): Σᵢ min(i+1, w)."""
    w = min(window, L)
    return w * (w + 1) // 2 + (L - w) * w


def self_attention(B: int, L: int, E: int, H: int, backward: bool, entries: float | None = None,
                   kv_heads: int | None = None) -> float:  # fmt: skip
    """``MultiHeadAttention`` on x (B, L, E): the four projections and the core over ``entries`` allowed pairs per
    (batch item, head) (default L², no mask). Unmasked and not grouped:

        forward = 8·B·L·E² + 4·B·L²·E,   forward + backward = 3 × forward
    """
    entries = L * L if entries is None else entries
    return projections(B * L, E, H, backward, kv_heads) + attention_core(B, H, E // H, entries, backward)


def bert(lengths, hidden: int, intermediate: int, layers: int, backward: bool) -> float:
    """A BERT encoder on sentences of ``lengths`` real tokens each (padding excluded: the padding mask).

    Per layer and real token: Q, K, V and the output projection 4 · 2·E², the feed-forward 2 · 2·E·F; per layer
    and sentence of n tokens the core over its n² real pairs, 4·n²·E. Not counted: embeddings, LayerNorm, GELU,
    and transformers' pooler (one E × E product on [CLS], which our model does not have). forward + backward =
    3 × forward (the gradient of every weight and of the input, down to the embeddings).
    """
    lengths = [int(n) for n in lengths]
    per_layer = sum(2.0 * n * (4 * hidden * hidden + 2 * hidden * intermediate) + 4.0 * n * n * hidden
                    for n in lengths)  # fmt: skip
    forward = layers * per_layer
    return 3.0 * forward if backward else forward


def llama_step(batch: int, tokens: int, keys_before: int, hidden_size: int, num_hidden_layers: int,
               num_attention_heads: int, num_key_value_heads: int, intermediate_size: int, vocab_size: int,
               **_) -> float:  # fmt: skip
    """One forward call of a Llama decoder with a KV cache: ``tokens`` new positions per sequence after
    ``keys_before`` cached ones, logits of the last position only (what greedy decoding uses).

    Per layer and new token: the projections (Q, O: E × E; K, V: E × Hkv·d), the MLP (gate, up, down: 3 · 2·E·F);
    per layer and sequence the core over the new rows' allowed keys (causal: row i sees keys_before + i + 1);
    per sequence the LM head on its last position, 2·E·V. Keyword names are LlamaConfig's.
    """
    E, H, F = hidden_size, num_attention_heads, intermediate_size
    entries = tokens * keys_before + causal_entries(tokens)  # allowed pairs of the new rows, per (sequence, head)
    mlp = 3 * 2.0 * batch * tokens * E * F
    per_layer = projections(batch * tokens, E, H, False, num_key_value_heads) + mlp
    per_layer += attention_core(batch, H, E // H, entries, False)
    return num_hidden_layers * per_layer + 2.0 * batch * E * vocab_size


def greedy_decoding(config: dict, batch: int, prompt: int, new: int) -> float:
    """Greedy generation of ``new`` tokens after a ``prompt``: one prefill call of ``prompt`` tokens (which gives
    the first new token) and ``new - 1`` calls of one token each (``llama_step``; ``config``: LlamaConfig fields)."""
    total = llama_step(batch, prompt, 0, **config)
    return total + sum(llama_step(batch, 1, prompt + s, **config) for s in range(new - 1))


def kv_decoding(N: int, E: int, H: int, kv_heads: int | None = None) -> float:
    """Self-attention decoding N tokens one at a time with a KV cache: step t projects one token and attends to
    t + 1 keys (``self_attention`` at L = 1 with t + 1 entries). Recomputing the causal prefix instead does the
    same useful work (and much more)."""
    return sum(self_attention(1, 1, E, H, False, entries=t + 1, kv_heads=kv_heads) for t in range(N))


def ring_per_rank(L: int, H: int, d: int, P: int, backward: bool, causal: bool = True, B: int = 1) -> float:
    """Ring attention's core (no projections) over P ranks, per rank: the allowed pairs divided by P (zigzag
    shards give every rank the same share of a causal mask; contiguous shards without a mask, L²/P each)."""
    entries = causal_entries(L) if causal else L * L
    return attention_core(B, H, d, entries / P, backward)


def gated_delta_chunked(B: int, H: int, L: int, dk: int, dv: int, C: int, backward: bool) -> float:
    """The gated delta rule by chunks of C tokens (``recurrent.delta_chunked``, transformers'
    ``torch_chunk_gated_delta_rule``: the same products), per chunk and head, N = ⌈L / C⌉ chunks:

    C3, C5  A = (β ⊙ K) Kᵀ, P = Q Kᵀ                   2·C²·dk each
    C4      U = T (β ⊙ V), Kc = T (β e^γ ⊙ K)          two unit-triangular solves, C²·dv + C²·dk
    S1–S3   Kc S, Q̃ S, K̃ᵀ W (2·C·dk·dv each), P W (2·C²·dv)
    backward 2 × forward. Forming T itself (C³/3) is not counted: transformers never forms it.
    """
    N = -(-L // C)
    forward = B * H * N * (4.0 * C * C * dk + C * C * (dk + dv) + 6.0 * C * dk * dv + 2.0 * C * C * dv)
    return 3.0 * forward if backward else forward
