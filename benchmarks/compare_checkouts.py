"""Time the same forward+backward in two checkouts of mha_numpy, interleaved, and print the ratio.

    python benchmarks/compare_checkouts.py BEFORE_DIR AFTER_DIR [--rounds 3] [--case impl:B:L:E:H:dtype ...]

Each measurement runs in a fresh subprocess with PYTHONPATH set to one checkout; the two checkouts
alternate round by round, so a change of machine load hits both. The table gives each side's median
and the after/before ratio with its spread (min..max of the per-round ratios): judge a change by the
ratio, not by one noisy time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
import numpy as np
from mha_numpy import MultiHeadAttention
impl, B, L, E, H, dtype = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
mha = MultiHeadAttention(E, H, dtype=getattr(np, dtype), rng=0, impl=impl)
x = np.random.default_rng(0).standard_normal((B, L, E)).astype(dtype)
d = np.random.default_rng(1).standard_normal((B, L, E)).astype(dtype)
def once():
    t = time.perf_counter(); out, cache = mha.forward(x, x, x); mha.backward(d, cache); return time.perf_counter() - t
once()
print(json.dumps(min(once() for _ in range(2))))
"""


def measure(checkout: str, case: str) -> float:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    out = subprocess.run(  # cwd: python -c puts the current directory first on sys.path
        [sys.executable, "-c", CHILD, *case.split(":")],
        env=env,
        cwd=os.path.abspath(checkout),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{checkout} {case}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--case", nargs="+", default=["chunked:1:2048:768:12:float32", "chunked:1:16384:256:4:float32"])
    args = p.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    print("| case (impl:B:L:E:H:dtype) | before (ms) | after (ms) | after / before | spread |")
    print("| --- | --- | --- | --- | --- |")
    for case in args.case:
        before, after = [], []
        for r in range(args.rounds):
            first, second = (args.before, args.after) if r % 2 == 0 else (args.after, args.before)
            t = {first: measure(first, case), second: measure(second, case)}
            before.append(t[args.before])
            after.append(t[args.after])
        ratios = [a / b for a, b in zip(after, before)]
        print(
            f"| {case} | {1e3 * statistics.median(before):.0f} | {1e3 * statistics.median(after):.0f} | "
            f"{statistics.median(ratios):.2f} | {min(ratios):.2f}..{max(ratios):.2f} |",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
