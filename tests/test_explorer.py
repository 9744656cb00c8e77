"""The explorer's Python side: the data on the page, its size, bad input, the builders and the CLI's --html.

What the page draws is tested in a real browser (tests/test_explorer_browser.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import alibi_by_hand, rel_bias_by_hand

from mha_numpy import MultiHeadAttention
from mha_numpy.__main__ import main
from mha_numpy.viz import ExplorerPage, explore_attention, explore_tiny, explorer_html, write_explorer
from mha_numpy.viz.explorer import B64, page_data
from mha_numpy.viz.explorer_sources import bert_caches, value_norms


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def random_attention(layers, H, Lq, Lk, seed=0):
    return softmax(np.random.default_rng(seed).normal(0, 2, (layers, H, Lq, Lk)))


def payload(page: str) -> dict:
    return json.loads(re.search(r"<script id='explorer-data' type='application/json'>(.*?)</script>", page, re.S)[1])


def unpack(packed: str, step: float) -> np.ndarray:
    """The page's two-character base-64 ints back to numbers (as explorer.js decodes them)."""
    ints = [64 * B64.index(packed[n]) + B64.index(packed[n + 1]) - 2048 for n in range(0, len(packed), 2)]
    return np.array(ints) * step


def test_page_is_one_offline_file():
    page = explorer_html(random_attention(2, 3, 4, 4), list("abcd"))
    assert isinstance(page, str) and page.startswith("<!DOCTYPE html>")
    lowered = page.lower()
    for needle in ("<link", " src=", "@import", "url(", "https:", "fetch(", "xmlhttprequest"):
        assert needle not in lowered, needle
    assert "http:" not in lowered.replace("http://www.w3.org/2000/svg", "")  # the SVG namespace is a name only
    assert "default-src 'none'" in page  # and the browser is told to load nothing


def test_page_holds_the_rounded_weights_tokens_and_masks():
    A = random_attention(2, 3, 4, 5)
    mask = np.ones((3, 4, 5), dtype=bool)
    mask[1, :, 4] = False  # head 1 never sees key 4
    A[:, 1] = np.where(mask[1], A[:, 1], 0)
    A[:, 1] /= A[:, 1].sum(axis=-1, keepdims=True)
    data = payload(explorer_html(A, list("abcd"), key_tokens=list("vwxyz"), masks=mask, title="T</script>"))
    assert data["qtok"] == list("abcd") and data["ktok"] == list("vwxyz") and data["title"] == "T</script>"
    assert data["layers"] == ["layer 0", "layer 1"] and data["heads"] == 3
    for l in range(2):
        for h in range(3):
            np.testing.assert_array_equal(np.reshape(data["attn"][l][h], (4, 5)) / 1000, np.round(A[l, h], 3))
    assert data["maskIndex"] == [[-1, 0, -1], [-1, 0, -1]]
    assert data["masks"] == ["".join("0" if m else "1" for m in mask[1].ravel())]


def test_queries_and_keys_round_trip_within_half_a_step():
    rng = np.random.default_rng(1)
    Q, K = rng.normal(0, 3, (1, 2, 3, 8)), rng.normal(0, 3, (1, 2, 3, 8))
    A = softmax(0.5 * Q @ K.swapaxes(-1, -2))  # (1, 2, 3, 3)
    vn = np.abs(rng.normal(size=(1, 2, 3)))
    N = page_data(A, None, queries=Q, keys=K, value_norms=vn, scale=0.5)["neuron"]
    assert N["d"] == 8 and N["scale"] == 0.5
    for h in range(2):
        for name, X in (("q", Q), ("k", K)):
            step = N[f"{name}Step"][0][h]
            assert step == pytest.approx(np.abs(X[0, h]).max() / 2047, rel=1e-7)
            got = unpack(N[name][0][h], step).reshape(3, 8)
            assert np.abs(got - X[0, h]).max() <= step / 2 * (1 + 1e-9)
    np.testing.assert_allclose(N["vnorm"], vn, rtol=1e-3)


def test_six_layers_twelve_heads_64_tokens_stay_under_2_mb():
    rng = np.random.default_rng(0)
    Q, K = rng.normal(0, 2, (6, 12, 64, 32)), rng.normal(0, 2, (6, 12, 64, 32))
    A = softmax(Q @ K.swapaxes(-1, -2) / np.sqrt(32))  # (6, 12, 64, 64)
    G = rng.normal(0, 1, A.shape)  # and a gradient view
    tokens = [f"tok{i}" for i in range(64)]
    page = explorer_html(A, tokens, queries=Q, keys=K, value_norms=np.ones((6, 12, 64)), weight_grads=G)
    assert len(page.encode()) < 2_000_000


