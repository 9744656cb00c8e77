"""Run ``mha_numpy verify`` on the real implementations and print the summary table of docs/verify.md.

    python scripts/measure_verify.py                      # the quick matrix, every implementation
    python scripts/measure_verify.py --cases full --only numpy,sdpa   # the full matrix, some of them

Each row: the implementation, how many cases passed / failed / were n/a, the worst passing case's error as a
multiple of its budget, the conventions detected (with how many cases each explains), and the wall and CPU time of
the run. torch runs on its default threads; JAX with float64 enabled (``from_jax``). Nothing here is imported by
mha_numpy or its tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "verify" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def implementations() -> dict:
    """Name -> a function making the Implementation (imports happen when it is made)."""
    from mha_numpy import testing as T

    def numpy_correct():
        m = _example("correct")
        return T.from_numpy(m.attention, m.attention_vjp, name="examples/verify/correct.py (NumPy)")

    def sdpa():
        import torch

        return T.from_torch(torch.nn.functional.scaled_dot_product_attention, sdpa_backend="math")

    def mha(need_weights):
        return lambda: T.torch_mha(need_weights)

    def jax_dpa():
        import jax

        return T.from_jax(jax.nn.dot_product_attention)

    return {
        "numpy": numpy_correct,
        "kernel": lambda: T.kernel("vectorized"),
        "sdpa": sdpa,
        "mha": mha(True),
        "mha-no-weights": mha(False),
        "hf-sdpa": lambda: T.hf_attention("sdpa"),
        "hf-eager": lambda: T.hf_attention("eager"),
        "jax": jax_dpa,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", choices=["quick", "full"], default="quick")
    p.add_argument("--only", help="comma-separated names among " + ", ".join(implementations()))
    args = p.parse_args(argv)
    from mha_numpy.testing import verify_attention

    chosen = args.only.split(",") if args.only else list(implementations())
    print(f"{args.cases} matrix; numpy {np.__version__}, {platform.machine()}, ", end="")
    try:
        import torch
        import transformers

        print(f"torch {torch.__version__}, transformers {transformers.__version__}", end="")
    except ModuleNotFoundError:
        pass
    print("\n")
    print("| implementation | passed | failed | n/a | worst pass (x budget) | detected (cases) | wall, CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in chosen:
        impl = implementations()[name]()
        r = verify_attention(impl, cases=args.cases)
        n = r.counts()
        found = "; ".join(f"{k} ({v})" for k, v in sorted(r.detected().items(), key=lambda kv: -kv[1])) or "none"
        unexplained = sum(x.failed and not x.detected for x in r.results)
        if unexplained:
            found += f"; unexplained ({unexplained})"
        worst = max((x.worst.ratio for x in r.results if x.status == "PASS"), default=0.0)
        print(f"| {impl.name} | {n['PASS']} | {n['FAIL'] + n['ERROR']} | {n['n/a']} | {worst:.2f} | {found} | "
              f"{r.seconds:.1f} s, {r.cpu_seconds:.1f} s |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
