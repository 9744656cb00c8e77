"""Ring attention over P = 1, 2, 4, 8 MPI ranks on this machine: per-rank peak memory at a fixed L (it should fall
like 1/P), the bytes each rank sends against the formula, the time, and the float32 error against float64 as a
function of P for the two merge orders, sequential and tree (a benchmark, never a test).

    python benchmarks/bench_ring.py --quick          # L = 512, P = 1, 2, 4: seconds, into out/bench/
    python benchmarks/bench_ring.py --write-results  # L = 1024, P = 1, 2, 4, 8 (8 oversubscribed on 2 cores)
    python benchmarks/bench_ring.py --write-results --length 4096   # on a quiet machine

For each P it launches ``mpiexec -n P python benchmarks/bench_ring.py --worker ...`` once; the worker runs
``mha_numpy.distributed.experiment.run`` on every rank for:
- memory and time: float64, zigzag, causal, (1, H, L, d) with H = 4, d = 32: the tracemalloc peak each rank
  allocates in forward + backward beyond its inputs (max over ranks), the bytes it counted sending (max over ranks)
  against (3P - 2) · B · Hkv · L/P · 2d · itemsize, the forward and backward times (max over ranks), and the check
  against the single-process kernel (float64 error);
- the float32 error: contiguous shards, no mask, so every row merges exactly P partials, in the ``sequential``
  order (as the ring meets them) and in the ``tree`` order; the error of the context and of dq, dk, dv against the
  float64 single-process result (``experiment.max_relative_error``), the worst of ``--seeds`` seeds.
Writes ring_results.md, ring_results.csv and distributed_ring.png into ``--out`` (default out/bench/);
``--write-results`` writes the committed copies: benchmarks/ring_results.{md,csv} and docs/distributed_ring.png.
Timings on a loaded machine say little: the memory, the bytes and the errors do not depend on the load.
Share of the GEMM peak, per rank: the core's useful FLOPs of one rank (``flops.ring_per_rank``: forward +
backward over the causal pairs, divided by P, zigzag giving every rank the same share) over the slowest rank's
forward + backward time, divided by the float64 GEMM peak of ONE core measured in the same run (``gemm_peak.py``,
1 thread): on 2 cores a rank has one core at P = 2, both at P = 1, and less than one when oversubscribed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from flops import ring_per_rank  # noqa: E402
from gemm_peak import gemm_peak, pct  # noqa: E402

from mha_numpy.distributed import experiment  # noqa: E402


def worker(spec: dict) -> None:
    """Under mpiexec: every config of ``spec``, one after the other; rank 0 prints one JSON line each."""
    from mha_numpy.distributed.mpi import world

    comm = world()
    for config in spec["configs"]:
        result = experiment.run(comm, experiment.RingConfig(**config))
        if comm.Get_rank() == 0:
            print(json.dumps({"config": config, "result": result}), flush=True)


def configs(length: int, seeds: int) -> list[dict]:
    memory = experiment.RingConfig(length=length, heads=4, head_dim=32, layout="zigzag", causal=True)
    out = [asdict(memory)]
    for order in ("sequential", "tree"):
        for seed in range(seeds):
            error = replace(memory, layout="contiguous", causal=False, dtype="float32", order=order, seed=seed)
            out.append(asdict(error))
    return out


def launch(P: int, spec: dict) -> list[dict]:
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).with_name("mpiexec"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [mpiexec, "-n", str(P), sys.executable, __file__, "--worker", json.dumps(spec)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"mpiexec -n {P} failed:\n{r.stdout}\n{r.stderr}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def summarise(P: int, runs: list[dict]) -> dict:
    memory = runs[0]
    ranks = memory["result"]["ranks"]
    c = experiment.RingConfig(**memory["config"])
    row = {
        "P": P,
        "peak_MiB": max(r["peak_bytes"] for r in ranks) / 2**20,
        "bytes_sent": max(r["bytes_sent"] for r in ranks),
        "bytes_formula": c.bytes_formula(P),
        "forward_s": max(r["forward_s"] for r in ranks),
        "backward_s": max(r["backward_s"] for r in ranks),
        "float64_error": max(memory["result"]["errors"].values()),
        "flops_per_rank": ring_per_rank(c.length, c.heads, c.head_dim, P, True, c.causal, c.batch),
    }
    for order in ("sequential", "tree"):
        errs = [run["result"]["errors"] for run in runs[1:] if run["config"]["order"] == order]
        row[f"f32_context_{order}"] = max(e["context"] for e in errs)
        row[f"f32_grads_{order}"] = max(max(e["dq"], e["dk"], e["dv"]) for e in errs)
    return row


def write(rows: list[dict], out: Path, command: str, length: int, seeds: int, wall: float, load: tuple,
          peak=None) -> None:  # fmt: skip
    """ring_results.md, .csv and the plot; ``peak``: the ``gemm_peak.Peak`` of the shares (default: this run's
    float64 peak at one thread)."""
    peak = peak or gemm_peak("float64", 1)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "ring_results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    base = rows[0]["peak_MiB"]
    lines = [
        "# Ring attention over P MPI ranks",
        "",
        f"Made by `{command}` in "
        f"{wall:.0f} s on 2 cores (load average {load[0]:.2f} at start, {load[1]:.2f} at end; P = 8 oversubscribed). "
        f"Memory, bytes, time: (1, 4, {length}, 32) float64, zigzag shards, causal. float32 errors: contiguous, no "
        f"mask (every row merges P partials), the worst of {seeds} seeds, against the float64 single-process "
        "result, relative to the largest entry.",
        "",
        "% peak per rank = the core's FLOPs of one rank (flops.ring_per_rank: forward + backward over the causal "
        f"pairs / P) / (forward + backward s) / {peak.line()}.",
        "",
        "| P | peak per rank (MiB) | × P / peak(1) | bytes sent per rank | formula (3P-2) blocks | forward (s) | "
        "backward (s) | float64 error | f32 context, sequential | f32 context, tree | f32 dq/dk/dv, sequential "
        "| f32 dq/dk/dv, tree | % peak per rank |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['P']} | {r['peak_MiB']:.2f} | {r['peak_MiB'] * r['P'] / base:.2f} | {r['bytes_sent']:,} | "
            f"{r['bytes_formula']:,} | {r['forward_s']:.3f} | {r['backward_s']:.3f} | {r['float64_error']:.1e} | "
            f"{r['f32_context_sequential']:.2e} | {r['f32_context_tree']:.2e} | {r['f32_grads_sequential']:.2e} | "
            f"{r['f32_grads_tree']:.2e} | {pct(r['flops_per_rank'], r['forward_s'] + r['backward_s'], peak)} |"
        )
    (out / "ring_results.md").write_text("\n".join(lines) + "\n")
    plot(rows, out / "distributed_ring.png", length)


def plot(rows: list[dict], path: Path, length: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    P = [r["P"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.loglog(P, [r["peak_MiB"] for r in rows], "o-", base=2, label="measured (max over ranks)")
    a.loglog(P, [rows[0]["peak_MiB"] / p for p in P], "k--", base=2, label="peak(1) / P")
    a.set(xlabel="ranks P", ylabel="peak MiB per rank", title=f"memory per rank, L = {length} (float64, causal)")
    a.legend()
    for order, marker in (("sequential", "o-"), ("tree", "s--")):
        b.semilogx(P, [r[f"f32_context_{order}"] for r in rows], marker, base=2, label=f"context, {order}")
        b.semilogx(P, [r[f"f32_grads_{order}"] for r in rows], marker, base=2, alpha=0.5, label=f"dq/dk/dv, {order}")
    b.set(xlabel="ranks P", ylabel="max error / max entry", title="float32 ring vs float64, by merge order")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="L = 512, P = 1, 2, 4")
    p.add_argument("--write-results", action="store_true", help="write the committed copies")
    p.add_argument("--length", type=int, default=None)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    length = args.length or (512 if args.quick else 1024)
    ranks = (1, 2, 4) if args.quick else (1, 2, 4, 8)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    rows = []
    for P in ranks:
        rows.append(summarise(P, launch(P, {"configs": configs(length, args.seeds)})))
        print(rows[-1], flush=True)
    wall, load = time.perf_counter() - t0, (load0, os.getloadavg()[0])
    out = args.out
    command = " ".join(["python benchmarks/bench_ring.py", *sys.argv[1:]])
    write(rows, out, command, length, args.seeds, wall, load)
    if args.write_results:
        shutil.copy(out / "ring_results.md", ROOT / "benchmarks" / "ring_results.md")
        shutil.copy(out / "ring_results.csv", ROOT / "benchmarks" / "ring_results.csv")
        shutil.copy(out / "distributed_ring.png", ROOT / "docs" / "distributed_ring.png")
    print((out / "ring_results.md").read_text())


if __name__ == "__main__":
    main()