def test_notebook_display_and_save(tmp_path):
    page = explorer_html(random_attention(1, 1, 2, 2), ["a", "b"])
    assert isinstance(page, ExplorerPage)
    inline = page._repr_html_()
    assert inline.startswith("<iframe srcdoc=") and "&lt;script" in inline and "<script" not in inline
    assert repr(page) == f"<ExplorerPage: {len(page)} characters of HTML; .save(path) writes it>"
    path = page.save(tmp_path / "p.html")
    assert path.read_text(encoding="utf-8") == page
    assert write_explorer(tmp_path / "q.html", random_attention(1, 1, 2, 2), ["a", "b"]).is_file()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(attentions=np.ones((3, 3)) / 3), r"attentions must be \(H, L, n\).*\(3, 3\)"),
        (dict(attentions=[np.ones((2, 3, 3)) / 3, np.ones((3, 3)) / 3]), r"attentions\[1\] must be.*\(3, 3\)"),
        (dict(attentions=np.ones((1, 2, 3, 3)) / 3, tokens=["a", "b"]), r"tokens has 2 entries.*length 3"),
        (
            dict(attentions=np.ones((1, 2, 3, 4)) / 4, tokens=list("abc"), key_tokens=list("ab")),
            r"key_tokens has 2 entries but the attention has length 4",
        ),
        (dict(attentions=np.ones((1, 2, 3, 3)) / 2), r"attentions rows must sum to 1.*layer 0, head 0, query 0"),
        (dict(attentions=np.ones((1, 2, 3, 3)) * np.nan), r"attentions must hold finite weights"),
        (dict(attentions=np.ones((1, 2, 0, 3))), r"\(layers, H, Lq, Lk\) = \(1, 2, 0, 3\) has no queries \(Lq = 0\)"),
        (dict(attentions=np.ones((1, 2, 3, 0))), r"\(1, 2, 3, 0\) has no keys \(Lk = 0\): there is nothing to show"),
        (dict(attentions=[np.ones((2, 2, 0, 3))]), r"\(1, 2, 0, 3\) has no queries \(Lq = 0\)"),
        (dict(attentions=np.ones((1, 0, 3, 3))), r"\(1, 0, 3, 3\) has no heads \(H = 0\)"),
        (dict(attentions=np.ones((0, 2, 3, 3))), r"attentions is empty \(no layers\)"),
        (
            dict(attentions=np.ones((1, 1, 2, 2)) / 2, queries=np.ones((1, 1, 2, 0)), keys=np.ones((1, 1, 2, 0))),
            r"queries \(1, 1, 2, 0\) and keys .* and d > 0",
        ),
        (
            dict(
                attentions=np.ones((1, 1, 2, 2)) / 2, queries=np.ones((1, 1, 2, 4)) * np.inf, keys=np.ones((1, 1, 2, 4))
            ),
            r"queries must be finite",
        ),
        (dict(attentions=np.ones((1, 1, 2, 2)) / 2, biases={"b": np.zeros((2, 2))}), r"value_norms and biases need"),
        (dict(attentions=np.zeros((1, 1, 2, 2))), r"sums to 0 \(and masks does not block all its keys\)"),
        (
            dict(attentions=np.ones((1, 1, 2, 2)) / 2, masks=np.array([[True, False], [True, True]])),
            r"masks blocks layer 0, head 0, query 0, key 1 but attentions has weight there",
        ),
        (dict(attentions=np.ones((1, 1, 2, 2)) / 2, masks=np.ones((3, 3), bool)), r"mask with shape \(3, 3\)"),
        (dict(attentions=np.ones((1, 1, 2, 2)) / 2, queries=np.ones((1, 1, 2, 4))), r"queries and keys come together"),
        (
            dict(attentions=np.ones((1, 1, 2, 2)) / 2, queries=np.ones((1, 1, 2, 4)), keys=np.ones((1, 1, 2, 3))),
            r"keys with shape \(1, 1, 2, 3\): the last axis must have length 4",
        ),
        (
            dict(
                attentions=np.ones((1, 1, 2, 2)) / 2,
                queries=np.ones((1, 1, 2, 4)),
                keys=np.ones((1, 1, 2, 4)),
                value_norms=np.ones((1, 2)),
            ),
            r"value_norms must be \(layers, H, Lk\) = \(1, 1, 2\), got shape \(1, 2\)",
        ),
    ],
)
def test_bad_input_names_the_argument(kwargs, message):
    kwargs.setdefault("tokens", None)
    with pytest.raises(ValueError, match=message):
        explorer_html(**kwargs)


