"""The benchmarks' FLOP counts and "% peak" columns (issue 27): every formula of benchmarks/flops.py against a count
made another way (the products the naive kernel actually performs, wrapped and counted; the weights' shapes; the
mask's entries), and every table writer emits the share of the GEMM peak for both sides of a row. Nothing is timed:
the tables get a made-up peak and made-up times chosen so that the expected share is known (50%)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from mha_numpy import MultiHeadAttention, masks
from mha_numpy import functional as F
from mha_numpy.kernels.base import Kernel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_bert  # noqa: E402
import bench_compare  # noqa: E402
import bench_decode  # noqa: E402
import bench_delta  # noqa: E402
import bench_flex  # noqa: E402
import bench_masks  # noqa: E402
import bench_peers  # noqa: E402
import bench_report  # noqa: E402
import bench_ring  # noqa: E402
import bench_variants  # noqa: E402
import flops  # noqa: E402
from gemm_peak import Peak, pct, share  # noqa: E402

PEAK = Peak(gflops=100.0, dtype="float32", threads=2)  # made up: 1e11 FLOP/s


def at_half(fl: float) -> float:
    """The seconds in which ``fl`` FLOPs reach 50% of PEAK."""
    return fl / (0.5 * PEAK.gflops * 1e9)


# --------------------------------------------------------------------------- the FLOP counts


def product(a_shape, b_shape) -> int:
    """2·m·k·n per (m × k) @ (k × n), times the broadcast batch: a product counted from its operands' shapes."""
    batch = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    return 2 * int(np.prod(batch, dtype=np.int64)) * a_shape[-2] * a_shape[-1] * b_shape[-1]


@pytest.fixture
def counted(monkeypatch):
    """Counts the FLOPs of every product the projections (the kernel's ``matmul``) and the attention core
    (``functional.attention_scores_*`` / ``attention_context_*``, which the naive kernel calls) perform."""
    total = [0]

    def matmul(self, a, b):
        total[0] += product(a.shape, b.shape)
        return a @ b

    def wrap(name, shapes):
        original = getattr(F, name)

        def fn(*args):
            for a, b in shapes(*args):
                total[0] += product(a, b)
            return original(*args)

        monkeypatch.setattr(F, name, fn)

    T = lambda s: (*s[:-2], s[-1], s[-2])  # noqa: E731  the shape of a transposed operand
    wrap("attention_scores_forward", lambda q, k, scale: [(q.shape, T(k.shape))])
    wrap("attention_scores_backward", lambda ds, c: [(ds.shape, c[1].shape), (T(ds.shape), c[0].shape)])
    wrap("attention_context_forward", lambda p, v: [(p.shape, v.shape)])
    wrap("attention_context_backward", lambda do, c: [(do.shape, T(c[1].shape)), (T(c[0].shape), do.shape)])
    monkeypatch.setattr(Kernel, "matmul", matmul)
    return total


@pytest.mark.parametrize("B, L, E, H, kv", [(2, 5, 8, 2, None), (1, 7, 12, 3, 1)])
def test_self_attention_flops_equal_the_products_the_naive_kernel_performs(counted, B, L, E, H, kv):
    mha = MultiHeadAttention(E, H, impl="naive", num_kv_heads=kv, rng=0)
    x = np.random.default_rng(0).standard_normal((B, L, E))
    out, cache = mha.forward(x, x, x)
    assert counted[0] == flops.self_attention(B, L, E, H, False, kv_heads=kv)
    mha.backward(np.ones_like(out), cache)
    assert counted[0] == flops.self_attention(B, L, E, H, True, kv_heads=kv)


def test_the_unmasked_formula_is_the_documented_one():
    B, L, E, H = 3, 11, 16, 4
    forward = 8 * B * L * E**2 + 4 * B * L**2 * E
    assert flops.self_attention(B, L, E, H, False) == forward and flops.self_attention(B, L, E, H, True) == 3 * forward


def test_the_core_alone_and_ring_per_rank_equal_the_naive_kernels_products(counted):
    B, H, L, d = 1, 2, 6, 4
    q, k, v = (np.random.default_rng(i).standard_normal((B, H, L, d)) for i in range(3))
    from mha_numpy.kernels import get_kernel

    kern = get_kernel("naive")
    ctx, cache = kern.forward(q, k, v)
    kern.backward(np.ones_like(ctx), cache)
    assert counted[0] == flops.attention_core(B, H, d, L * L, True)
    assert counted[0] == 2 * flops.ring_per_rank(L, H, d, 2, True, causal=False)  # each of 2 ranks: half
    assert flops.ring_per_rank(L, H, d, 3, True) * 3 == pytest.approx(flops.attention_core(B, H, d, 21, True))


