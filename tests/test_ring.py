"""Ring attention over MPI (mha_numpy.distributed): against the single-process kernel, under real mpiexec.

One mpiexec launch per rank count runs every case (tests/ring_cases.py: contiguous and zigzag, causal and not,
padding, GQA, both merge orders, float64 to 1e-12 and float32). MPI comes from requirements-dev.txt (mpi4py +
MPICH's wheel): a machine where mpiexec cannot start FAILS these tests, it never skips them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mha_numpy.__main__ import main
from mha_numpy.distributed import Ring, Sharding, ring_attention_backward, ring_attention_forward, work_per_rank

ROOT = Path(__file__).resolve().parents[1]


def mpiexec() -> str:
    exe = shutil.which("mpiexec") or str(Path(sys.executable).with_name("mpiexec"))
    if not Path(exe).exists():
        pytest.fail("mpiexec not found: pip install -r requirements-dev.txt (mpi4py and mpich) - never a skip")
    return exe


def launch(n: int, *argv: str, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([mpiexec(), "-n", str(n), sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)  # fmt: skip


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_equals_the_single_process_kernel_output_and_every_gradient(ranks):
    r = launch(ranks, str(ROOT / "tests" / "ring_cases.py"))
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("ok   P=") == r.stdout.count("\n") - 1  # every case line says ok, then the summary


def test_the_ring_command_under_mpiexec_checks_and_draws(tmp_path):
    html, png = tmp_path / "ring.html", tmp_path / "ring.png"
    r = launch(2, "-m", "mha_numpy", "ring", "--length", "64", "--kv-heads", "2", "--padding", "5",
               "--html", str(html), "--out", str(png))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RESULT: PASS" in r.stdout and "over 2 ranks" in r.stdout
    sent = [line.split()[-3] for line in r.stdout.splitlines() if line.strip().startswith(("0 ", "1 "))]
    formula = r.stdout.split("itemsize: ")[1].split()[0]
    assert sent == [formula, formula], r.stdout  # the bytes each rank counted = (3P - 2) blocks
    assert "holds kv of rank 1" in html.read_text() and png.read_bytes()[:4] == b"\x89PNG"


def test_without_mpi4py_the_command_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import now fails as if not installed
    assert main(["ring", "--length", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mha_numpy[mpi]" in err and "mpi4py" in err


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    L, P = 64, 4
    zigzag = work_per_rank(Sharding(P, "zigzag"), L, True)
    contiguous = work_per_rank(Sharding(P, "contiguous"), L, True)
    assert sum(zigzag) == sum(contiguous) == L * (L + 1) // 2  # the causal triangle, each score computed once
    assert len(set(zigzag)) == 1
    assert contiguous == sorted(contiguous) and contiguous[-1] > 6 * contiguous[0]  # the last rank does the most


def test_shards_are_the_documented_positions_and_unshard_inverts_them():
    assert Sharding(2, "zigzag").positions(0, 8).tolist() == [0, 1, 6, 7]
    assert Sharding(2, "zigzag").positions(1, 8).tolist() == [2, 3, 4, 5]
    assert Sharding(2, "contiguous").positions(1, 8).tolist() == [4, 5, 6, 7]
    x = np.arange(2 * 24).reshape(1, 2, 24)  # (1, H, L)
    for layout in ("zigzag", "contiguous"):
        s = Sharding(3, layout)
        assert np.array_equal(s.unshard([s.shard(x, r) for r in range(3)]), x)


class OneRank:
    """A communicator of one rank (the ring never sends): the ring's checks without MPI."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1


def test_one_rank_ring_is_the_kernel_and_bad_input_is_a_value_error():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 2, 8, 4)), rng.standard_normal((1, 1, 8, 4)), rng.standard_normal((1, 1, 8, 3))
    ring, s = Ring(OneRank()), Sharding(1, "zigzag")
    (ctx, lse), cache = ring_attention_forward(q, k, v, ring, s, causal=True)
    dq, dk, dv = ring_attention_backward(np.ones_like(ctx), cache, ring)
    assert ctx.shape == (1, 2, 8, 3) and lse.shape == (1, 2, 8) and dk.shape == k.shape and dv.shape == v.shape
    with pytest.raises(ValueError, match="multiple of Hkv"):
        ring_attention_forward(q[:, :1], k.repeat(2, axis=1), v.repeat(2, axis=1), ring, s)
    with pytest.raises(ValueError, match="key_valid"):
        ring_attention_forward(q, k, v, ring, s, key_valid=np.ones((1, 7), dtype=bool))
    with pytest.raises(ValueError, match="multiple of 2"):
        ring_attention_forward(q[:, :, :7], k[:, :, :7], v[:, :, :7], ring, s)
    with pytest.raises(ValueError, match="order must be one of"):
        ring_attention_forward(q, k, v, ring, s, order="random")
    with pytest.raises(ValueError, match="sharding is for 2 ranks"):
        ring_attention_forward(q, k, v, ring, Sharding(2, "zigzag"))
