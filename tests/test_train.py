"""mha_numpy.train: each pair against central differences, the whole model's gradients, the optimizers
and a whole training run against PyTorch, and training that actually learns the known attention pattern."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy import train as T
from mha_numpy.gradcheck import GradcheckReport, check_function, numerical_gradient
from mha_numpy.models import layers as LY
from mha_numpy.models.tiny import TinyAttentionModel

RTOL_TARGET = 1e-7  # the project's target for the max relative error of a float64 gradient


def assert_tight(report):
    assert report.passed, str(report)
    for row in report.rows:
        assert row.max_rel_err <= RTOL_TARGET, str(report)


def small_model(seed=0, num_heads=2, dtype=np.float64):
    """V=5, L=4, E=8: every parameter nonzero (zero biases would hide bias bugs)."""
    rng = np.random.default_rng(seed)
    model = TinyAttentionModel(5, 4, embed_dim=8, num_heads=num_heads, dtype=dtype, rng=rng)
    for name, p in model.params.items():
        if name.startswith("b_"):
            p[...] = rng.normal(0, 0.3, p.shape)
    return model, rng


# --------------------------------------------------------------------------- the pairs


def test_embedding_forward_is_a_row_lookup_and_backward_accumulates_repeats():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((6, 3))
    ids = np.array([[1, 4, 1, 1], [0, 4, 5, 1]])  # id 1 four times, id 4 twice, ids 2 and 3 never
    out, cache = LY.embedding_forward(ids, table)
    assert out.shape == (2, 4, 3)
    np.testing.assert_array_equal(out[0, 1], table[4])
    d_out = rng.standard_normal(out.shape)
    d_table = LY.embedding_backward(d_out, cache)
    np.testing.assert_allclose(d_table[1], d_out[0, 0] + d_out[0, 2] + d_out[0, 3] + d_out[1, 3], rtol=1e-14)
    np.testing.assert_array_equal(d_table[[2, 3]], 0.0)
    report = check_function(
        lambda table: LY.embedding_forward(ids, table)[0], {"table": d_table}, {"table": table}, d_out
    )
    assert_tight(report)


def test_add_pair_passes_the_gradient_to_both_terms():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    out, cache = LY.add_forward(a, b)
    d_out = rng.standard_normal(out.shape)
    da, db = LY.add_backward(d_out, cache)
    assert_tight(check_function(lambda a, b: LY.add_forward(a, b)[0], {"a": da, "b": db}, {"a": a, "b": b}, d_out))


def test_cross_entropy_matches_the_formula_and_is_stable():
    rng = np.random.default_rng(2)
    logits, targets = rng.standard_normal((3, 4, 7)), rng.integers(0, 7, (3, 4))
    loss, _ = LY.softmax_cross_entropy_forward(logits, targets)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = -np.mean(np.log(p[np.arange(3)[:, None], np.arange(4), targets]))
    assert loss == pytest.approx(expected, rel=1e-13)
    big, _ = LY.softmax_cross_entropy_forward(logits + 1000.0, targets)  # exp(1000) overflows without the shift
    assert big == pytest.approx(expected, rel=1e-12)


def test_cross_entropy_backward_against_central_differences():
    rng = np.random.default_rng(3)
    logits, targets = rng.standard_normal((3, 4, 7)), rng.integers(0, 7, (3, 4))
    d_loss = float(rng.standard_normal())  # a random upstream scalar, not 1
    _, cache = LY.softmax_cross_entropy_forward(logits, targets)
    d_logits = LY.softmax_cross_entropy_backward(d_loss, cache)
    p = cache[0]
    onehot = np.eye(7)[targets]
    np.testing.assert_allclose(d_logits, d_loss * (p - onehot) / targets.size, rtol=1e-12, atol=1e-15)

    def f(logits):
        return np.array(LY.softmax_cross_entropy_forward(logits, targets)[0])

    assert_tight(check_function(f, {"logits": d_logits}, {"logits": logits}, np.array(d_loss)))


# --------------------------------------------------------------------------- the whole model


def test_model_parameter_gradients_against_central_differences():
    """Every parameter, random upstream gradient on the logits: covers residual + q/k/v paths + embeddings."""
    model, rng = small_model(seed=4)
    tokens = np.array([[1, 3, 1, 0], [4, 4, 2, 1], [0, 1, 2, 3]])  # repeated tokens on purpose
    logits, cache = model.forward(tokens)
    d_logits = rng.standard_normal(logits.shape)
    grads = model.backward(d_logits, cache)
    assert list(grads) == list(model.params)
    report = GradcheckReport()
    for name, param in model.params.items():  # perturbed in place, so the forward sees each change
        report.add(name, grads[name], numerical_gradient(lambda _p: model.forward(tokens)[0], param, d_logits))
    assert_tight(report)


@pytest.mark.parametrize("block", ["post", "pre"])
def test_full_block_model_gradients_against_central_differences(block):
    """The tiny model with a whole Transformer block (LayerNorm, feed-forward): every parameter."""
    rng = np.random.default_rng(6)
    model = TinyAttentionModel(5, 4, embed_dim=8, num_heads=2, rng=rng, block=block)
    for name, p in model.params.items():  # nonzero biases, LayerNorm gains away from 1
        p[...] += rng.normal(0, 0.3, p.shape) if ("bias" in name or "LayerNorm" in name) else 0.0
    assert "block.output.LayerNorm.weight" in model.params and "W_q" not in model.params
    assert model.mha.params["W_q"] is model.params["block.attention.self.query.weight"]
    tokens = np.array([[1, 3, 1, 0], [4, 4, 2, 1], [0, 1, 2, 3]])
    logits, cache = model.forward(tokens)
    assert cache.attn_weights.shape == (3, 2, 4, 4)
    d_logits = rng.standard_normal(logits.shape)
    grads = model.backward(d_logits, cache)
    assert list(grads) == list(model.params) and len(grads) == 4 + 16
    report = GradcheckReport()
    for name, param in model.params.items():
        report.add(name, grads[name], numerical_gradient(lambda _p: model.forward(tokens)[0], param, d_logits))
    assert_tight(report)


def test_full_block_model_trains_on_reverse():
    result = T.train("reverse", steps=150, block="pre", seed=0, log=None, eval_size=200)
    assert result.accuracy >= 0.9 and result.config["block"] == "pre"
    with pytest.raises(ValueError, match="block"):
        TinyAttentionModel(5, 4, block="sandwich")


def test_model_loss_gradients_against_central_differences():
    """The loss itself (d_loss = 1) through cross-entropy, read-out, attention and embeddings."""
    model, rng = small_model(seed=5, num_heads=1)
    tokens, targets = T.make_batch("reverse", rng, 3, 4, 5)
    loss, _, grads, _ = model.loss_and_grads(tokens, targets)

    def loss_of(_p):
        return np.array(LY.softmax_cross_entropy_forward(model.forward(tokens)[0], targets)[0])

    for name in ("tok_emb", "pos_emb", "W_q", "W_k", "W_v", "b_o", "W_out"):
        num = numerical_gradient(loss_of, model.params[name], np.array(1.0))
        assert rel_err(grads[name], num) <= RTOL_TARGET, name


def test_float32_keeps_its_dtype_through_a_training_step():
    model, rng = small_model(dtype=np.float32)
    tokens, targets = T.make_batch("shift", rng, 3, 4, 5)
    opt = T.Adam(model.params)
    loss, logits, norm = T.train_step(model, opt, tokens, targets, max_grad_norm=1.0)
    assert logits.dtype == np.float32 and np.isfinite(loss) and norm > 0
    assert all(p.dtype == np.float32 for p in model.params.values())


def test_bad_inputs_raise_value_errors_naming_the_argument():
    model, _ = small_model()
    with pytest.raises(ValueError, match="tokens"):
        model.forward(np.zeros((2, 4)))  # floats, not ids
    with pytest.raises(ValueError, match="tokens"):
        model.forward(np.full((2, 4), 5))  # id 5 with V = 5
    with pytest.raises(ValueError, match="tokens"):
        model.forward(np.zeros((2, 6), dtype=int))  # longer than max_length = 4
    with pytest.raises(ValueError, match="targets"):
        LY.softmax_cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="task"):
        T.make_batch("sort", np.random.default_rng(0), 2, 4, 5)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(steps=1.5), "steps"),  # a TypeError from range()
        (dict(log_every=0), "log_every"),  # a ZeroDivisionError at the first step
        (dict(seed=-1), "seed"),  # NumPy's SeedSequence error
        (dict(eval_size=0), "eval_size"),
        (dict(batch_size=True), "batch_size"),
        (dict(shift=0.5), "shift"),
        (dict(lr="3e-3"), "lr"),  # a TypeError from '>' between str and int
        (dict(momentum=-1.0), "momentum"),
        (dict(max_grad_norm=float("nan")), "max_grad_norm"),
        (dict(snapshot_steps=5), "snapshot_steps"),
        (dict(snapshot_steps=(0, 2.5)), r"snapshot_steps\[1\]"),
        (dict(log=3), "log"),
        (dict(length=True), "max_length"),  # True was accepted as a length of 1
        (dict(vocab_size=2.0), "vocab_size"),
    ],
)
def test_train_arguments_are_checked_naming_them(kwargs, name):
    """Reliability 9 (the same cause as finetune's): these crashed inside the loop or in NumPy."""
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        T.train(**{"steps": 2, "log": None, **kwargs})


def test_inputs_are_not_mutated():
    model, rng = small_model()
    tokens = np.array([[1, 2, 3, 4]])
    before = tokens.copy()
    _, _, grads, _ = model.loss_and_grads(tokens, tokens)
    copies = {k: g.copy() for k, g in grads.items()}
    clipped, norm = T.clip_grad_norm(grads, 1e-3)
    np.testing.assert_array_equal(tokens, before)
    assert all(np.array_equal(grads[k], copies[k]) for k in grads)
    assert T.global_norm(clipped) == pytest.approx(1e-3, rel=1e-5) and norm > 1e-3


# --------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("task", T.TASKS)
def test_targets_are_read_where_the_ideal_map_points(task):
    tokens, targets = T.make_batch(task, np.random.default_rng(6), 5, 8, 10, shift=3)
    ideal = T.ideal_attention(task, 8, shift=3)
    np.testing.assert_array_equal(ideal.sum(axis=1), 1.0)
    np.testing.assert_array_equal(targets, tokens[:, ideal.argmax(axis=1)])
    if task == "reverse":
        np.testing.assert_array_equal(targets[:, 0], tokens[:, 7])
    else:
        np.testing.assert_array_equal(targets[:, 5], tokens[:, 2])


# --------------------------------------------------------------------------- optimizers and clipping vs torch


@contextlib.contextmanager
def torch_one_thread(torch):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def test_optimizers_and_clipping_match_torch():
    torch = require_torch()
    rng = np.random.default_rng(7)
    start = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    grads_seq = [{k: rng.standard_normal(v.shape) * 3 for k, v in start.items()} for _ in range(6)]
    for make_np, make_torch in (
        (lambda p: T.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
        (lambda p: T.SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
        (lambda p: T.Adam(p, lr=0.05, betas=(0.8, 0.99)), lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99))),
    ):
        ours = {k: v.copy() for k, v in start.items()}
        theirs = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
        opt_np, opt_t = make_np(ours), make_torch(list(theirs.values()))
        for g in grads_seq:
            clipped, norm = T.clip_grad_norm(g, max_norm=2.0)
            for k, t in theirs.items():
                t.grad = torch.tensor(g[k])
            torch_norm = torch.nn.utils.clip_grad_norm_(list(theirs.values()), max_norm=2.0)
            assert norm == pytest.approx(float(torch_norm), rel=1e-13)
            opt_np.step(clipped)
            opt_t.step()
        for k in ours:
            assert rel_err(ours[k], theirs[k].detach().numpy()) <= 1e-12, (type(opt_np).__name__, k)


def torch_copy(torch, model):
    """The same model written with torch modules, loaded with the NumPy model's weights."""
    nn = torch.nn
    V, L, E, H = model.vocab_size, model.max_length, model.mha.embed_dim, model.mha.num_heads

    class TorchTiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(V, E), nn.Embedding(L, E)
            self.mha = nn.MultiheadAttention(E, H, batch_first=True)
            self.out = nn.Linear(E, V)

        def forward(self, tokens):
            x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
            a, w = self.mha(x, x, x, need_weights=True, average_attn_weights=False)
            return self.out(x + a), w

    tm = TorchTiny().double()
    P = model.params
    with torch.no_grad():
        for dst, src in zip(torch_params(tm), numpy_params(P)):
            dst.copy_(torch.from_numpy(src))
    return tm


def torch_params(tm):
    """torch parameters in the order of numpy_params."""
    return [tm.tok.weight, tm.pos.weight, tm.mha.in_proj_weight, tm.mha.in_proj_bias,
            tm.mha.out_proj.weight, tm.mha.out_proj.bias, tm.out.weight, tm.out.bias]  # fmt: skip


def numpy_params(P):
    """Our parameters arranged like torch's: W_q, W_k, W_v packed into one (3E, E) in_proj_weight."""
    return [P["tok_emb"], P["pos_emb"], np.concatenate([P["W_q"], P["W_k"], P["W_v"]]),
            np.concatenate([P["b_q"], P["b_k"], P["b_v"]]), P["W_o"], P["b_o"], P["W_out"], P["b_out"]]  # fmt: skip


def test_training_history_matches_torch():
    """40 Adam steps with clipping, float64, same weights and batches: same losses and final weights."""
    torch = require_torch()
    F = torch.nn.functional
    steps, lr, max_norm = 40, 1e-2, 0.5
    model = TinyAttentionModel(10, 8, embed_dim=16, num_heads=2, rng=np.random.default_rng(8))
    tm = torch_copy(torch, model)
    data = np.random.default_rng(9)
    batches = [T.make_batch("reverse", data, 16, 8, 10) for _ in range(steps)]

    opt = T.Adam(model.params, lr=lr)
    ours = [T.train_step(model, opt, x, y, max_norm) for x, y in batches]

    opt_t = torch.optim.Adam(tm.parameters(), lr=lr)
    theirs = []
    with torch_one_thread(torch):
        for x, y in batches:
            opt_t.zero_grad()
            logits, _ = tm(torch.from_numpy(x))
            loss = F.cross_entropy(logits.reshape(-1, 10), torch.from_numpy(y).reshape(-1))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(tm.parameters(), max_norm)
            opt_t.step()
            theirs.append((loss.item(), float(norm)))

    loss_np, norm_np = np.array([o[0] for o in ours]), np.array([o[2] for o in ours])
    loss_t, norm_t = np.array(theirs).T
    assert (norm_np > max_norm).sum() >= 5, "clipping must be active in some steps, or it is not tested"
    assert loss_np[-1] < 0.5 * loss_np[0], "the run must actually train"
    assert rel_err(loss_np, loss_t) <= 1e-9
    assert rel_err(norm_np, norm_t) <= 1e-9
    E = model.mha.embed_dim
    for name, ours_p, theirs_p in zip(
        ["tok_emb", "pos_emb", "W_qkv", "b_qkv", "W_o", "b_o", "W_out", "b_out"],
        numpy_params(model.params),
        (p.detach().numpy() for p in torch_params(tm)),
    ):
        if name == "b_qkv":
            # b_k's gradient is exactly 0 (softmax ignores a shift shared by all keys), so both sides move
            # it only by rounding noise: compare b_q and b_v relatively and b_k absolutely
            b_qv = np.r_[0:E, 2 * E : 3 * E]
            assert rel_err(ours_p[b_qv], theirs_p[b_qv]) <= 1e-9, name
            assert np.abs(ours_p[E : 2 * E] - theirs_p[E : 2 * E]).max() <= 1e-9, "b_k"
        else:
            assert rel_err(ours_p, theirs_p) <= 1e-9, name


def test_final_attention_weights_match_torch():
    torch = require_torch()
    result = T.train("shift", steps=30, embed_dim=16, num_heads=2, seed=3, log=None)
    tm = torch_copy(torch, result.model)
    tokens, _ = T.make_batch("shift", np.random.default_rng(0), 4, 8, 10)
    logits, cache = result.model.forward(tokens)
    with torch.no_grad():
        logits_t, w_t = tm(torch.from_numpy(tokens))
    assert rel_err(logits, logits_t.numpy()) <= 1e-10
    assert rel_err(cache.attn_weights, w_t.numpy()) <= 1e-10


# --------------------------------------------------------------------------- it learns


@pytest.fixture(scope="module")
def reverse_run():
    return T.train("reverse", steps=300, seed=0, log=None)


def test_training_reaches_high_accuracy_on_reverse(reverse_run):
    h = reverse_run.history
    assert reverse_run.accuracy >= 0.99
    assert np.mean(h["loss"][-20:]) < 0.05 * h["loss"][0]
    assert len(h["step"]) == 300 and h["step"][-1] == 300


def test_learned_attention_is_the_anti_diagonal(reverse_run):
    attn, ideal = reverse_run.attention, reverse_run.ideal
    assert attn.shape == (1, 8, 8)
    np.testing.assert_allclose(attn.sum(axis=-1), 1.0, rtol=1e-12)
    assert T.attention_share(reverse_run.snapshots[0], ideal) < 0.5  # untrained: not there yet
    assert T.attention_share(attn, ideal) > 0.8  # trained: most mass on key L-1-i
    assert np.all(attn[0].argmax(axis=-1) == np.arange(8)[::-1])


def test_shift_learns_the_shifted_diagonal_with_two_heads_and_sgd():
    result = T.train("shift", shift=2, num_heads=2, optimizer="sgd", lr=0.1, steps=300, seed=1, log=None)
    assert result.accuracy >= 0.99
    assert T.attention_share(result.attention, result.ideal) > 0.8


def test_train_logs_progress():
    lines = []
    T.train(steps=20, log_every=10, log=lines.append)
    assert len(lines) == 3 and lines[-1].startswith("step    20") and "accuracy" in lines[-1]


# --------------------------------------------------------------------------- CLI


def test_cli_trains_and_writes_figures(tmp_path, capsys):
    from mha_numpy.__main__ import main

    assert main(["train", "--task", "reverse", "--steps", "25", "--seed", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step" in out and "loss" in out
    last = out.strip().splitlines()[-1]
    assert "accuracy=" in last
    float(last.split("accuracy=")[1].split()[0])
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(pngs) >= 2, pngs
    for p in tmp_path.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- figures (viz)


def test_training_figures_have_one_panel_per_head_and_moment(reverse_run):
    from mha_numpy.viz import plot_attention_over_training, plot_training_history

    snaps = {s: np.repeat(a, 2, axis=0) for s, a in reverse_run.snapshots.items()}  # pretend H = 2
    fig = plot_attention_over_training(snaps, reverse_run.ideal)
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 2 * (len(snaps) + 1)  # heads x (moments + the ideal), plus a colorbar axes
    titles = [ax.get_title() for ax in fig.axes]
    assert "ideal" in titles and any(re.fullmatch(r"step 300\non ideal: \d+%", t) for t in titles), titles
    assert len(plot_training_history(reverse_run.history).axes) == 2
    with pytest.raises(ValueError, match="ideal"):
        plot_attention_over_training(snaps, np.eye(3))
    with pytest.raises(ValueError, match="history"):
        plot_training_history({"step": [1], "loss": [1.0]})