@pytest.mark.parametrize("L", [1, 5, 16])
def test_masked_counts_are_the_masks_allowed_entries(L):
    assert flops.causal_entries(L) == int(masks.causal_mask(L).sum())
    for w in (1, 3, 16, 40):
        assert flops.window_entries(L, w) == int(np.asarray(masks.sliding_window_mask(L, L, w)).sum()), w


def linear_flops(shapes: dict, prefix: str, tokens: int) -> int:
    """2·tokens·out·in of every 2-D weight whose name starts with ``prefix`` (the linears, in (out, in) layout)."""
    return sum(2 * tokens * s[0] * s[1] for name, s in shapes.items() if name.startswith(prefix) and len(s) == 2)


def test_bert_flops_count_every_linear_of_the_model_and_the_core_over_real_tokens():
    from mha_numpy.models.bert import BertConfig, expected_shapes

    c = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=20,
                   max_position_embeddings=16, type_vocab_size=2)  # fmt: skip
    lengths = [3, 5]  # padded to 5: the padding is not useful work
    shapes = expected_shapes(c)
    by_hand = linear_flops(shapes, "encoder.", sum(lengths))  # Q, K, V, O, the two FFN linears of every layer
    by_hand += c.num_hidden_layers * sum(2 * 2 * n * n * c.hidden_size for n in lengths)  # QKᵀ and PV, all heads
    assert flops.bert(lengths, 8, 20, 2, False) == by_hand
    assert flops.bert(lengths, 8, 20, 2, True) == 3 * by_hand


def test_decoding_flops_count_each_calls_linears_attention_and_lm_head():
    from mha_numpy.models.decoder import DecoderConfig, param_shapes

    cfg = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=24)  # fmt: skip
    shapes, batch, prompt, new = param_shapes(DecoderConfig(**cfg)), 3, 4, 3
    H, d = 4, 4
    by_hand = 0
    calls = [(prompt, 0)] + [(1, prompt + s) for s in range(new - 1)]  # (new tokens, cached keys before)
    for tokens, before in calls:
        by_hand += linear_flops(shapes, "layers.", batch * tokens)  # q, k, v, o, gate, up, down of every layer
        keys = sum(before + i + 1 for i in range(tokens))  # causal: new row i sees the cache and i + 1 new keys
        by_hand += cfg["num_hidden_layers"] * batch * H * 2 * (2 * d * keys)  # QKᵀ and PV over those keys
        by_hand += 2 * batch * 16 * 50  # the LM head on each sequence's last position
    assert flops.greedy_decoding(cfg, batch, prompt, new) == by_hand


def test_kv_decoding_is_one_token_a_step(counted):
    E, H, N = 8, 2, 3
    mha = MultiHeadAttention(E, H, impl="naive", rng=0)
    x = np.random.default_rng(0).standard_normal((1, N, E))
    for t in range(N):  # step t: the projections of one token, the core over t + 1 keys (no cache: the prefix)
        mha.forward(x[:, t : t + 1], x[:, : t + 1], x[:, : t + 1])
    proj_kv_of_prefix = sum(2 * 2 * (t + 1) * E * E for t in range(N))  # this loop also projects k, v of the prefix
    proj_kv_one_token = N * 2 * 2 * E * E  # a cache projects only the new token's k and v
    assert counted[0] - proj_kv_of_prefix + proj_kv_one_token == flops.kv_decoding(N, E, H)


def test_share_and_its_cell():
    assert share(5e10, 1.0, PEAK) == pytest.approx(50.0) == share(5e10, 1.0, 100.0)
    assert pct(5e10, 1.0, PEAK) == "50%" and pct(3.4e9, 1.0, PEAK) == "3.4%" and pct(None, 1.0, PEAK) == ""


# --------------------------------------------------------------------------- every table has the column


def assert_share_column(lines: list[str], columns: int = 1) -> None:
    """The peak is stated above the table, the header has ``columns`` "% peak" columns, a row says 50%."""
    text = "\n".join(lines)
    assert "100.0 GFLOP/s" in text and "float32" in text, text
    header = next(line for line in lines if line.startswith("|") and "% peak" in line)
    assert header.count("% peak") == columns, header
    assert any("| 50% |" in line for line in lines if line.startswith("|")), text


