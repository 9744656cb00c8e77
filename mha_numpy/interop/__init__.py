"""PyTorch and Hugging Face interop: weight import/export, mask conversion, and cross-checks.

torch and transformers are imported lazily, inside the functions that need them: ``import mha_numpy``
(and even ``import mha_numpy.interop``, or its old name ``mha_numpy.torch_compat``) works without them,
and a call that needs one raises an ``ImportError`` naming the missing package.

The name maps (which torch tensor holds which of our parameters) are plain data, so they can be read,
documented and tested without torch (``torch_mha_name_map``, ``HF_BERT_NAME_MAP``, ``params_from_state``).
For torch.nn.MultiheadAttention with E = embed_dim:

===========  ==================================  ====================  ===============================
ours         torch MHA, packed (kdim = vdim = E)  torch MHA, separate   HF BertAttention
===========  ==================================  ====================  ===============================
W_q (E, E)   in_proj_weight[0:E]                 q_proj_weight         self.query.weight
W_k (E, kd)  in_proj_weight[E:2E]                k_proj_weight         self.key.weight
W_v (E, vd)  in_proj_weight[2E:3E]               v_proj_weight         self.value.weight
b_q, b_k,    in_proj_bias[0:E], [E:2E], [2E:3E]  (same, packed bias)   self.query.bias, ...
b_v (E,)
W_o (E, E)   out_proj.weight                     out_proj.weight       output.dense.weight
b_o (E,)     out_proj.bias                       out_proj.bias         output.dense.bias
===========  ==================================  ====================  ===============================

The cross-checks (``crosscheck_torch_mha``, ``crosscheck_sdpa``, ``crosscheck_hf_bert_attention``) run the
same weights and inputs through both frameworks and return a ``CrosscheckReport`` that prints as a table:
the output, the attention weights, the intermediates Q, K, V, scores and context, and the gradient of a
random upstream gradient with respect to every input and every parameter. See docs/crosscheck.md.

One job a file: ``names`` (the name maps, plain data), ``convert`` (weights in and out), ``tensor_masks``
(mask converters for tensors), ``report`` (``CrosscheckReport``), ``harness`` (the one cross-check harness: a check
declares its rows, ``Row``, and each side's values; ``compare`` is the one comparison loop), one file per model
(``torch_mha``, ``sdpa``, ``hf_bert``, ...: how to build it, its name map, how to call each side, its rows) and
``_lazy`` (torch and transformers imported on first use).
Today's variants: ``gqa`` (grouped-query attention vs SDPA's ``enable_gqa``), ``llama`` (the importer
``from_hf_llama_attention``, RoPE + GQA vs ``LlamaAttention``, the KV cache vs its ``DynamicCache``), ``gemma2``
(soft-capped scores, sliding layers: ``from_hf_gemma2_attention``, vs ``Gemma2Attention`` and its cache), ``qwen3``
(QK-norm: ``from_hf_qwen3_attention``, vs ``Qwen3Attention`` and its cache), which share ``decoder_attention``,
``deepseek_v3`` (``from_hf_deepseek_v3_attention``, multi-head latent attention vs ``DeepseekV3Attention``, the
latent cache vs its ``DynamicCache``), ``gpt_oss`` (``from_hf_gpt_oss_attention``, attention sinks with sliding
windows, GQA and RoPE vs ``GptOssAttention``), and ``diffllama``
(``from_hf_diffllama_attention``, differential attention vs ``DiffLlamaAttention`` and its cache).
``llama4``: Llama 4's RoPE and NoPE layers (``from_hf_llama4_attention``, ``llama4_layer_options``: chunked
attention, the L2 QK-norm, the attention temperature) vs ``Llama4TextAttention`` and its cache; ``gemma3``: Gemma
3's local and global layers with their two RoPE bases (``from_hf_gemma3_attention``, ``gemma3_layer_options``) vs
``Gemma3Attention`` and its cache; ``gemma3n``: Gemma 3n's cross-layer KV sharing and ``v_norm``
(``from_hf_gemma3n_attention``, a stack of layers vs ``Gemma3nTextAttention``: ``crosscheck_hf_gemma3n_layers``).
Whole models: ``bert_model`` (``crosscheck_bert_model``) and ``llama_model`` (``from_hf_llama_model``, the decoder
of ``models.decoder`` vs ``LlamaModel``, ``crosscheck_hf_llama_model``), and ``seq2seq`` (``crosscheck_seq2seq``, the
encoder–decoder of ``models.seq2seq`` vs ``torch.nn.Transformer``: logits, every gradient, the greedy decoding).
The recurrent family: ``gated_delta`` (transformers' gated delta rule and Kimi Delta Attention functions with the
float32 casts lifted, and ``torch_gated_delta_rule`` to run them on our (B, H, L, d) arrays, with autograd).
Sparse attention: ``deepseek_v32`` (``from_hf_deepseek_v32_attention``, DeepSeek Sparse Attention's lightning indexer
and MLA over its top-k keys vs ``DeepseekV32Attention``, float64 with its casts lifted or float32 as shipped).
"""

from __future__ import annotations

# first: a harness may `from mha_numpy.interop import CrosscheckReport`, so it is bound before they load
from .report import DEFAULT_RTOL, CrosscheckReport, CrosscheckRow

