"""Two checkouts or two settings, timed interleaved: the ratio and its spread (``bench_attention.py --compare``).

    python benchmarks/bench_attention.py --compare SIDE_A SIDE_B [--case B:L:E:H:dtype[:causal] ...] [--rounds 5]

A side is one of
    impl=chunked,block_size=256      a setting of this checkout (keyword arguments of MultiHeadAttention)
    ../main                          another checkout, impl=chunked
    ../main@impl=auto                another checkout with a setting
    torch                            torch.nn.MultiheadAttention(need_weights=False), the same threads

Every measurement is a fresh subprocess (run in the side's checkout, PYTHONPATH = it) that times self-attention
forward + backward (one warm-up, then the best of ``--repeats``); the two sides alternate round by round (A B,
B A, ...), so a change of machine load hits both. Per case the table gives each side's median, the median of the
per-round ratios B / A and their spread (min..max): judge a change by the ratio, not by one noisy time; and each
side's share of the GEMM peak measured in this process at the same thread count (``gemm_peak.py``), from the same
FLOPs for both (``flops.self_attention``; a causal case: the allowed L(L+1)/2 pairs only).
"""

from __future__ import annotations

import ast
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from flops import causal_entries, self_attention
from gemm_peak import gemm_peak, pct

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CASES = ["1:2048:768:12:float32", "8:128:768:12:float32", "32:64:384:12:float32"]

# The child: imports whichever mha_numpy its PYTHONPATH points at (never this file's checkout by sys.path).
CHILD = r"""
import json, sys, time
import numpy as np
spec = json.loads(sys.argv[1])
B, L, E, H, dtype = spec["B"], spec["L"], spec["E"], spec["H"], spec["dtype"]
rng = np.random.default_rng(0)
x, d = (rng.standard_normal((B, L, E)).astype(dtype) for _ in range(2))
if spec["torch"]:
    import torch
    torch.set_num_threads(spec["threads"])
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=getattr(torch, dtype))
    tx, td = torch.from_numpy(x).requires_grad_(), torch.from_numpy(d)
    tmask = torch.ones(L, L, dtype=torch.bool).triu(1) if spec["causal"] else None  # torch: True = ignore
    def once():
        tx.grad = None
        mha.zero_grad(set_to_none=True)
        mha(tx, tx, tx, attn_mask=tmask, need_weights=False, is_causal=spec["causal"])[0].backward(td)
else:
    from threadpoolctl import threadpool_limits
    threadpool_limits(spec["threads"], user_api="blas")
    from mha_numpy import MultiHeadAttention, masks
    mha = MultiHeadAttention(E, H, dtype=getattr(np, dtype), rng=0, **spec["kwargs"])
    mask = masks.causal_mask(L) if spec["causal"] else None
    def once():
        out, cache = mha.forward(x, x, x, mask=mask)
        mha.backward(d, cache)
once()
clock = time.process_time if spec["clock"] == "cpu" else time.perf_counter
times = []
for _ in range(spec["repeats"]):
    t0 = clock()
    once()
    times.append(clock() - t0)
print(json.dumps(min(times)))
"""