def test_a_fully_masked_row_of_zeros_is_fine_when_the_mask_explains_it():
    A = np.array([[0.5, 0.5], [0.0, 0.0]])[None, None]  # (1, 1, 2, 2): query 1 sees nothing
    mask = np.array([[True, True], [False, False]])
    assert payload(explorer_html(A, ["a", "b"], masks=mask))["maskIndex"] == [[0]]


def test_unwritable_path_is_a_value_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"path '.*missing/p.html' is not writable"):
        write_explorer(tmp_path / "missing" / "p.html", np.ones((1, 2, 2)) / 2)


# --------------------------------------------------------------------------- builders


def test_explore_attention_uses_the_caches_q_k_and_w_o():
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(8, 2, rng=rng)
    x = rng.standard_normal((2, 3, 8))
    mask = np.array([True, True, False])[None, None, None, :]  # key 2 is padding
    _, cache = mha.forward(x, x, x, mask=mask)
    data = payload(explore_attention(mha, cache, list("abc"), list("abc"), mask=mask, batch=1))
    N = data["neuron"]
    got = unpack(N["q"][0][1], N["qStep"][0][1]).reshape(3, 4)
    assert np.abs(got - cache.Q[1, 1]).max() <= N["qStep"][0][1] / 2 * (1 + 1e-9)
    W_o = mha.params["W_o"]
    expected = np.linalg.norm(W_o[:, 4:8] @ cache.V[1, 1, 2])  # head 1 reads columns 4..7 of W_o
    assert value_norms(mha, cache)[1, 1, 2] == pytest.approx(expected, rel=1e-12)
    assert data["masks"] == ["001" * 3]
    with pytest.raises(ValueError, match="batch=2 out of range"):
        explore_attention(mha, cache, batch=2)


def test_bert_caches_are_the_layers_attention_and_leave_the_model_unchanged():
    from mha_numpy.bert import BertModel

    model = BertModel.from_pretrained(dtype=np.float32)
    inputs = model.tokenize("a short sentence")
    out, caches = bert_caches(model, inputs)
    assert len(caches) == len(model.layers)
    for a, c in zip(out.attentions, caches):
        np.testing.assert_array_equal(a, c.attn_weights)
    assert all("forward" not in vars(layer.attention) for layer in model.layers)


def test_explore_tiny_labels_positions_and_ids():
    from mha_numpy.models.tiny import TinyAttentionModel

    model = TinyAttentionModel(vocab_size=5, max_length=4, embed_dim=8, num_heads=2, rng=0)
    data = payload(explore_tiny(model, np.array([3, 1, 4, 1])))
    assert data["qtok"] == ["0:3", "1:1", "2:4", "3:1"] and data["heads"] == 2
    assert payload(explore_tiny(model, np.array([3, 1, 4, 1]), heads=[1]))["initHeads"] == [1]  # options pass on
    with pytest.raises(ValueError, match=r"tokens must be one sequence.*\(1, 4\)"):
        explore_tiny(model, np.array([[3, 1, 4, 1]]))


# --------------------------------------------------------------------------- CLI


