"""Token-by-token greedy decoding with a KV cache: our ``DecoderModel`` against transformers' ``generate`` loop
(``LlamaForCausalLM``, ``DynamicCache``) from the same weights, float32, batch 1 and 8 (a benchmark, never a test).

Both sides run the same model: a random ``LlamaForCausalLM`` with tied embeddings (the LM head is the embedding
matrix), imported into ``DecoderModel`` by ``interop.llama_model.from_hf_llama_model``. A run is a prefill of
``--prompt`` tokens and then ``--new`` greedy tokens one at a time, each side with its own cache (our ``KVCache``
per layer; HF's ``DynamicCache``, which ``generate`` makes); tokens per second count the new tokens of the whole
batch over the whole run. Each round times both sides one after the other, alternating which goes first
(interleaved), with torch and BLAS on the same number of threads; reported: the median over the rounds, the
spread (min..max) of the per-round ratio, whether both sides generated the same tokens, and both sides' share of
the GEMM peak measured in the same run at the same threads (``gemm_peak.py``), from the same useful FLOPs
(``flops.greedy_decoding``: the prefill and every one-token step, each layer's products and the LM head on the last
position; decoding is small products and overhead, so these shares are small by nature).

    python benchmarks/bench_decode.py --quick          # one small config, 2 rounds: under a minute
    python benchmarks/bench_decode.py --write-results  # 2 configs x batch 1, 8; 5 rounds; --profile adds a profile

``--profile`` prints where our decoding step spends its time (cProfile, one thread, by function), to say what a
decode step is made of: small products and Python overhead, a different regime from the long-sequence kernel.
Writes decode_results.md and decode_results.csv into ``--out`` (default out/bench/); ``--write-results`` writes
the committed copies into benchmarks/.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from flops import greedy_decoding  # noqa: E402
from gemm_peak import gemm_peak, pct  # noqa: E402

from mha_numpy.kv_cache import KVCache  # noqa: E402

SCRATCH, COMMITTED = ROOT / "out" / "bench", ROOT / "benchmarks"
CONFIGS = {  # name -> LlamaConfig fields; "tiny" is all overhead, "small" a real (if small) model's products
    "tiny": dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=172,
    ),  # fmt: skip
    "small": dict(
        vocab_size=4096,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=1376,
    ),  # fmt: skip
}


def hf_model(config: dict, seed: int = 0):
    """A random float32 ``LlamaForCausalLM`` with tied embeddings, eval mode, eager attention."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(**config, tie_word_embeddings=True, attn_implementation="eager",
                                   initializer_range=0.05)  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def ours_generate(model, embed: np.ndarray, prompt: np.ndarray, new: int) -> np.ndarray:
    """Greedy decoding with one KVCache per layer: the prompt at once, then one token a call -> (B, new) ids."""
    caches = [KVCache() for _ in range(model.config.num_hidden_layers)]
    ids, out = prompt, []
    for _ in range(new):
        h = model(ids, kv_caches=caches).last_hidden_state[:, -1]  # (B, E), the last position's state
        ids = (h @ embed.T).argmax(axis=-1)[:, None]  # (B, E) @ (E, V) -> (B, V) logits; (B, 1) the next token
        out.append(ids)
    return np.concatenate(out, axis=1)  # (B, new)


def hf_generate(model, prompt, new: int) -> np.ndarray:
    """transformers' generate: greedy, its DynamicCache, exactly ``new`` tokens -> (B, new) ids."""
    import torch

    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                             pad_token_id=0, eos_token_id=None)  # fmt: skip
    return out[:, prompt.shape[1] :].numpy()