def setting_value(text: str):
    """A setting's value as Python reads it: 256 -> int, 30.0 -> float, True / False / None, else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_side(text: str) -> dict:
    """'DIR', 'DIR@k=v,...', 'k=v,...' or 'torch' -> dict(label, path, kwargs, torch)."""
    if text == "torch":
        return dict(label="torch-mha", path=ROOT, kwargs={}, torch=True)
    path, _, setting = text.rpartition("@") if "@" in text else ((text, "", "") if "=" not in text else ("", "", text))
    kwargs = {"impl": "chunked"}
    for item in filter(None, setting.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = setting_value(value)
    path = Path(path).resolve() if path else ROOT
    if not (path / "mha_numpy").is_dir():
        raise SystemExit(f"--compare: {text!r}: {path} is not a checkout of mha_numpy (no mha_numpy/ inside)")
    return dict(label=text, path=path, kwargs=kwargs, torch=False)


def parse_case(text: str) -> dict:
    """'B:L:E:H:dtype' or 'B:L:E:H:dtype:causal' -> dict."""
    parts = text.split(":")
    if len(parts) not in (5, 6) or (len(parts) == 6 and parts[5] != "causal"):
        raise SystemExit(f"--case {text!r}: expected B:L:E:H:dtype or B:L:E:H:dtype:causal")
    B, L, E, H = map(int, parts[:4])
    return dict(B=B, L=L, E=E, H=H, dtype=parts[4], causal=len(parts) == 6)


def measure(side: dict, case: dict, repeats: int, threads: int, clock: str = "wall") -> float:
    """Seconds of one forward + backward (best of ``repeats`` after a warm-up) in a fresh subprocess;
    ``clock="cpu"``: the process's CPU time (all its threads), steadier than wall time on a loaded machine
    but blind to how well the threads overlap."""
    spec = dict(case, kwargs=side["kwargs"], torch=side["torch"], repeats=repeats, threads=threads, clock=clock)
    env = dict(os.environ, PYTHONPATH=str(side["path"]))
    r = subprocess.run(  # cwd: python -c puts the current directory ahead of PYTHONPATH on sys.path
        [sys.executable, "-c", CHILD, json.dumps(spec)], env=env, cwd=side["path"], capture_output=True, text=True
    )
    if r.returncode != 0:
        raise SystemExit(f"{side['label']} on {case}: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(a: str, b: str, cases: list[str], rounds: int, repeats: int, threads: int, clock="wall") -> list[dict]:
    """Interleaved rounds per case; prints progress and a markdown table; -> one dict per case."""
    sides = [parse_side(a), parse_side(b)]
    print(f"A = {sides[0]['label']} {sides[0]['kwargs']}\nB = {sides[1]['label']} {sides[1]['kwargs']}")
    print(f"clock: {'CPU time of the process' if clock == 'cpu' else 'wall time'}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    results = []
    for text in cases:
        case, times = parse_case(text), ([], [])
        for r in range(rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                times[i].append(measure(sides[i], case, repeats, threads, clock))
            print(f"  {text} round {r + 1}/{rounds}: A {times[0][-1] * 1e3:8.1f} ms  B {times[1][-1] * 1e3:8.1f} ms  "
                  f"B/A {times[1][-1] / times[0][-1]:.3f}", flush=True)  # fmt: skip
        ratios = [tb / ta for ta, tb in zip(*times)]
        entries = causal_entries(case["L"]) if case["causal"] else None
        results.append(dict(case=text, a_ms=1e3 * statistics.median(times[0]), b_ms=1e3 * statistics.median(times[1]),
                            ratio=statistics.median(ratios), lo=min(ratios), hi=max(ratios),
                            flops=self_attention(case["B"], case["L"], case["E"], case["H"], True, entries),
                            peak=gemm_peak(case["dtype"], threads)))  # fmt: skip
    print("\n".join(compare_table(results)))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return results


def compare_table(results: list[dict]) -> list[str]:
    """The --compare table: both medians, the ratio and its spread, both sides' share of the GEMM peak."""
    lines = [""] + [f"% peak = FLOPs (flops.self_attention, the same for A and B) / median time / {p.line()}."
                    for p in dict.fromkeys(r["peak"] for r in results)]  # fmt: skip
    lines += ["", "| case (B:L:E:H:dtype) | A ms | B ms | B / A | spread (min..max) | A % peak | B % peak |",
              "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]  # fmt: skip
    lines += [f"| {r['case']} | {r['a_ms']:.1f} | {r['b_ms']:.1f} | {r['ratio']:.2f} | {r['lo']:.2f}..{r['hi']:.2f} | "
              f"{pct(r['flops'], r['a_ms'] / 1e3, r['peak'])} | {pct(r['flops'], r['b_ms'] / 1e3, r['peak'])} |"
              for r in results]  # fmt: skip
    return lines


def interleaved(fns: dict, rounds: int, repeats: int = 1, warm_up: bool = True) -> dict:
    """In-process version for the full run: {name: fn} timed round by round, rotating the order.

    -> {name: [seconds per round]} (each the best of ``repeats`` calls after one warm-up call; ``warm_up=False``
    when the caller has made that call itself).
    """
    for fn in fns.values() if warm_up else ():
        fn()
    out = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                fns[name]()
                best = min(best, time.perf_counter() - t0)
            out[name].append(best)
    return out


def ratio_spread(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Median, min and max of the per-round ratios num / den."""
    ratios = [a / b for a, b in zip(num, den)]
    return statistics.median(ratios), min(ratios), max(ratios)