def test_tour_html_writes_the_explorer_of_the_most_masked_sequence(tmp_path, capsys):
    path = tmp_path / "tour.html"
    assert main(["tour", "--mask", "fully-masked-row", "--html", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    data = payload(path.read_text(encoding="utf-8"))
    assert data["qtok"] == ["q0", "q1", "q2", "q3"] and data["masks"]  # sequence 0, with its fully masked row


def one_line_error(argv, capsys) -> str:
    """Run the CLI on a mistake: exit 2 (argparse's, or a UsageError's) and one line on stderr, returned."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse refuses a bad value while parsing
        status = e.code
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.count("\n") == 0, err
    return err


@pytest.mark.parametrize(
    ("command", "other"), [(["tour"], "--heads"), (["train", "--steps", "1"], "--lr"), (["bert", "text"], "--layer")]
)
def test_html_mistakes_read_as_every_other_flags(tmp_path, capsys, command, other):
    """``--html`` errors have the other flags' format: ``prog cmd: error: argument --html: ... (see ... --help)``."""
    prog = f"python -m mha_numpy {command[0]}: error: "
    html = str(tmp_path / "h.html")
    assert one_line_error([*command, other, "-1", "--html", html], capsys).startswith(f"{prog}argument {other}: ")
    err = one_line_error([*command, "--html", str(tmp_path / "no" / "x.html")], capsys)
    assert err.startswith(prog + "argument --html: ") and "does not exist" in err and err.endswith("--help)")
    err = one_line_error([*command, "--html", str(tmp_path)], capsys)
    assert err.startswith(prog + "argument --html: ") and "is a directory" in err


def test_html_that_cannot_be_written_is_one_line_naming_the_flag(tmp_path, capsys):
    prog = "python -m mha_numpy tour: error: argument --html: "
    err = one_line_error(["tour", "--html", str(tmp_path / ("x" * 300 + ".html"))], capsys)  # a name too long
    assert err.startswith(prog) and "File name too long" in err
    if Path("/proc/self").is_dir():  # a directory that exists but takes no new file, even for root
        err = one_line_error(["tour", "--html", "/proc/mha_numpy_explorer.html"], capsys)
        assert err.startswith(prog) and "not writable" in err


def test_train_html(tmp_path, capsys):
    path = tmp_path / "train.html"
    assert main(["train", "--steps", "5", "--out", str(tmp_path), "--html", str(path)]) == 0
    data = payload(path.read_text(encoding="utf-8"))
    assert len(data["qtok"]) == 8 and data["neuron"]["d"] == 32


def test_bert_html_writes_only_the_page(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bert", "The cat sat.", "--html", "b.html"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.html"]
    data = payload((tmp_path / "b.html").read_text(encoding="utf-8"))
    assert data["qtok"][0] == "[CLS]" and len(data["layers"]) == 6 and data["heads"] == 12


# --------------------------------------------------------------------------- the score terms (the neuron view)


TERM_RTOL = 1e-7  # the page writes the score terms with 8 significant digits


def scores_and_terms(seed=0, H=2, Lq=3, Lk=4, d=8):
    """Random q, k and two additive terms; the weights softmax(q·kᵀ / sqrt(d) + bias + finite mask)."""
    rng = np.random.default_rng(seed)
    Q, K = rng.normal(0, 1, (1, H, Lq, d)), rng.normal(0, 1, (1, H, Lk, d))
    bias = rng.normal(0, 1, (1, H, Lq, Lk))
    mask = rng.normal(0, 1, (1, 1, Lq, Lk))  # a finite float mask: added to the scores
    mask[..., 0, -1] = -np.inf  # and one blocked pair
    A = softmax(Q @ K.swapaxes(-1, -2) / np.sqrt(d) + bias + mask)  # (1, H, Lq, Lk)
    return A, Q, K, bias, mask


def test_weights_that_are_not_the_softmax_of_every_term_are_refused():
    A, Q, K, bias, mask = scores_and_terms()
    for kwargs, missing in (
        (dict(masks=mask), r"softmax\(q·kᵀ × scale \+ mask\).*layer 0, head \d, query \d, key \d has weight"),
        (dict(biases={"ALiBi": bias}), r"softmax\(q·kᵀ × scale \+ ALiBi\)"),
        (dict(biases={"ALiBi": bias}, masks=mask, scale=0.5), r"\(scale = 0.5\)"),
    ):
        with pytest.raises(ValueError, match=missing):
            explorer_html(A, queries=Q, keys=K, **kwargs)
    N = payload(explorer_html(A, queries=Q, keys=K, biases={"ALiBi": bias}, masks=mask))["neuron"]
    assert [t["name"] for t in N["terms"]] == ["ALiBi"]
    assert N["terms"][0]["index"] == [[0, 1]]
    for h in range(2):
        np.testing.assert_allclose(np.reshape(N["terms"][0]["maps"][h], (3, 4)), bias[0, h], rtol=TERM_RTOL)
    finite = np.where(np.isneginf(mask), 0, mask)[0, 0]  # the blocked pair is drawn blocked, its term is 0
    assert N["mask"]["index"] == [[0, 0]]  # one map, shared by both heads
    np.testing.assert_allclose(np.reshape(N["mask"]["maps"][0], (3, 4)), finite, rtol=TERM_RTOL)


def test_a_finite_mask_that_swamps_the_scores_in_float32_is_named():
    """float32 s + (-1e9) is -1e9 for every key of a row: the model's weights are uniform, not the softmax."""
    mha = MultiHeadAttention(8, 2, rng=0, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((1, 3, 8)).astype(np.float32)
    mask = np.zeros((1, 1, 3, 3), np.float32)
    mask[..., 1, :] = -1e9  # query 1: every key "blocked" by a finite value
    _, cache = mha.forward(x, x, x, mask=mask)
    np.testing.assert_allclose(cache.attn_weights[0, :, 1], 1 / 3)
    with pytest.raises(ValueError, match=r"query 1, .* swamps q·k in float32 .* block with -inf or a bool mask"):
        explore_attention(mha, cache, mask=mask)
    blocked = np.where(mask < 0, -np.inf, 0).astype(np.float32)  # the same row blocked with -inf: zero weights
    _, cache = mha.forward(x, x, x, mask=blocked)
    assert payload(explore_attention(mha, cache, mask=blocked))["maskIndex"] == [[0, 0]]


def test_a_bool_mask_or_no_term_adds_nothing():
    A, Q, K, *_ = scores_and_terms()
    A = softmax(Q @ K.swapaxes(-1, -2) / np.sqrt(8))
    N = payload(explorer_html(A, queries=Q, keys=K))["neuron"]
    assert N["terms"] == [] and N["mask"] is None


@pytest.mark.parametrize(
    "biases, message",
    [
        ([np.zeros((2, 3, 4))], r"biases must be a dict"),
        ({"b": np.zeros((2, 3, 4), dtype=int)}, r"biases\['b'\] must hold finite floats, got dtype int64"),
        ({"b": np.full((2, 3, 4), np.nan)}, r"biases\['b'\] must hold finite floats"),
        ({"b": np.zeros((2, 3, 5))}, r"biases\['b'\] with shape \(2, 3, 5\) does not broadcast to \(H, Lq, Lk\)"),
        ({"b": [np.zeros((2, 3, 4))] * 2}, r"biases\['b'\] has 2 entries but the attention has 1 layers"),
    ],
)
def test_bad_biases_name_the_term(biases, message):
    A, Q, K, *_ = scores_and_terms()
    with pytest.raises(ValueError, match=message):
        explorer_html(A, queries=Q, keys=K, biases=biases)


def test_a_mask_with_nan_is_refused_before_it_reaches_the_page():
    A, Q, K, *_ = scores_and_terms()
    with pytest.raises(ValueError, match=r"masks must be bool or float with finite values or -inf"):
        explorer_html(A, queries=Q, keys=K, masks=np.full((3, 4), np.nan))


def test_explore_attention_has_every_score_term_of_the_module():
    rng = np.random.default_rng(4)
    H, Lq, Lk = 4, 3, 6
    mha = MultiHeadAttention(16, H, num_kv_heads=2, alibi=True, rel_pos_max_distance=2, rope_theta=100.0, rng=rng)
    q, kv = rng.standard_normal((2, Lq, 16)), rng.standard_normal((2, Lk, 16))
    mask = rng.normal(0, 1, (2, 1, Lq, Lk))  # a finite float mask, per sequence
    _, cache = mha.forward(q, kv, kv, mask=mask)
    N = payload(explore_attention(mha, cache, mask=mask, batch=1))["neuron"]
    assert [t["name"] for t in N["terms"]] == ["ALiBi", "relative bias"]
    expected = (alibi_by_hand(H, Lq, Lk), rel_bias_by_hand(mha.params["rel_bias"], Lq, Lk))
    for term, want in zip(N["terms"], expected):
        got = np.array([np.reshape(term["maps"][term["index"][0][h]], (Lq, Lk)) for h in range(H)])
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(np.reshape(N["mask"]["maps"][0], (Lq, Lk)), mask[1, 0], rtol=TERM_RTOL)
    K_heads = cache.K[1][[h // 2 for h in range(H)]]  # query head h reads kv head h // (H / Hkv)
    for h in range(H):
        got = unpack(N["k"][0][h], N["kStep"][0][h]).reshape(Lk, 4)
        assert np.abs(got - K_heads[h]).max() <= N["kStep"][0][h] / 2 * (1 + 1e-9)


def test_explore_attention_with_an_empty_sequence_says_there_is_nothing_to_show():
    mha = MultiHeadAttention(8, 2, rng=0)
    for Lq, Lk, what in ((0, 3, r"no queries \(Lq = 0\)"), (3, 0, r"no keys \(Lk = 0\)")):
        _, cache = mha.forward(np.ones((1, Lq, 8)), np.ones((1, Lk, 8)), np.ones((1, Lk, 8)))
        with pytest.raises(ValueError, match=what):
            explore_attention(mha, cache)


def test_tour_html_with_an_additive_mask_holds_its_values(tmp_path, capsys):
    path = tmp_path / "tour.html"
    assert main(["tour", "--mask", "additive", "--html", str(path)]) == 0
    N = payload(path.read_text(encoding="utf-8"))["neuron"]
    assert N["mask"] is not None and any(v not in (0, 0.0) for v in N["mask"]["maps"][0])


# --------------------------------------------------------------------------- hostile text


HOSTILE = [
    "<!--<script>",
    "</script>",
    "<script>window.injected = 1</script>",
    "<img src=x onerror='window.injected = 2'>",
    "]]>",
    "--><!--",
    "\u2028",
    "\u2029",
    "'single' \"double\"",
    "back\\slash\\",
    "${window.injected = 3}",
    "&amp; &lt;b&gt; &#x41;",
    "😀",
    "\ud800",  # a lone surrogate: JSON allows it as an escape
    "",
    "x" * 5000,
]


def test_hostile_text_lands_in_the_page_only_as_inert_json_and_escaped_title(tmp_path):
    title = "".join(HOSTILE[:14])
    page = explorer_html(random_attention(1, 1, len(HOSTILE), 2), HOSTILE, key_tokens=["<b>", "</script>"], title=title)
    raw = re.search(r"<script id='explorer-data' type='application/json'>(.*?)</script>", page, re.S)[1]
    assert raw.isascii() and not set("<>&") & set(raw)  # nothing in the data can end, open or comment a tag
    data = json.loads(raw)
    text = [t.replace("\ud800", "\ufffd") for t in HOSTILE]  # a lone surrogate is no character: U+FFFD
    assert data["qtok"] == text and data["ktok"] == ["<b>", "</script>"] and data["title"] == "".join(text[:14])
    around = page.replace(raw, "")  # the page's own HTML, script and style: two scripts, no comment
    assert around.count("<script") == around.count("</script") == 2 and "<!--" not in around
    head = page[page.index("<title>") + 7 : page.index("</title>")]
    assert "<" not in head and ">" not in head and "\ufffd" in head  # escaped; the lone surrogate replaced
    page.encode("utf-8")  # the page can be written (the lone surrogate is only an escape in it)
    assert page.save(tmp_path / "p.html").read_text(encoding="utf-8") == page


@pytest.mark.parametrize("options", [{}, dict(alibi=True, rel_pos_max_distance=2, num_kv_heads=1, rope_theta=9.0)])
def test_a_recompute_cache_gives_the_page_of_the_default_path(options):
    """explore_attention on a MultiHeadAttention(recompute=True) cache (once: AttributeError 'Q'): its recomputed
    Q, K, V and weights give the same page as the default path with the same parameters."""
    rng = np.random.default_rng(3)
    default = MultiHeadAttention(8, 2, rng=0, **options)
    lean = MultiHeadAttention(8, 2, rng=0, recompute=True, **options)
    lean.params = default.params
    x = rng.standard_normal((2, 4, 8))
    mask = np.tril(np.ones((4, 4), bool))
    pages = [explore_attention(m, m.forward(x, x, x, mask=mask)[1], mask=mask, batch=1) for m in (default, lean)]
    assert str(pages[0]) == str(pages[1])


# --------------------------------------------------------------------------- filters, first selection, sentence pairs


def test_include_layers_and_heads_keep_only_those_with_their_names_and_numbers():
    A = random_attention(4, 6, 3, 3)
    rng = np.random.default_rng(1)
    Q, K = rng.normal(0, 1, (4, 6, 3, 2)), rng.normal(0, 1, (4, 6, 3, 2))
    A = softmax(Q @ K.swapaxes(-1, -2) / np.sqrt(2))
    G = rng.normal(0, 1, A.shape)
    data = page_data(A, None, queries=Q, keys=K, include_layers=[3, 1], include_heads=[5, 2], weight_grads=G)
    assert data["layers"] == ["layer 3", "layer 1"] and data["heads"] == 2 and data["headNames"] == ["5", "2"]
    for n, l in enumerate([3, 1]):
        for m, h in enumerate([5, 2]):
            np.testing.assert_array_equal(np.reshape(data["attn"][n][m], (3, 3)) / 1000, np.round(A[l, h], 3))
            got = unpack(data["neuron"]["q"][n][m], data["neuron"]["qStep"][n][m]).reshape(3, 2)
            assert np.abs(got - Q[l, h]).max() <= data["neuron"]["qStep"][n][m] / 2 * (1 + 1e-9)
            got = unpack(data["grad"]["g"][n][m], data["grad"]["step"][n][m]).reshape(3, 3)
            assert np.abs(got - G[l, h]).max() <= data["grad"]["step"][n][m] / 2 * (1 + 1e-9)
    assert data["initLayer"] == 0 and data["initHeads"] == [0, 1]  # two heads: both drawn


def test_the_first_selection_is_one_head_of_many_or_the_one_asked_for():
    A = random_attention(3, 12, 2, 2)
    assert page_data(A, None)["initHeads"] == [0] and page_data(A, None)["initLayer"] == 0
    assert page_data(random_attention(1, 4, 2, 2), None)["initHeads"] == [0, 1, 2, 3]
    data = page_data(A, None, layer=2, heads=[7, 3])
    assert data["initLayer"] == 2 and data["initHeads"] == [7, 3]
    data = page_data(A, None, include_layers=[2, 0], include_heads=[9, 4, 1], layer=0, heads=[4])
    assert data["initLayer"] == 1 and data["initHeads"] == [1]  # positions among the shown ones


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(include_layers=[0, 0]), r"include_layers must be distinct indices in 0\.\.2"),
        (dict(include_layers=[3]), r"include_layers must be distinct indices in 0\.\.2 .*\[3\]"),
        (dict(include_heads=[]), r"include_heads must be distinct indices in 0\.\.3 \(at least one\)"),
        (dict(include_heads=2), r"include_heads must be a list of indices"),
        (
            dict(layer=1, include_layers=[0, 2]),
            r"layer=1 is not among the layers \(include_layers\) shown \(\[0, 2\]\)",
        ),
        (dict(heads=[3], include_heads=[0, 1]), r"heads=3 is not among the heads \(include_heads\) shown"),
        (dict(sentence_b_start=0), r"sentence_b_start=0 needs self-attention .* 0 < sentence_b_start < 5"),
        (dict(sentence_b_start=2, key_tokens=list("vwxyz")), r"sentence_b_start=2 needs self-attention"),
        (dict(weight_grads=np.zeros((3, 4, 5, 4))), r"weight_grads must have the shape of attentions \(3, 4, 5, 5\)"),
        (dict(weight_grads=np.full((3, 4, 5, 5), np.nan)), r"weight_grads must be finite"),
        (dict(grad_note="dL/dα"), r"grad_note describes weight_grads, which was not given"),
    ],
)
def test_bad_filters_selections_pairs_and_gradients_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        page_data(random_attention(3, 4, 5, 5), list("abcde"), **kwargs)


def test_sentence_pair_and_gradients_reach_the_page():
    A = random_attention(1, 2, 5, 5)
    mask = np.ones((5, 5), bool)
    mask[:, 4] = False
    A = np.where(mask, A, 0)
    A /= A.sum(-1, keepdims=True)
    G = np.random.default_rng(2).normal(0, 3, A.shape)
    data = page_data(A, list("abcde"), masks=mask, sentence_b_start=2, weight_grads=G, grad_note="what it is")
    assert data["sentenceB"] == 2 and data["grad"]["note"] == "what it is"
    shown = np.where(mask, G, 0)  # a blocked weight is fixed at 0: no gradient drawn there
    for h in range(2):
        step = data["grad"]["step"][0][h]
        assert 2047 * step == pytest.approx(np.abs(shown[0, h]).max(), rel=1e-7)  # the largest is ±2047 steps
        got = unpack(data["grad"]["g"][0][h], step).reshape(5, 5)
        assert np.abs(got - shown[0, h]).max() <= step / 2 * (1 + 1e-9) and not got[:, 4].any()


def test_weight_grads_are_the_gradient_of_g_dot_output_written_out():
    """dP_bhij = Σ_e G_bie Σ_c W_o[e, h·d + c] V_bhjc: output = merge(P V) W_oᵀ + b_o is linear in P."""
    from mha_numpy.viz.explorer_sources import weight_grads

    rng = np.random.default_rng(4)
    mha = MultiHeadAttention(8, 4, num_kv_heads=2, rng=rng)
    q, kv = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    _, cache = mha.forward(q, kv, kv)
    G = rng.standard_normal((2, 3, 8))
    V = np.repeat(cache.V, 2, axis=1)  # (B, H, Lk, d): query head h reads kv head h // 2
    W = mha.params["W_o"].reshape(8, 4, 2)  # (E, H, d)
    expected = np.einsum("bie,ehc,bhjc->bhij", G, W, V)
    np.testing.assert_allclose(weight_grads(mha, cache, G), expected, rtol=1e-12, atol=1e-12)
    # and by central differences of <G, output> in P, through the module's own output projection
    P, eps = cache.attn_weights.copy(), 1e-6

    def loss(P):  # noqa: E306
        ctx = (P @ V).transpose(0, 2, 1, 3).reshape(2, 3, 8)  # (B, Lq, H·d)
        return np.sum(G * (ctx @ mha.params["W_o"].T + mha.params["b_o"]))

    E = np.zeros_like(P)
    E[1, 3, 2, 4] = eps
    fd = (loss(P + E) - loss(P - E)) / (2 * eps)
    assert fd == pytest.approx(expected[1, 3, 2, 4], rel=1e-7)
    with pytest.raises(ValueError, match=r"d_output must be \(B, Lq, E\) = \(2, 3, 8\), got shape \(3, 8\)"):
        weight_grads(mha, cache, G[0])


def test_explore_attention_and_bert_carry_the_gradient_view():
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(8, 2, rng=rng)
    x = rng.standard_normal((1, 3, 8))
    _, cache = mha.forward(x, x, x)
    G = rng.standard_normal((1, 3, 8))
    data = payload(explore_attention(mha, cache, d_output=G, heads=[1]))
    assert "the d_output given" in data["grad"]["note"] and data["initHeads"] == [1]
    assert "seed 0" in payload(explore_attention(mha, cache))["grad"]["note"]


def test_the_docs_python_snippet_runs(tmp_path, monkeypatch):
    """docs/explorer.md's Python block, as a reader would paste it (it saves explorer.html here)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "explorer.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "docs/explorer.md", "exec"), {})
    data = payload((tmp_path / "explorer.html").read_text(encoding="utf-8"))
    assert data["layers"] == ["a", "b"] and data["headNames"] == ["0", "3"] and len(data["ktok"]) == 6


# --------------------------------------------------------------------------- several attention sets (encoder-decoder)


def test_explorer_sets_html_holds_each_set_with_its_own_tokens():
    from mha_numpy.viz import explorer_sets_html

    rng = np.random.default_rng(6)
    enc, dec, cross = (MultiHeadAttention(8, 2, rng=rng) for _ in range(3))
    src, tgt = rng.standard_normal((1, 5, 8)), rng.standard_normal((1, 3, 8))
    causal = np.tril(np.ones((3, 3), bool))
    _, ce = enc.forward(src, src, src)
    _, cd = dec.forward(tgt, tgt, tgt, mask=causal)
    _, cc = cross.forward(tgt, src, src)
    s, t = list("abcde"), ["<s>", "x", "y"]
    page = explorer_sets_html(
        {
            "encoder": explore_attention(enc, ce, s, s),
            "decoder": dict(attentions=cd.attn_weights, tokens=t, masks=causal),
            "cross": explore_attention(cross, cc, t, s),
        },
        title="seq2seq",
    )
    data = payload(page)
    assert data["title"] == "seq2seq" and [x["name"] for x in data["sets"]] == ["encoder", "decoder", "cross"]
    enc_d, dec_d, cross_d = data["sets"]
    assert enc_d["qtok"] == s and dec_d["qtok"] == t and (cross_d["qtok"], cross_d["ktok"]) == (t, s)
    assert dec_d["neuron"] is None and cross_d["neuron"] is not None and dec_d["masks"]
    np.testing.assert_array_equal(np.reshape(cross_d["attn"][0][1], (3, 5)) / 1000, np.round(cc.attn_weights[0, 1], 3))
    with pytest.raises(ValueError, match=r"sets must be a non-empty dict"):
        explorer_sets_html({})
    with pytest.raises(ValueError, match=r"sets\['x'\] must be an ExplorerPage or a dict"):
        explorer_sets_html({"x": "<html>"})