def measure(name: str, batch: int, args) -> dict:
    import torch
    from threadpoolctl import threadpool_limits

    from mha_numpy.interop.llama_model import from_hf_llama_model

    hf = hf_model(CONFIGS[name])
    ours = from_hf_llama_model(hf)  # the same weights, float32
    embed = ours.params["embed_tokens.weight"]
    prompt = np.random.default_rng(1).integers(1, CONFIGS[name]["vocab_size"], (batch, args.prompt))
    prompt_t = torch.from_numpy(prompt)
    torch.set_num_threads(args.threads)
    times = {"ours": [], "hf": []}
    with threadpool_limits(args.threads):
        same = np.array_equal(ours_generate(ours, embed, prompt, args.new), hf_generate(hf, prompt_t, args.new))
        for r in range(args.rounds):
            order = ("ours", "hf") if r % 2 == 0 else ("hf", "ours")
            for side in order:
                t0 = time.perf_counter()
                if side == "ours":
                    ours_generate(ours, embed, prompt, args.new)
                else:
                    hf_generate(hf, prompt_t, args.new)
                times[side].append(time.perf_counter() - t0)
    ratios = [o / h for o, h in zip(times["ours"], times["hf"])]  # > 1: we are slower
    tokens = batch * args.new
    row = dict(config=name, batch=batch, new=args.new, ours_tok_s=tokens / statistics.median(times["ours"]),
               hf_tok_s=tokens / statistics.median(times["hf"]), ratio=statistics.median(ratios),
               lo=min(ratios), hi=max(ratios), same_tokens=same, ours_s=statistics.median(times["ours"]),
               hf_s=statistics.median(times["hf"]), flops=greedy_decoding(CONFIGS[name], batch, args.prompt, args.new),
               peak_gflops=gemm_peak(np.float32, args.threads).gflops)  # fmt: skip
    print(f"{name:>5} B={batch}: ours {row['ours_tok_s']:8.1f} tok/s, HF generate {row['hf_tok_s']:8.1f} tok/s, "
          f"time ours/HF {row['ratio']:.2f}x [{row['lo']:.2f}..{row['hi']:.2f}], same tokens: {same}")  # fmt: skip
    if args.profile:
        profile(ours, embed, prompt, args.new)
    return row


def profile(model, embed, prompt, new: int) -> None:
    """Where our decoding spends its time: cProfile by function (total time), one thread."""
    from threadpoolctl import threadpool_limits

    pr = cProfile.Profile()
    with threadpool_limits(1):
        pr.enable()
        ours_generate(model, embed, prompt, new)
        pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(15)
    print(s.getvalue())


def write(rows: list[dict], out: Path, args, peak=None) -> None:
    """decode_results.md and .csv; ``peak``: the ``gemm_peak.Peak`` the rows' shares divide by (default: this
    run's float32 peak at ``args.threads``, measured by the first call)."""
    peak = peak or gemm_peak(np.float32, args.threads)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "decode_results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [
        f"Greedy decoding, float32, prompt {args.prompt} tokens, {args.new} new tokens, {args.threads} threads, "
        f"{args.rounds} interleaved rounds (median; the ratio's min..max over rounds). Load average "
        f"{args.load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.",
        "",
        "% peak = the useful FLOPs of the whole generation (flops.greedy_decoding, the same for both sides) / median "
        f"time / {peak.line()}.",
        "",
        "| config | batch | ours tok/s | HF generate tok/s | time ours / HF | same tokens | GFLOP per run "
        "| ours % peak | HF % peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['config']} | {r['batch']} | {r['ours_tok_s']:.1f} | {r['hf_tok_s']:.1f} | {r['ratio']:.2f}× "
        f"[{r['lo']:.2f}..{r['hi']:.2f}] | {'yes' if r['same_tokens'] else 'no'} | {r['flops'] / 1e9:.3g} | "
        f"{pct(r['flops'], r['ours_s'], peak)} | {pct(r['flops'], r['hf_s'], peak)} |"
        for r in rows
    ]
    (out / "decode_results.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'decode_results.md'}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the tiny config at batch 1, 2 rounds")
    p.add_argument("--write-results", action="store_true", help="write the committed copies into benchmarks/")
    p.add_argument("--out", type=Path, default=SCRATCH)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--profile", action="store_true", help="print where our decoding step spends its time")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.new = 2, 16
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    args.load_start = os.getloadavg()[0]
    cases = [("tiny", 1)] if args.quick else [(c, b) for c in CONFIGS for b in (1, 8)]
    rows = [measure(name, batch, args) for name, batch in cases]
    write(rows, COMMITTED if args.write_results else args.out, args)


if __name__ == "__main__":
    main()
