"""``python -m mha_numpy crosscheck``: our numbers against PyTorch and Hugging Face, as tables.

For the example configuration (batch, lengths, E, H, kdim/vdim, bias, mask kind; see ``_config``) it runs,
in float64 and in float32: torch.nn.MultiheadAttention on both ``need_weights`` paths, torch's
scaled_dot_product_attention on the per-head Q, K, V (bool and float masks, ``is_causal``), and a
transformers BertAttention built from a small random BertConfig. With ``--variants`` also today's attention
(``mha_numpy.interop.gqa`` and ``.llama``): grouped-query attention against SDPA's ``enable_gqa``, RoPE + GQA against a
transformers LlamaAttention (outputs and every gradient) and the KV cache against its DynamicCache decoding.
Exits 1 on any mismatch, 2 when torch or transformers is missing or on a usage error.
"""

from __future__ import annotations

import argparse

import numpy as np

from .. import masks
from .._optional import require
from ._args import UsageError, positive_float, positive_int
from ._config import add_config_args, make_example, make_mask

DTYPES = {"float64": np.float64, "float32": np.float32}


def add_parser(sub) -> None:
    """Add the ``crosscheck`` command and its arguments to the subparsers ``sub``; it runs ``run``."""
    p = sub.add_parser(
        "crosscheck",
        help="compare outputs, attention weights, intermediates and every gradient with PyTorch and HF BERT",
        description="Run the same weights and inputs through mha_numpy and through torch.nn.MultiheadAttention "
        "(need_weights True and False), torch SDPA and a transformers BertAttention; print one table per check "
        "(max abs / rel error per quantity; pass: rel <= 1e-10 in float64, 1e-5 in float32). Exits 1 on a "
        "mismatch, 2 when torch or transformers is not installed.",
    )
    add_config_args(p)
    p.add_argument(
        "--model",
        choices=["mha", "bert"],
        default="mha",
        help="mha: the attention module on the example configuration (default); bert: the whole all-MiniLM-L6-v2, "
        "forward and every parameter gradient against transformers.BertModel + autograd on a padded batch of "
        "real sentences (pass: rel <= 1e-9 in float64, 1e-4 in float32)",
    )
    p.add_argument("--dtype", choices=["both", *DTYPES], default="both", help="precision(s) (default %(default)s)")
    g = p.add_argument_group("today's variants")
    g.add_argument(
        "--variants",
        action="store_true",
        help="also check grouped-query attention against torch SDPA (enable_gqa), RoPE + GQA against a transformers "
        "LlamaAttention, and the KV cache against its DynamicCache decoding",
    )
    g.add_argument(
        "--kv-heads", type=positive_int, default=None, help="key/value heads for --variants (default: heads // 2, or 1)"
    )
    g.add_argument(
        "--rope-theta", type=positive_float, default=10000.0, help="RoPE base for --variants (default %(default)s)"
    )
    p.set_defaults(run=run)


def _fully_masked_rows(mask, shape) -> int:
    """How many (b, h, query) rows of the scores have no key left."""
    if mask is None:
        return 0
    allowed = mask if mask.dtype == np.bool_ else ~np.isneginf(mask)
    return int((~np.broadcast_to(allowed, shape).any(axis=-1)).sum())


def _hf_mask(mask, B: int, L: int, dtype):
    """Our mask -> what BertAttention takes: HF's (B, L) 1 = keep, or a 4-D additive mask (finfo.min blocks)."""
    if mask is None:
        return None
    if mask.dtype == np.bool_ and mask.ndim == 4 and mask.shape[1:3] == (1, 1):
        return masks.to_hf_attention_mask(np.broadcast_to(mask, (B, 1, 1, L)))
    if mask.dtype == np.bool_:
        return masks.to_hf_extended_mask(np.broadcast_to(mask, (B, 1, L, L)), dtype)
    return np.maximum(np.broadcast_to(mask, (B, 1, L, L)), np.finfo(dtype).min).astype(dtype)


def _bert_attention(args, dtype):
    import torch
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertAttention

    cfg = BertConfig(
        hidden_size=args.embed_dim,
        num_attention_heads=args.heads,
        intermediate_size=2 * args.embed_dim,
        num_hidden_layers=1,
        vocab_size=16,
        attn_implementation="eager",
    )
    torch.manual_seed(args.seed)
    module = BertAttention(cfg).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)  # zero biases would hide bias bugs
    return module


def _kv_heads(args) -> int:
    """--kv-heads, or a grouping that shares heads: H // 2 for an even H, else 1 (multi-query)."""
    if args.kv_heads is not None:
        return args.kv_heads
    return args.heads // 2 if args.heads % 2 == 0 else 1