# isort: split
from .convert import from_hf_bert_attention, from_torch_mha, to_torch_mha
from .deepseek_v3 import (
    crosscheck_hf_deepseek_v3_attention,
    crosscheck_hf_deepseek_v3_cache,
    from_hf_deepseek_v3_attention,
    hf_deepseek_v3_attention,
)
from .deepseek_v32 import (
    HF_DEEPSEEK_V32_INDEXER_NAME_MAP,
    HF_DEEPSEEK_V32_MLA_NAME_MAP,
    crosscheck_hf_deepseek_v32_attention,
    from_hf_deepseek_v32_attention,
    hf_deepseek_v32_attention,
    selection_margin,
)
from .diffllama import (
    HF_DIFFLLAMA_NAME_MAP,
    crosscheck_hf_diffllama_attention,
    crosscheck_hf_diffllama_kv_cache,
    from_hf_diffllama_attention,
    hf_diffllama_attention,
)
from .gemma2 import (
    crosscheck_hf_gemma2_attention,
    crosscheck_hf_gemma2_kv_cache,
    from_hf_gemma2_attention,
    hf_gemma2_attention,
)
from .gemma3 import (
    crosscheck_hf_gemma3_attention,
    crosscheck_hf_gemma3_kv_cache,
    from_hf_gemma3_attention,
    gemma3_layer_options,
    hf_gemma3_attention,
)
from .gemma3n import crosscheck_hf_gemma3n_layers, from_hf_gemma3n_attention, gemma3n_kv_sources, hf_gemma3n_layers
from .gpt_oss import (
    HF_GPT_OSS_NAME_MAP,
    crosscheck_hf_gpt_oss_attention,
    crosscheck_hf_gpt_oss_kv_cache,
    from_hf_gpt_oss_attention,
    hf_gpt_oss_attention,
)
from .gqa import crosscheck_gqa_sdpa
from .hf_bert import crosscheck_hf_bert_attention
from .llama import (
    HF_LLAMA_NAME_MAP,
    crosscheck_hf_llama_attention,
    crosscheck_hf_llama_kv_cache,
    from_hf_llama_attention,
    hf_llama_attention,
)
from .llama4 import from_hf_llama4_attention, hf_llama4_attention, llama4_layer_mask, llama4_layer_options
from .llama4_check import crosscheck_hf_llama4_attention, crosscheck_hf_llama4_kv_cache
from .names import HF_BERT_NAME_MAP, NameMap, describe, params_from_state, torch_mha_name_map
from .qwen3 import (
    HF_QWEN3_NAME_MAP,
    crosscheck_hf_qwen3_attention,
    crosscheck_hf_qwen3_kv_cache,
    from_hf_qwen3_attention,
    hf_qwen3_attention,
)
from .sdpa import crosscheck_sdpa
from .tensor_masks import mask_from_hf, mask_from_sdpa, mask_from_torch_mha, mask_to_hf, mask_to_sdpa, mask_to_torch_mha
from .torch_mha import crosscheck_torch_mha

__all__ = [
    "HF_BERT_NAME_MAP",
    "NameMap",
    "torch_mha_name_map",
    "describe",
    "params_from_state",
    "from_torch_mha",
    "to_torch_mha",
    "from_hf_bert_attention",
    "mask_from_torch_mha",
    "mask_to_torch_mha",
    "mask_from_sdpa",
    "mask_to_sdpa",
    "mask_from_hf",
    "mask_to_hf",
    "DEFAULT_RTOL",
    "CrosscheckRow",
    "CrosscheckReport",
    "crosscheck_torch_mha",
    "crosscheck_sdpa",
    "crosscheck_hf_bert_attention",
    "HF_LLAMA_NAME_MAP",
    "from_hf_llama_attention",
    "hf_llama_attention",
    "crosscheck_gqa_sdpa",
    "crosscheck_hf_llama_attention",
    "crosscheck_hf_llama_kv_cache",
    "from_hf_deepseek_v3_attention",
    "hf_deepseek_v3_attention",
    "crosscheck_hf_deepseek_v3_attention",
    "crosscheck_hf_deepseek_v3_cache",
    "from_hf_gemma2_attention",
    "hf_gemma2_attention",
    "crosscheck_hf_gemma2_attention",
    "crosscheck_hf_gemma2_kv_cache",
    "HF_QWEN3_NAME_MAP",
    "from_hf_qwen3_attention",
    "hf_qwen3_attention",
    "crosscheck_hf_qwen3_attention",
    "crosscheck_hf_qwen3_kv_cache",
    "HF_GPT_OSS_NAME_MAP",
    "from_hf_gpt_oss_attention",
    "hf_gpt_oss_attention",
    "crosscheck_hf_gpt_oss_attention",
    "crosscheck_hf_gpt_oss_kv_cache",
    "HF_DIFFLLAMA_NAME_MAP",
    "from_hf_diffllama_attention",
    "hf_diffllama_attention",
    "crosscheck_hf_diffllama_attention",
    "crosscheck_hf_diffllama_kv_cache",
    "from_hf_llama4_attention",
    "hf_llama4_attention",
    "llama4_layer_options",
    "llama4_layer_mask",
    "crosscheck_hf_llama4_attention",
    "crosscheck_hf_llama4_kv_cache",
    "from_hf_gemma3_attention",
    "hf_gemma3_attention",
    "gemma3_layer_options",
    "crosscheck_hf_gemma3_attention",
    "crosscheck_hf_gemma3_kv_cache",
    "from_hf_gemma3n_attention",
    "hf_gemma3n_layers",
    "gemma3n_kv_sources",
    "crosscheck_hf_gemma3n_layers",
    "HF_DEEPSEEK_V32_MLA_NAME_MAP",
    "HF_DEEPSEEK_V32_INDEXER_NAME_MAP",
    "from_hf_deepseek_v32_attention",
    "hf_deepseek_v32_attention",
    "crosscheck_hf_deepseek_v32_attention",
    "selection_margin",
]