def test_bench_report_tables_have_both_shares():
    fl = flops.self_attention(1, 1024, 256, 4, True)
    ratio = dict(dtype="float32", case="E=256 H=4", L=1024, variant="chunked-t2", ours_ms=1e3 * at_half(fl),
                 torch_ms=1e3 * at_half(fl) / 2, ratio=2.0, lo=1.9, hi=2.1, flops=fl, peak=PEAK)  # fmt: skip
    lines = bench_report.ratio_table([ratio])
    assert_share_column(lines, 2)
    assert "| 50% | 100% |" in lines[-1]  # ours at half the peak, torch in half the time
    cf = flops.self_attention(1, 1024, 256, 4, True, entries=flops.causal_entries(1024))
    causal = dict(L=1024, E=256, H=4, variant="torch-mha", full_ms=1e3 * at_half(fl), causal_ms=1e3 * at_half(cf),
                  ratio=0.5, lo=0.4, hi=0.6, full_flops=fl, causal_flops=cf, peak=PEAK)  # fmt: skip
    assert "| 50% | 50% |" in bench_report.causal_table([causal])[-1]
    assert_share_column(bench_report.causal_table([causal]), 2)
    sweep = dict(dtype="float32", L=1024, block_size=256, num_threads=2, fwd_bwd_s=at_half(fl), flops=fl, peak=PEAK)
    assert_share_column(bench_report.sweep_table([sweep]))


def test_bench_report_main_table_states_the_peak(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_report, "plot", lambda out, rows: None)
    row = dict(dtype="float32", case="E=256 H=4", B=1, L=128, E=256, H=4, variant="torch-mha", peak=100.0,
               fwd_s=0.01, fwd_bwd_s=0.03, fwd_bwd_gflops=50.0, fwd_bwd_pct_peak=50.0, fwd_pct_peak=50.0)  # fmt: skip
    bench_report.write_outputs(tmp_path, {"threads": 2}, [row], [], None, {}, 1.0)
    lines = (tmp_path / "results.md").read_text().splitlines()
    assert_share_column(lines, 2)  # "% peak" and "fwd % peak"


def test_bench_peers_and_bert_tables_have_the_share():
    fl = flops.self_attention(1, 1024, 768, 12, True)
    peer = dict(shape=(1, 1024, 768, 12), dtype="float64", variant="jax-jit", ms=1e3 * at_half(fl), vs="chunked",
                ratio=1.0, lo=1.0, hi=1.0, flops=fl, peak=PEAK)  # fmt: skip
    assert_share_column(bench_peers.table([peer]))
    fb = flops.bert([20] * 32, 384, 1536, 6, False)
    bert = dict(batch=32, tokens=20, threads=2, mode="inference", vs="sdpa", ratio=2.0, lo=2.0, hi=2.0, ours_sps=1.0,
                theirs_sps=2.0, ours_s=at_half(fb), theirs_s=at_half(fb) / 2, flops=fb, peak=PEAK)  # fmt: skip
    lines = bench_bert.table([bert])
    assert_share_column(lines, 2)
    assert lines[-1].endswith("| 50% | 100% |")


def test_bench_compare_table_has_both_shares():
    fl = flops.self_attention(1, 2048, 768, 12, True)
    res = dict(case="1:2048:768:12:float32", a_ms=1e3 * at_half(fl), b_ms=2e3 * at_half(fl), ratio=2.0, lo=2.0,
               hi=2.0, flops=fl, peak=PEAK)  # fmt: skip
    lines = bench_compare.compare_table([res])
    assert_share_column(lines, 2)
    assert lines[-1].endswith("| 50% | 25% |")


def test_bench_decode_writes_both_shares(tmp_path):
    fl = flops.greedy_decoding(bench_decode.CONFIGS["tiny"], 1, 16, 16)
    row = dict(config="tiny", batch=1, new=16, ours_tok_s=1.0, hf_tok_s=1.0, ratio=1.0, lo=1.0, hi=1.0,
               same_tokens=True, ours_s=at_half(fl), hf_s=at_half(fl), flops=fl, peak_gflops=100.0)  # fmt: skip
    args = bench_decode.parse_args(["--quick"])
    args.load_start = 1.0
    bench_decode.write([row], tmp_path, args, peak=PEAK)
    lines = (tmp_path / "decode_results.md").read_text().splitlines()
    assert_share_column(lines, 2)
    assert lines[-1].endswith("| 50% | 50% |")