def _variants(args, dtype, mask, show) -> None:
    """GQA vs torch SDPA, RoPE + GQA vs LlamaAttention, the KV cache vs its DynamicCache (self-attention on Lq)."""
    from ..interop import gqa, llama

    rng = np.random.default_rng(args.seed)
    B, Lq, Lk, E, H, Hkv = args.batch, args.lq, args.lk, args.embed_dim, args.heads, _kv_heads(args)
    d = E // H
    q = rng.standard_normal((B, H, Lq, d)).astype(dtype)
    k, v = (rng.standard_normal((B, Hkv, Lk, d)).astype(dtype) for _ in range(2))
    show(gqa.crosscheck_gqa_sdpa(q, k, v, attn_mask=mask))
    module = llama.hf_llama_attention(E, H, Hkv, args.rope_theta, bias=not args.no_bias, dtype=dtype, seed=args.seed)
    x = rng.standard_normal((B, Lq, E)).astype(dtype)
    show(llama.crosscheck_hf_llama_attention(module, x))
    show(llama.crosscheck_hf_llama_kv_cache(module, x, prefill=max(1, Lq // 2)))


def _check_variant_args(args) -> None:
    """UsageError (one line, exit 2) for a --variants configuration that cannot run."""
    if not args.variants:
        return
    Hkv = _kv_heads(args)
    if args.heads % Hkv:
        raise UsageError(f"argument --kv-heads: {Hkv} does not divide --heads {args.heads}")
    if args.embed_dim % args.heads == 0 and (args.embed_dim // args.heads) % 2:
        raise UsageError(
            f"argument --variants: RoPE needs an even head dim, --embed-dim {args.embed_dim} / --heads {args.heads}"
        )
    if args.kdim not in (None, args.embed_dim) or args.vdim not in (None, args.embed_dim):
        raise UsageError("argument --variants: LlamaAttention is self-attention, leave --kdim and --vdim at E")


BERT_SENTENCES = [
    "The cat sat on the mat because it was tired.",
    "Hi.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "She gave him the book that he had asked for.",
]


def quiet_transformers() -> None:
    """No loading bar ("Loading weights: 100%|...") from transformers' from_pretrained in the command's output:
    the report is the output."""
    require("transformers", "crosscheck").utils.logging.disable_progress_bar()


def _run_bert(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers reads the local directory, never a hub
    quiet_transformers()
    from ..interop.bert_model import crosscheck_bert_model
    from ..models.bert import BertModel

    ok = True
    for dname in list(DTYPES) if args.dtype == "both" else [args.dtype]:
        try:
            model = BertModel.from_pretrained(dtype=DTYPES[dname])
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from None
        report = crosscheck_bert_model(model, model.tokenize(BERT_SENTENCES), rng=args.seed)
        print(report, end="\n\n")
        ok = ok and report.passed
    print("RESULT:", "every gradient of the NumPy BERT matches torch autograd" if ok else "MISMATCH")
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    """Compare the example (or BERT, ``--model bert``) with torch MHA, SDPA and HF BERT per dtype, print each report and
    a summary; 0 if all match, else 1.
    """
    _check_variant_args(args)
    torch = require("torch", "crosscheck")  # a missing one: one line naming the extra, exit 2
    require("transformers", "crosscheck")
    if args.model == "bert":
        return _run_bert(args)
    from .. import interop as tc

    torch.set_num_threads(1)  # tiny tensors: threads only add overhead

    summary: list[tuple[str, bool]] = []

    def show(report) -> None:
        print(report, end="\n\n")
        summary.append((f"{report.title} [{report.dtype.name}]", report.passed))

    dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    for dname in dtypes:
        dtype = DTYPES[dname]
        mha, query, key, value, mask = make_example(args, dtype)
        B, Lq, Lk, H = args.batch, args.lq, args.lk, args.heads
        print(f"===== {dname}: {mha}, B={B}, Lq={Lq}, Lk={Lk}, mask: {args.mask} =====\n")

        # torch.nn.MultiheadAttention, both code paths
        module = tc.to_torch_mha(mha)
        kpm, am = tc.mask_to_torch_mha(mask, B, H, Lq, Lk)  # the lengths: torch wants its masks' exact shapes
        n_full = _fully_masked_rows(mask, (B, H, Lq, Lk))
        for need_weights in (True, False):
            if need_weights and n_full:
                print(
                    f"torch.nn.MultiheadAttention (need_weights=True): not compared. {n_full} fully masked "
                    "(batch, head, query) rows: torch 2.13 gives NaN there on this path, we give 0 "
                    "(docs/crosscheck.md).\n"
                )
                continue
            show(tc.crosscheck_torch_mha(module, query, key, value, kpm, am, need_weights=need_weights))

        # SDPA on the per-head Q, K, V of the same example: the mask as given, its float form, is_causal
        _, cache = mha.forward(query, key, value, mask=mask)
        Q, K, V = cache.Q, cache.K, cache.V
        show(tc.crosscheck_sdpa(Q, K, V, attn_mask=mask))
        if mask is not None and mask.dtype == np.bool_:
            show(tc.crosscheck_sdpa(Q, K, V, attn_mask=masks.to_additive(mask, dtype)))
        show(tc.crosscheck_sdpa(Q, K, V, is_causal=True))

        # Hugging Face BertAttention: self-attention on the query, mask made for (Lq, Lq)
        bert = _bert_attention(args, dtype)
        self_mask = make_mask(args.mask, B, Lq, Lq, np.random.default_rng(args.seed), dtype)
        show(tc.crosscheck_hf_bert_attention(bert, query, attention_mask=_hf_mask(self_mask, B, Lq, dtype)))
        if args.variants:
            _variants(args, dtype, mask, show)

    print("SUMMARY")
    for title, ok in summary:
        print(f"  {'PASS' if ok else 'FAIL'}  {title}")
    ok = all(ok for _, ok in summary)
    print("\nRESULT:", "every quantity matches PyTorch and Hugging Face" if ok else "MISMATCH")
    return 0 if ok else 1
