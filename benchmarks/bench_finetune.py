"""The finetune demo's wall time from two checkouts, interleaved: the ratio B / A and its spread.

    python benchmarks/bench_finetune.py ../main . [--rounds 4] [--steps 60]

Each run is a fresh ``python -m mha_numpy finetune --steps N --seed 0`` in the side's checkout (PYTHONPATH = it),
imports, training, evaluations and figures included, as a user waits for it. The sides alternate round by round
(A B, B A, ...), so a change of machine load hits both; each round prints both times, the ratio and the load
average (judge the ratio, and only on a machine where no other job holds a core: docs/performance.md, "The
finetune demo"). Each run's last line (``RESULT: ... accuracy=...``) is printed too: both must say 1.0000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(root: Path, steps: int) -> tuple[float, str]:
    """One demo run from checkout ``root``: -> (wall seconds, its last line)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "mha_numpy", "finetune", "--steps", str(steps), "--seed", "0", "--out", out]
        start = time.perf_counter()
        r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{root}: finetune failed:\n{r.stderr}")
    return seconds, r.stdout.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="checkout A (e.g. ../main)")
    p.add_argument("b", type=Path, help="checkout B (e.g. .)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    ratios = []
    for i in range(args.rounds):
        load = os.getloadavg()[0]
        sides = [("A", args.a), ("B", args.b)] if i % 2 == 0 else [("B", args.b), ("A", args.a)]
        times, lines = {}, {}
        for name, root in sides:
            times[name], lines[name] = run(root.resolve(), args.steps)
        ratios.append(times["B"] / times["A"])
        print(f"round {i}: A {times['A']:6.2f} s  B {times['B']:6.2f} s  B/A {ratios[-1]:.3f}  "
              f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after", flush=True)  # fmt: skip
        print(f"  A: {lines['A']}\n  B: {lines['B']}", flush=True)
    print(f"median B/A {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