def test_bench_masks_report_has_the_share():
    L = 4096
    t = at_half(bench_masks.fwd_bwd_flops("causal", L))
    one = dict(t_mask=[0.0], t_fwd=[t / 4], t_bwd=[3 * t / 4], tiles=1, mask_mib=0.0, peak=1.0)
    rows = {(f, k, L): one for f in bench_masks.FAMILIES for k in bench_masks.KINDS}
    args = bench_masks.parse_args(["--quick"])
    lines = bench_masks.report(args, {"threads": 2}, rows, {}, [1.0], 1.0, peak=PEAK)
    assert_share_column(lines)
    assert sum("| 50% |" in line for line in lines) == 6  # the causal and both document families' rows (dense,
    # structured; one document of 4096 is causal at L = 4096); the window differs
    assert flops.attention_core(1, 2, 64, flops.causal_entries(L), True) == bench_masks.fwd_bwd_flops("causal", L)


def test_bench_variants_tables_have_the_shares():
    fl = flops.kv_decoding(8, 256, 8, 2)
    dec = dict(N=8, E=256, H=8, Hkv=2, dtype="float64", t_cache=at_half(fl), t_full=at_half(fl) * 10, ratio=10.0,
               max_diff=0.0, every=1, kv_mib=0.0)  # fmt: skip
    lines = bench_variants.decoding_table([dec], PEAK)
    assert_share_column(lines, 2)
    assert lines[-1].endswith("| 50% | 5.0% |")
    wf = flops.self_attention(1, 64, 256, 4, False, entries=flops.window_entries(64, 16))
    win = dict(mask="window 16", L=64, t_fwd=at_half(wf), t_fwd_bwd=3 * at_half(wf), peak_mib=1.0, allowed=0.2,
               entries=flops.window_entries(64, 16))  # fmt: skip
    lines = bench_variants.window_table([win], PEAK)
    assert_share_column(lines, 2)
    assert lines[-1].endswith("| 50% | 50% |")


def test_bench_ring_writes_the_share_per_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_ring, "plot", lambda rows, path, length: None)
    fl = flops.ring_per_rank(512, 4, 32, 2, True)
    row = dict(P=2, peak_MiB=1.0, bytes_sent=1, bytes_formula=1, forward_s=at_half(fl) / 2, backward_s=at_half(fl) / 2,
               float64_error=0.0, flops_per_rank=fl, **{f"f32_{a}_{o}": 0.0 for a in ("context", "grads")
                                                       for o in ("sequential", "tree")})  # fmt: skip
    bench_ring.write([row], tmp_path, "cmd", 512, 1, 1.0, (1.0, 1.0), peak=PEAK)
    lines = (tmp_path / "ring_results.md").read_text().splitlines()
    assert_share_column(lines)
    assert lines[-1].endswith("| 50% |")


def test_bench_flex_table_has_the_three_shares():
    fl = flops.attention_core(1, 8, 64, 4096 * 4096, True)
    row = {"dtype": "float32", "B": 1, "H": 8, "L": 4096, "d": 64, "flops": fl, "built-in": at_half(fl),
           "flex+vjp": 2 * at_half(fl), "flex+cs": 4 * at_half(fl), "flex+vjp ratio": (2.0, 1.9, 2.1),
           "flex+cs ratio": (4.0, 3.9, 4.1)}  # fmt: skip
    lines = bench_flex.table([row], {"float32": PEAK})
    assert_share_column(lines, 3)
    assert lines[-1].endswith("| 2.00× (1.90..2.10) | 4.00× (3.90..4.10) | 50% | 25% | 12% |")


def test_bench_delta_table_has_its_columns_and_the_share():
    fl = flops.gated_delta_chunked(1, 2, 4096, 128, 128, 64, True)
    row = dict(side="chunked", dtype="float32", L=4096, H=2, Hk=1, rss=3 * 2**20, traced=4096 * 1024, diff=5e-7,
               flops=fl, seconds=at_half(fl), ratio=(20.0, 19.0, 21.0))  # fmt: skip
    theirs = {**row, "side": "transformers", "traced": None, "seconds": 20 * at_half(fl), "ratio": (1.0, 1.0, 1.0)}
    lines = bench_delta.table([row, theirs], {"float32": PEAK})
    assert_share_column(lines)
    header = next(line for line in lines if line.startswith("| L |"))
    for column in ("side", "dtype", "forward + backward (s)", "transformers / side", "RSS peak (MiB)",
                   "tracemalloc peak (MiB)", "tracemalloc / token (KiB)", "difference to float64"):  # fmt: skip
        assert f"| {column} |" in header, column
    assert lines[-2] == "| 4096 | chunked | float32 | 0.0805 | 20.00× (19.00..21.00) | 50% | 3 | 4 | 1.0 | 5.0e-07 |"
    assert lines[-1].endswith("| 2.5% | 3 |  |  | 5.0e-07 |")  # transformers: no tracemalloc
