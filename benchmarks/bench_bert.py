"""The NumPy BERT against transformers.BertModel: all-MiniLM-L6-v2, sentences per second, same threads.

    python benchmarks/bench_bert.py                          # batch 32 × ~20 tokens and 4 × ~256 tokens, 2 threads
    python benchmarks/bench_bert.py --batch 16 --length 32 --threads 1 2 --dtype float32
    python benchmarks/bench_bert.py --batch 4 --length 16 --rounds 1     # a smoke run: seconds
    python benchmarks/bench_bert.py --allocator default      # glibc's thresholds left alone (see below)

Inference (``mha_numpy.bert.BertModel(ids, mask, types, output_attentions=False, output_hidden_states=False)``,
the last hidden state as transformers returns by default, against ``transformers.BertModel`` under
``torch.no_grad``, eager and sdpa attention) and forward + backward (``BertModel.forward`` + ``BertModel.backward``,
every parameter gradient, against ``last_hidden_state.backward`` with every parameter requiring a gradient, eval
mode). The same weights (transformers loads the same directory), the same sentences (tokenized with the model's
own tokenizer; padded to the longest), the same upstream gradient. NumPy's BLAS threads (threadpoolctl) and
``torch.set_num_threads`` are set to the same count. Before timing, the last hidden states must agree (1e-4
relative to the largest in float32). Ours and the two transformers variants run in interleaved rounds; the table
gives sentences per second and our time over each variant's (median of the per-round ratios, min..max), and both
sides' share of the GEMM peak measured in the same run (``gemm_peak.py``) from the same useful FLOPs
(``flops.bert``: every linear of every layer and the attention core over the real tokens, padding excluded).
By default the process keeps freed memory for the next arrays (``mha_numpy.allocator.keep_freed_memory``, as
the command line does; both sides share it): otherwise each fresh big array costs its page faults, ~19% of a
band here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_compare import interleaved, ratio_spread  # noqa: E402
from flops import bert  # noqa: E402
from gemm_peak import gemm_peak, pct, peak_lines  # noqa: E402

from mha_numpy.allocator import keep_freed_memory  # noqa: E402
from mha_numpy.bert import BertModel, default_model_dir  # noqa: E402

ALLOCATOR = {"keep": "freed memory kept for the next arrays (allocator.keep_freed_memory(), the whole process: both "
                     "sides; as `python -m mha_numpy` does)",
             "default": "glibc's default thresholds (a freed big block goes back to the kernel)"}  # fmt: skip


def add_allocator_argument(p) -> None:
    """``--allocator keep|default``, as this script and profile_bert.py take it."""
    p.add_argument("--allocator", choices=list(ALLOCATOR), default="keep",
                   help="keep: glibc keeps freed memory for the next arrays (allocator.keep_freed_memory), for the "
                        "whole process, as the command line does; default: glibc's own thresholds")  # fmt: skip


def use_allocator(choice: str) -> None:
    """Apply ``--allocator``: 'keep' calls keep_freed_memory() (a note if this C library has no mallopt)."""
    if choice == "keep" and not keep_freed_memory():
        print("note: this C library has no mallopt; the allocator is its default", file=sys.stderr)


WORDS = ("the attention layer weighs every token against every other token and sums the values it finds "
         "useful while the feed forward block transforms each position on its own").split()  # fmt: skip
BATCHES = [(32, 20), (4, 256)]  # (sentences, about this many tokens each)


def sentences(n: int, tokens: int) -> list[str]:
    """n different sentences of about ``tokens`` word pieces ([CLS] and [SEP] included)."""
    rng = np.random.default_rng(n * 1000 + tokens)
    return [" ".join(rng.choice(WORDS, size=tokens - 2 - int(rng.integers(0, 3)))) for _ in range(n)]


def run(batches=BATCHES, rounds: int = 3, threads: int = 2, dtype: str = "float32") -> list[dict]:
    import torch
    import transformers
    from threadpoolctl import threadpool_limits

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(threads)
    ours = BertModel.from_pretrained(dtype=np.dtype(dtype))
    theirs = {
        impl: transformers.BertModel.from_pretrained(
            str(default_model_dir()), attn_implementation=impl, dtype=getattr(torch, dtype)
        ).eval()
        for impl in ("eager", "sdpa")
    }
    with threadpool_limits(limits=threads, user_api="blas"):
        return _run(ours, theirs, torch, batches, rounds, threads)


def _run(ours, theirs, torch, batches, rounds, threads) -> list[dict]:
    modes = ["inference", "forward+backward"]
    rows = []
    for n, tokens in batches:
        inputs = ours.tokenize(sentences(n, tokens))
        feed = {k: torch.from_numpy(v) for k, v in inputs.as_dict().items()}
        ids, mask, types = inputs.input_ids, inputs.attention_mask, inputs.token_type_ids
        ref = ours(ids, mask, types).last_hidden_state  # (B, L, E)
        for impl, model in theirs.items():
            with torch.no_grad():
                err = np.abs(model(**feed).last_hidden_state.numpy() - ref).max() / np.abs(ref).max()
            print(f"  BERT {n} × {ids.shape[1]} tokens: transformers {impl} agrees with ours to {err:.1e}", flush=True)
            if err > 1e-4:
                raise SystemExit(f"transformers {impl} disagrees with the NumPy BERT ({err:.1e}): not timed")
        d = np.random.default_rng(0).standard_normal(ref.shape).astype(ours.dtype)
        lengths, c = np.asarray(mask).sum(axis=1), ours.config  # real tokens per sentence
        peak = gemm_peak(ours.dtype, threads)
        for mode in modes:
            fns = {"numpy": _ours(ours, ids, mask, types, d, mode)}
            fns.update({f"torch-{impl}": _theirs(torch, m, feed, d, mode) for impl, m in theirs.items()})
            t = interleaved(fns, rounds)
            for impl in theirs:
                ratio, lo, hi = ratio_spread(t["numpy"], t[f"torch-{impl}"])
                sps = {"ours_sps": n / min(t["numpy"]), "theirs_sps": n / min(t[f"torch-{impl}"])}
                fl = bert(lengths, c.hidden_size, c.intermediate_size, c.num_hidden_layers, mode != "inference")
                rows.append(dict(batch=n, tokens=ids.shape[1], threads=threads, mode=mode, vs=impl, ratio=ratio,
                                 lo=lo, hi=hi, **sps, ours_s=min(t["numpy"]), theirs_s=min(t[f"torch-{impl}"]),
                                 flops=fl, peak=peak))  # fmt: skip
                r = rows[-1]
                print(f"  BERT {n} × {r['tokens']} {mode}: numpy {r['ours_sps']:.1f} sentences/s, torch-{impl} "
                      f"{r['theirs_sps']:.1f}; time ratio {ratio:.2f}× [{lo:.2f}..{hi:.2f}]", flush=True)  # fmt: skip
    return rows


def _ours(model, ids, mask, types, d, mode):
    if mode == "inference":
        # the outputs transformers' call returns by default: the last hidden state (and its pooler), not every
        # layer's attention maps and hidden states, which ours keeps unless asked not to
        return lambda: model(ids, mask, types, output_attentions=False, output_hidden_states=False)

    def fwd_bwd():
        out, cache = model.forward(ids, mask, types)
        return model.backward(d, cache)

    return fwd_bwd


def _theirs(torch, model, feed, d, mode):
    if mode == "inference":

        def infer():
            with torch.no_grad():
                return model(**feed)

        return infer
    td = torch.from_numpy(d)

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        model(**feed).last_hidden_state.backward(td)

    return fwd_bwd


def table(rows: list[dict]) -> list[str]:
    """Sentences per second, the time ratio and both sides' share of the GEMM peak (the same ``flops.bert``)."""
    lines = peak_lines(rows, "flops.bert over the real tokens, the same for both sides")
    lines += ["| batch × tokens | threads | mode | numpy sentences/s | transformers | its sentences/s "
              "| numpy / its time | spread | numpy % peak | its % peak |",
              "| --- | ---: | --- | ---: | --- | ---: | ---: | --- | ---: | ---: |"]  # fmt: skip
    lines += [f"| {r['batch']} × {r['tokens']} | {r['threads']} | {r['mode']} | {r['ours_sps']:.1f} | {r['vs']} | "
              f"{r['theirs_sps']:.1f} | {r['ratio']:.2f}× | {r['lo']:.2f}..{r['hi']:.2f} | "
              f"{pct(r.get('flops'), r.get('ours_s'), r.get('peak'))} | "
              f"{pct(r.get('flops'), r.get('theirs_s'), r.get('peak'))} |" for r in rows]  # fmt: skip
    return lines


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        description="\n\n".join(__doc__.split("\n\n")[:2]), formatter_class=argparse.RawDescriptionHelpFormatter
    )  # the commands, unwrapped
    p.add_argument("--batch", type=int, default=None, help="one batch of this many sentences (with --length)")
    p.add_argument("--length", type=int, default=32, help="about this many tokens per sentence")
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    add_allocator_argument(p)
    args = p.parse_args(argv)
    use_allocator(args.allocator)
    print(f"allocator: {ALLOCATOR[args.allocator]}\n")
    batches = [(args.batch, args.length)] if args.batch else BATCHES
    rows = [r for threads in args.threads for r in run(batches, args.rounds, threads, args.dtype)]
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
