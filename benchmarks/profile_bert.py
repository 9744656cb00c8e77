"""Where the NumPy BERT's time goes: one band of sequences, BLAS on one thread, CPU time by step (a profile, never a
test).

    python benchmarks/profile_bert.py                       # 2 × ~256 and 16 × ~20 tokens (one band of the
                                                            # benchmark's 4 × 256 and 32 × 20 on two cores)
    python benchmarks/profile_bert.py --mode forward+backward --batch 8 --length 64
    python benchmarks/profile_bert.py --write-results       # benchmarks/bert_profile.md
    python benchmarks/profile_bert.py --allocator default   # glibc's thresholds left alone: the page faults

``BertModel.__call__`` runs a batch as bands of sequences, one per core, each with BLAS on one thread; one band on
one core is therefore what a call's time is made of. Each run is profiled with cProfile on the process's CPU time
(``time.process_time``, so a busy machine slows it less than wall time), after a warm-up, and every function's own
time is put in one row of the table by the step it computes: the products of the linear layers, q kᵀ and p v,
GELU (its erf), softmax, the mask, LayerNorm, the rest (Python, adds, reshapes). Page faults (``ru_minflt``: memory
touched for the first time) are counted per call too: each fresh page costs the kernel ~1 µs, which is why
``__call__`` frees a layer's arrays before the next layer makes its own. The inference run asks for the last hidden
state only (``output_attentions=False, output_hidden_states=False``), as transformers' call in bench_bert.py.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_bert import add_allocator_argument, sentences, use_allocator  # noqa: E402

from mha_numpy.bert import BertModel  # noqa: E402

BANDS = [(2, 256), (16, 20)]  # one band of bench_bert's (4, 256) and (32, 20) on two cores
# the step each function's own time belongs to, by function name (the rest is "other")
STEPS = {
    "linear layers (GEMM)": ("linear_forward", "linear_backward", "fused_linear_forward", "fused_linear_backward",
                             "matmul"),
    "q kᵀ and p v (batched GEMM)": ("attention_scores_forward", "attention_scores_backward",
                                    "attention_context_forward", "attention_context_backward"),
    "GELU (erf)": ("erf", "gelu_forward", "gelu_backward"),
    "softmax": ("softmax_forward", "softmax_backward"),
    "mask": ("apply_mask_forward", "apply_mask_backward", "isneginf"),
    "LayerNorm": ("layer_norm_forward", "layer_norm_backward"),
}  # fmt: skip


def step_of(function: str, filename: str) -> str:
    """The table row of a profiled function: by its name, or by its module for a helper module of a step."""
    for step, names in STEPS.items():
        if function in names:
            return step
    if Path(filename).stem in ("erf", "fast_erf", "erf32"):
        return "GELU (erf)"
    return "other (Python, adds, reshapes, checks)"


def profile(model: BertModel, batch: int, length: int, mode: str, repeats: int = 3) -> dict:
    """One band of ``batch`` sentences of ~``length`` tokens, ``repeats`` profiled calls -> seconds per step."""
    from threadpoolctl import threadpool_limits

    inputs = model.tokenize(sentences(batch, length))
    ids, mask, types = inputs.input_ids, inputs.attention_mask, inputs.token_type_ids
    d = np.random.default_rng(0).standard_normal((*ids.shape, model.config.hidden_size)).astype(model.dtype)

    def call():
        if mode == "inference":
            return model(ids, mask, types, num_threads=1, output_attentions=False, output_hidden_states=False)
        out, cache = model.forward(ids, mask, types)
        return model.backward(d, cache)

    with threadpool_limits(limits=1, user_api="blas"):
        call()  # warm-up
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.process_time()
        for _ in range(repeats):
            call()
        plain = (time.process_time() - start) / repeats
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / repeats
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        for _ in range(repeats):
            call()
        prof.disable()
    steps: dict[str, float] = dict.fromkeys([*STEPS, "other (Python, adds, reshapes, checks)"], 0.0)
    for (filename, _, function), (_, _, own, _, _) in pstats.Stats(prof).stats.items():
        steps[step_of(function, filename)] += own / repeats
    return dict(batch=batch, tokens=ids.shape[1], mode=mode, seconds=plain, faults=faults, steps=steps)


def table(runs: list[dict]) -> list[str]:
    """Markdown: one column per run, one row per step, each the share of the profiled time (ms in brackets)."""
    head = [f"{r['batch']} × {r['tokens']} {r['mode']}" for r in runs]
    lines = ["| step | " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(runs)]
    for step in runs[0]["steps"]:
        cells = [f"{100 * r['steps'][step] / sum(r['steps'].values()):.0f}% ({1e3 * r['steps'][step]:.0f} ms)"
                 for r in runs]  # fmt: skip
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    times = " | ".join(f"{1e3 * r['seconds']:.0f} ms" for r in runs)
    lines.append(f"| one call, unprofiled (CPU time) | {times} |")
    lines.append("| page faults per call | " + " | ".join(f"{r['faults']:.0f}" for r in runs) + " |")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, help="one band of this many sentences (with --length)")
    p.add_argument("--length", type=int, help="about this many tokens per sentence")
    p.add_argument("--mode", choices=["inference", "forward+backward", "both"], default="both")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--write-results", action="store_true", help="write benchmarks/bert_profile.md")
    add_allocator_argument(p)  # the page faults of 'default' are the table's last row
    args = p.parse_args(argv)
    if (args.batch is None) != (args.length is None):
        p.error("--batch and --length go together")
    use_allocator(args.allocator)
    bands = BANDS if args.batch is None else [(args.batch, args.length)]
    modes = ["inference", "forward+backward"] if args.mode == "both" else [args.mode]
    model = BertModel.from_pretrained(dtype=np.dtype(args.dtype))
    runs = [profile(model, b, n, mode) for b, n in bands for mode in modes]
    lines = table(runs)
    print("\n".join(lines))
    if args.write_results:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        text = [
            "# Where the NumPy BERT's time goes (`benchmarks/profile_bert.py --write-results`)",
            "",
            f"all-MiniLM-L6-v2, {args.dtype}, one band on one core (BLAS one thread), CPU time by step under cProfile "
            f"(own time of each function, mean of 3 calls after a warm-up), allocator {args.allocator!r} "
            f"(`--allocator`: 'keep' is `allocator.keep_freed_memory()`); load average at the end: {load}.",
            "",
            *lines,
            "",
        ]
        (ROOT / "benchmarks" / "bert_profile.md").write_text("\n".join(text), encoding="utf-8")
        print("wrote benchmarks/bert_profile.md")


if __name__ == "__main__":
    main()
