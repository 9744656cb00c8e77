"""Forward + backward of the whole all-MiniLM-L6-v2: mha_numpy's hand-written backward vs torch autograd.

    python benchmarks/bench_bert.py                    # batch 16 x 32 tokens, float32, 1 and 2 threads
    python benchmarks/bench_bert.py --repeats 3 --threads 1

Both sides: the same weights (transformers loads the same directory), the same input ids (random word-piece ids,
no padding, so both do the full work), the same random upstream gradient of last_hidden_state, every parameter
gradient computed (mha_numpy: ``BertModel.backward``; torch: ``.backward`` with requires_grad on all parameters,
eager attention, eval mode). NumPy's BLAS threads (threadpoolctl) and torch.set_num_threads are set to the same
count. Each time is the median of ``--repeats`` runs after one warm-up. Prints a Markdown table (the section of
docs/performance.md "The whole BERT, forward + backward" shows a run); never a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mha_numpy.bert import BertModel, default_model_dir  # noqa: E402


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = p.parse_args()

    import torch
    import transformers
    from threadpoolctl import threadpool_limits

    transformers.utils.logging.disable_progress_bar()
    dtype = np.dtype(args.dtype)
    model = BertModel.from_pretrained(dtype=dtype)
    ref = transformers.BertModel.from_pretrained(
        str(default_model_dir()), attn_implementation="eager", dtype=getattr(torch, args.dtype)
    ).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, model.config.vocab_size, (args.batch, args.length))
    mask, types = np.ones_like(ids), np.zeros_like(ids)
    d = rng.standard_normal((args.batch, args.length, model.config.hidden_size)).astype(dtype)
    t_ids, t_mask, t_types, t_d = (torch.from_numpy(a) for a in (ids, mask, types, d))

    def ours_forward():
        return model.forward(ids, mask, types)

    def ours_both():
        out, cache = model.forward(ids, mask, types)
        model.backward(d, cache)

    def torch_forward():
        with torch.no_grad():
            ref(t_ids, t_mask, t_types)

    def torch_both():
        ref.zero_grad(set_to_none=True)
        ref(t_ids, t_mask, t_types).last_hidden_state.backward(t_d)

    print(f"all-MiniLM-L6-v2, batch {args.batch} x {args.length} tokens, {args.dtype}, median of {args.repeats}")
    print(f"numpy {np.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs\n")
    print("| threads | ours fwd (ms) | torch fwd, no_grad (ms) | ours fwd+bwd (ms) | torch fwd+bwd (ms) | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for threads in args.threads:
        torch.set_num_threads(threads)
        with threadpool_limits(limits=threads, user_api="blas"):
            row = [median_time(f, args.repeats) * 1e3 for f in (ours_forward, torch_forward, ours_both, torch_both)]
        print(f"| {threads} | {row[0]:.0f} | {row[1]:.0f} | {row[2]:.0f} | {row[3]:.0f} | {row[2] / row[3]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
