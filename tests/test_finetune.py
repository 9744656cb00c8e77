"""Fine-tuning MiniLM in NumPy: the same steps in torch give the same losses, the task is learned on held-out
sentences, the weights on disk stay as they were, and bad input is refused."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import require_torch

from mha_numpy.bert import BertModel, default_model_dir
from mha_numpy.finetune import NOUNS, TEMPLATES, evaluate, finetune, make_sentences, no_decay_names
from mha_numpy.models.classifier import BertClassifier
from mha_numpy.optim import AdamW, warmup_linear

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def test_heldout_sentences_share_no_template_noun_or_adjective_with_training():
    train, _, train_words = make_sentences("train", 400, np.random.default_rng(0))
    held, labels, held_words = make_sentences("heldout", 400, np.random.default_rng(1))
    assert not set(train_words) & set(held_words)
    assert not set(NOUNS["train"]) & set(NOUNS["heldout"]) and not set(TEMPLATES["train"]) & set(TEMPLATES["heldout"])
    assert labels.sum() == 200
    assert all(w in s.split() for s, w in zip(held, held_words))


def test_adamw_matches_torch_with_decay_groups_and_schedule():
    torch = require_torch()
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 4)), "b.bias": rng.standard_normal(3)}
    t = {n: torch.tensor(p.copy(), requires_grad=True) for n, p in params.items()}
    opt = AdamW(params, lr=0.1, weight_decay=0.3, no_decay={"b.bias"})
    groups = [{"params": [t["w"]], "weight_decay": 0.3}, {"params": [t["b.bias"]], "weight_decay": 0.0}]
    topt = torch.optim.AdamW(groups, lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(topt, lambda s: warmup_linear(s, 6, 2))
    for step in range(6):
        grads = {n: rng.standard_normal(p.shape) for n, p in params.items()}
        opt.lr = 0.1 * warmup_linear(step, 6, 2)
        opt.step(grads)
        for n in t:
            t[n].grad = torch.from_numpy(grads[n])
        topt.step()
        sched.step()
    for n in params:
        np.testing.assert_allclose(params[n], t[n].detach().numpy(), rtol=1e-13, atol=1e-15)


def test_finetune_losses_match_torch_step_by_step_in_float64():
    """Same weights, same batches, same head init: transformers + torch.optim.AdamW + LambdaLR + clip_grad_norm_."""
    torch = require_torch()
    transformers = pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    steps, batch, lr, seed = 4, 4, 1e-4, 3
    model = BertModel.from_pretrained(dtype=np.float64)
    # num_threads=2: two bands of sentences on threads, the demo's fast path, against torch
    result = finetune(model, steps=steps, batch_size=batch, lr=lr, warmup=2, dropout=False, eval_size=4, seed=seed,
                      log=None, num_threads=2)  # fmt: skip

    seq_head, seq_data, _, _ = np.random.SeedSequence(seed).spawn(4)  # finetune's documented seeding
    head0 = BertClassifier(BertModel.from_pretrained(dtype=np.float64), 2, rng=np.random.default_rng(seq_head)).head
    ref = transformers.BertModel.from_pretrained(
        str(default_model_dir()), attn_implementation="eager", dtype=torch.float64
    ).eval()  # fmt: skip  (eval: no dropout)
    ref.embeddings.word_embeddings.weight.requires_grad_(False)  # frozen, as in finetune
    head = torch.nn.Linear(384, 2, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(head0["classifier.weight"]))
        head.bias.copy_(torch.from_numpy(head0["classifier.bias"]))
    named = {n: p for n, p in ref.named_parameters() if p.requires_grad}
    named |= {f"classifier.{n}": p for n, p in head.named_parameters()}
    no_decay = no_decay_names(named)
    groups = [
        {"params": [p for n, p in named.items() if n not in no_decay], "weight_decay": 0.01},
        {"params": [p for n, p in named.items() if n in no_decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_linear(s, steps, 2))
    data_rng = np.random.default_rng(seq_data)
    losses = []
    for _ in range(steps):
        texts, labels, _ = make_sentences("train", batch, data_rng)
        inputs = model.tokenize(texts)
        ids, mask, types = (
            torch.from_numpy(a) for a in (inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
        )
        h = ref(ids, mask, types).last_hidden_state  # (B, L, E)
        m = mask[:, :, None].to(h.dtype)
        logits = head((h * m).sum(1) / m.sum(1))
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(named.values()), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    ours = np.array(result.history["loss"])
    assert len(ours) == steps and ours[-1] != ours[0]
    np.testing.assert_allclose(ours, losses, rtol=1e-10, atol=0)
    w = "encoder.layer.5.output.dense.weight"
    np.testing.assert_allclose(model.params[w], dict(ref.named_parameters())[w].detach().numpy(), rtol=0, atol=1e-12)


def test_finetune_learns_the_task_and_never_touches_the_file():
    path = default_model_dir() / "model.safetensors"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    model = BertModel.from_pretrained(dtype=np.float32)
    before = model.params["encoder.layer.0.attention.self.query.weight"].copy()
    result = finetune(model, steps=20, eval_size=64, seed=1, log=None)
    assert result.accuracy >= 0.9 and result.accuracy_before < 0.8
    assert not np.array_equal(model.params["encoder.layer.0.attention.self.query.weight"], before)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    fresh = BertModel.from_pretrained(dtype=np.float32)
    np.testing.assert_array_equal(fresh.params["encoder.layer.0.attention.self.query.weight"], before)
    assert result.example["before"].shape[:2] == (6, 12)


def test_finetune_refuses_a_model_without_tokenizer():
    model = BertModel.from_pretrained(dtype=np.float32)
    model.tokenizer = None
    with pytest.raises(ValueError, match="tokenizer"):
        finetune(model, steps=1, log=None)


def test_cli_finetune_short_run_writes_pngs(tmp_path):
    cmd = [sys.executable, "-m", "mha_numpy", "finetune", "--steps", "2", "--eval-size", "8", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "step    1/2" in r.stdout and r.stdout.strip().splitlines()[-1].startswith(
        "RESULT: task=sentiment accuracy="
    )
    assert (tmp_path / "finetune_loss.png").stat().st_size > 1000
    assert (tmp_path / "finetune_attention.png").stat().st_size > 1000
    bad = subprocess.run([*cmd[:4], "--steps", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert "--steps" in bad.stderr


@pytest.fixture(scope="module")
def model64():
    return BertModel.from_pretrained(dtype=np.float64)


def test_bands_give_the_one_band_loss_gradients_and_dropout_masks(model64):
    """Bands of sentences on threads (each band's forward and backward, the gradients summed) against one band, in
    float64 with dropout on: the same masks bit for bit (drawn for the whole batch, sliced per band), the same
    loss and logits, and every gradient within 1e-12 of the largest gradient. 5 sentences: bands of unequal size."""
    clf = BertClassifier(model64, 2, rng=np.random.default_rng(4))
    texts, labels, _ = make_sentences("train", 5, np.random.default_rng(5))
    inputs = model64.tokenize(texts)
    loss1, logits1, grads1, (cache1,) = clf.loss_and_grads(inputs, labels, True, 7, num_threads=1)
    B, L = inputs.input_ids.shape
    masks = model64.sample_dropout_masks(B, L, 7)
    assert all(np.array_equal(cache1.bert.dropout_masks[n], m) for n, m in masks.items())
    scale = max(float(np.abs(g).max()) for g in grads1.values())
    for threads in (2, 3):
        loss, logits, grads, caches = clf.loss_and_grads(inputs, labels, True, 7, num_threads=threads)
        assert len(caches) == threads and list(grads) == list(clf.params)
        for name, m in masks.items():
            np.testing.assert_array_equal(np.concatenate([c.bert.dropout_masks[name] for c in caches]), m)
        np.testing.assert_allclose(logits, logits1, rtol=0, atol=1e-13 * np.abs(logits1).max())
        assert abs(loss - loss1) <= 1e-14 * abs(loss1)
        worst = max(float(np.abs(grads[n] - grads1[n]).max()) for n in grads1)
        assert worst <= 1e-12 * scale, (threads, worst / scale)
    arrays = (inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    eval_logits = clf.logits(*arrays, num_threads=3)
    one_band = clf.forward(*arrays)[0]
    np.testing.assert_allclose(eval_logits, one_band, rtol=0, atol=1e-13 * np.abs(one_band).max())
    names = ["classifier.bias", "encoder.layer.0.output.dense.weight"]
    some = clf.loss_and_grads(inputs, labels, True, 7, num_threads=2, names=names)[2]
    assert list(some) == names and np.allclose(some[names[1]], grads1[names[1]], rtol=0, atol=1e-12 * scale)


def test_evaluate_batched_by_length_is_the_plain_accuracy(model64):
    """evaluate sorts the sentences by length and cuts each batch to its longest: the same predictions as one
    padded batch in the given order (a label paired with the wrong sentence would change the count)."""
    clf = BertClassifier(model64, 2, rng=np.random.default_rng(2))
    clf.head["classifier.weight"] *= 50  # predictions that differ from sentence to sentence
    texts, labels, _ = make_sentences("heldout", 21, np.random.default_rng(6))
    inputs = model64.tokenize(texts)
    predicted = clf.forward(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)[0].argmax(-1)
    assert 0 < (predicted == labels).sum() < 21
    for flipped in (labels, 1 - labels):
        assert evaluate(clf, texts, flipped, batch_size=8) == (predicted == flipped).mean()


@pytest.fixture(scope="module")
def model32():
    return BertModel.from_pretrained(dtype=np.float32)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(steps=1.5), "steps"),  # was a TypeError from range()
        (dict(steps=True), "steps"),
        (dict(steps="3"), "steps"),
        (dict(batch_size=0), "batch_size"),
        (dict(eval_size=0), "eval_size"),  # was an IndexError (the example sentence of an empty set)
        (dict(log_every=0), "log_every"),  # was a ZeroDivisionError at the first step
        (dict(seed=-1), "seed"),  # was NumPy's SeedSequence error
        (dict(seed=1.0), "seed"),
        (dict(warmup=-1), "warmup"),
        (dict(warmup=2.5), "warmup"),
        (dict(lr=0.0), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(lr="1e-4"), "lr"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(max_grad_norm=0), "max_grad_norm"),
        (dict(max_grad_norm=float("inf")), "max_grad_norm"),
        (dict(dropout="no"), "dropout"),
        (dict(log="print"), "log"),
        (dict(num_threads=0), "num_threads"),
    ],
)
def test_finetune_arguments_are_checked_before_any_work(model32, monkeypatch, kwargs, name):
    """Reliability 9: each of these crashed (TypeError, IndexError, ZeroDivisionError, a NumPy error) or ran."""
    import mha_numpy.finetune as ft

    monkeypatch.setattr(ft, "BertClassifier", lambda *a, **k: pytest.fail("work started before the checks"))
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        finetune(model32, **{"log": None, **kwargs})


def test_finetune_refuses_what_is_not_a_bert_model_and_make_sentences_checks_n():
    with pytest.raises(ValueError, match="^model must be a mha_numpy BertModel"):
        finetune("minilm", log=None)
    rng = np.random.default_rng(0)
    for n in (1.5, -1, "4", True):
        with pytest.raises(ValueError, match="^n must be"):
            make_sentences("train", n, rng)
    with pytest.raises(ValueError, match="^split must be"):
        make_sentences(["train"], 2, rng)
    with pytest.raises(ValueError, match="^rng must be"):
        make_sentences("train", 2, 0)
    assert make_sentences("train", np.int64(3), rng)[1].shape == (3,)
