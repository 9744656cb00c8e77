"""explore_attention on the newer modules (issue 35): sinks, soft-cap, differential attention, latent attention
(MLA); and text holding a lone surrogate.

Once: sinks and soft-cap caches were refused with messages about row sums and missing score terms, differential
attention gave a NumPy reshape error, an MLA cache an AttributeError. Expected numbers are written out here from
the parameters and the formulas (or from mha_numpy's cache arrays where a test reads what the page draws), never
from the page's own builder.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import alibi_by_hand

from mha_numpy import MultiHeadAttention
from mha_numpy.latent import MultiHeadLatentAttention
from mha_numpy.viz import explore_attention, explorer_html, explorer_sets_html
from mha_numpy.viz.explorer_sources import weight_grads

E, H, LQ, LK = 8, 2, 4, 5
FULL_ROW = 3  # the mask blocks every key of this query


def heads(x, W, b, H):
    """(B, L, E) -> (B, H, L, d): x Wᵀ + b split into heads, by hand."""
    y = x @ W.T + b
    B, L, n = y.shape
    return y.reshape(B, L, H, n // H).transpose(0, 2, 1, 3)


def page_maps(data, name: str, layer: int, shape) -> np.ndarray:
    """(H, Lq, Lk) of a list the page keeps per layer and head, row-major."""
    return np.array([np.reshape(m, shape) for m in data[name][layer]])


def inputs(seed=0, B=2):
    rng = np.random.default_rng(seed)
    q, kv = rng.standard_normal((B, LQ, E)), rng.standard_normal((B, LK, E))
    mask = np.ones((LQ, LK), dtype=bool)
    mask[:, LK - 1] = False  # a padded key
    mask[FULL_ROW] = False  # a query that may attend to nothing
    return q, kv, mask


# --------------------------------------------------------------------------- sinks


def test_sinks_get_a_sink_column_holding_the_weight_no_key_took():
    mha = MultiHeadAttention(E, H, sinks=True, rng=0)
    mha.params["sinks"][...] = [1.5, -0.5]
    q, kv, mask = inputs()
    _, cache = mha.forward(q, kv, kv, mask=mask)
    b = 1
    page = explore_attention(mha, cache, mask=mask, batch=b)
    data = page.data
    assert data["ktok"] == [f"k{j}" for j in range(LK)] + ["⟨sink⟩"]

    p = mha.params
    Q, K = heads(q, p["W_q"], p["b_q"], H)[b], heads(kv, p["W_k"], p["b_k"], H)[b]  # (H, L, d)
    s = np.where(mask, Q @ K.swapaxes(-1, -2) / np.sqrt(E // H), -np.inf)  # (H, Lq, Lk)
    sink = p["sinks"][:, None]  # (H, 1)
    total = np.exp(sink) + np.exp(s).sum(-1)  # (H, Lq): gpt-oss's denominator, the sink's logit in it
    by_hand = np.concatenate([np.exp(s) / total[..., None], (np.exp(sink) / total)[..., None]], axis=-1)
    attn = page_maps(data, "attn", 0, (LQ, LK + 1)) / 1000  # thousandths
    assert np.abs(attn - by_hand).max() <= 0.5e-3 + 1e-12
    assert (attn[:, FULL_ROW, -1] == 1).all()  # every key blocked: all of the row went to the sink

    masks = [np.array([c == "1" for c in m]).reshape(LQ, LK + 1) for m in data["masks"]]
    assert all(not m[:, -1].any() for m in masks) and masks[0][:, :LK].tolist() == (~mask).tolist()
    terms = {t["name"]: t for t in data["neuron"]["terms"]}
    assert list(terms) == ["sink logit"]
    for h in range(H):  # the sink's score is its logit (its k is 0), nothing on the keys
        logit = np.reshape(terms["sink logit"]["maps"][terms["sink logit"]["index"][0][h]], (LQ, LK + 1))
        assert (logit[:, :LK] == 0).all() and np.allclose(logit[:, LK], p["sinks"][h], rtol=1e-8, atol=0)
    assert [row[-1] for row in data["neuron"]["vnorm"][0]] == [0, 0]  # the sink has no value


def test_sinks_with_a_float_mask_soft_cap_and_alibi_check_against_the_softmax():
    """explorer_html checks that the neuron view's softmax is the weights: every term, the sink's too, is right."""
    mha = MultiHeadAttention(E, H, sinks=True, softcap=1.5, alibi=True, num_kv_heads=1, rng=1)
    q, kv, mask = inputs(1)
    fmask = np.where(mask, np.random.default_rng(2).normal(0, 0.5, mask.shape), -np.inf)
    _, cache = mha.forward(q, kv, kv, mask=fmask)
    data = explore_attention(mha, cache, mask=fmask).data
    assert [t["name"] for t in data["neuron"]["terms"]] == ["ALiBi", "soft-cap", "sink logit"]
    assert data["neuron"]["mask"] is not None


# --------------------------------------------------------------------------- soft-cap


@pytest.mark.parametrize("alibi", [False, True])
def test_soft_cap_is_a_term_of_the_neuron_view(alibi):
    cap = 0.8
    mha = MultiHeadAttention(E, H, softcap=cap, alibi=alibi, rng=2)
    q, kv, mask = inputs(2, B=1)
    _, cache = mha.forward(q, kv, kv, mask=mask)
    data = explore_attention(mha, cache, ["a", "b", "c", "d"], mask=mask).data
    p = mha.params
    Q, K = heads(q, p["W_q"], p["b_q"], H)[0], heads(kv, p["W_k"], p["b_k"], H)[0]
    s = Q @ K.swapaxes(-1, -2) / np.sqrt(E // H) + (alibi_by_hand(H, LQ, LK) if alibi else 0)  # (H, Lq, Lk)
    expected = {"ALiBi": alibi_by_hand(H, LQ, LK)} if alibi else {}
    expected["soft-cap"] = cap * np.tanh(s / cap) - s  # what Gemma 2's cap takes off each score
    terms = data["neuron"]["terms"]
    assert [t["name"] for t in terms] == list(expected)
    for t in terms:
        got = np.array([np.reshape(t["maps"][t["index"][0][h]], (LQ, LK)) for h in range(H)])
        want = expected[t["name"]]
        assert np.abs(got - want).max() <= 1e-7 * np.abs(want).max()  # 8 significant digits on the page


# --------------------------------------------------------------------------- differential attention


def test_differential_attention_shows_its_two_maps_and_the_gradient_through_the_pair():
    torch = pytest.importorskip("torch")
    Hd = 4
    mha = MultiHeadAttention(E, Hd, diff_attention=True, num_kv_heads=2, diff_layer_idx=2, rng=3)
    rng = np.random.default_rng(4)
    for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        mha.params[n][...] = rng.normal(0, 0.3, mha.params[n].shape)
    q, kv, mask = inputs(3)
    _, cache = mha.forward(q, kv, kv, mask=mask)
    G = rng.standard_normal((2, LQ, E))
    page = explore_attention(mha, cache, mask=mask, batch=1, d_output=G)
    data = page.data
    p = mha.params
    lam_init = 0.8 - 0.6 * np.exp(-0.3 * 2)
    lam = np.exp(p["lambda_q1"] @ p["lambda_k1"]) - np.exp(p["lambda_q2"] @ p["lambda_k2"]) + lam_init
    assert data["layers"] == ["map 1: A_p", f"map 2: A_(p+H/2), subtracted × λ = {lam:.4g}"]
    assert data["heads"] == Hd // 2
    A = cache.attn_weights[1]  # (H, Lq, Lk)
    for layer, part in enumerate((A[: Hd // 2], A[Hd // 2 :])):
        assert page_maps(data, "attn", layer, (LQ, LK)).tolist() == np.rint(part * 1000).astype(int).tolist()
    assert data["neuron"] is not None and data["neuron"]["vnorm"] is None  # a pair has one value: no per-head size

    # dL/dA for L = <G, output>, output = W_o merge((1 - λ_init) RMSNorm(A_p V - λ A_(p+H/2) V)) + b_o, by autograd
    At = torch.tensor(cache.attn_weights, requires_grad=True)
    V = torch.tensor(np.repeat(cache.V, 2, axis=1))  # (B, H, Lk, 2d): query head h reads key/value head h // 2
    C = At @ V  # (B, H, Lq, 2d)
    D = C[:, : Hd // 2] - lam * C[:, Hd // 2 :]
    N = (1 - lam_init) * D / torch.sqrt((D * D).mean(-1, keepdim=True) + mha.diff_norm_eps)
    out = N.transpose(1, 2).reshape(2, LQ, E) @ torch.tensor(p["W_o"]).T + torch.tensor(p["b_o"])
    (torch.tensor(G) * out).sum().backward()
    want = At.grad.numpy()
    got = weight_grads(mha, cache, G)
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
    assert data["grad"] is not None and len(data["grad"]["g"]) == 2  # the gradient view, per map


# --------------------------------------------------------------------------- latent attention


def test_latent_attention_shows_its_per_head_maps():
    mla = MultiHeadLatentAttention(16, 4, 8, 4, 4, 6, rng=0)
    x = np.random.default_rng(5).standard_normal((2, 6, 16))
    causal = np.tril(np.ones((6, 6), dtype=bool))
    _, cache = mla.forward(x, mask=causal)
    data = explore_attention(mla, cache, mask=causal, batch=1).data
    assert data["heads"] == 4 and data["neuron"] is None and data["grad"] is None
    A = cache.attn_weights[1]
    assert page_maps(data, "attn", 0, (6, 6)).tolist() == np.rint(A * 1000).astype(int).tolist()
    assert data["masks"] == ["".join("0" if c else "1" for c in causal.ravel())]
    with pytest.raises(ValueError, match=r"^d_output: latent attention"):
        explore_attention(mla, cache, d_output=np.zeros((2, 6, 16)))


# --------------------------------------------------------------------------- text


def test_lone_surrogates_reach_the_page_as_U_FFFD_and_pairs_as_their_character():
    """Every text on the page is Unicode text: tokens, key tokens, layer names, term and set names, as the title."""
    tokens = ["a\ud800", "\udcff", "\ud83d\ude00", "b"]  # high alone, low alone, a pair given as two halves
    A = np.full((1, 1, 4, 4), 0.25)
    page = explorer_html(A, tokens, key_tokens=tokens[::-1], layer_names=["\udc80L"], title="t\ud800")
    want = ["a\ufffd", "\ufffd", "😀", "b"]
    assert page.data["qtok"] == want and page.data["ktok"] == want[::-1]
    assert page.data["layers"] == ["\ufffdL"] and page.data["title"] == "t\ufffd"
    raw = re.search(r"<script id='explorer-data' type='application/json'>(.*?)</script>", page, re.S)[1]
    escapes = re.findall(r"\\u(d[89ab][0-9a-f]{2})(?:\\u(d[c-f][0-9a-f]{2}))?|\\u(d[c-f][0-9a-f]{2})", raw)
    assert escapes and all(hi and lo and not alone for hi, lo, alone in escapes)  # surrogates only in pairs
    assert json.loads(raw)["qtok"] == want
    sets = explorer_sets_html({"x\ud800": page}, title="s")
    assert [s["name"] for s in sets.data["sets"]] == ["x\ufffd"]
    mha = MultiHeadAttention(E, H, rng=0)
    q, kv, _ = inputs(B=1)
    _, cache = mha.forward(q, kv, kv)
    data = explore_attention(mha, cache, ["\ud800"] * LQ, ["\udc00"] * LK).data
    assert data["qtok"] == ["\ufffd"] * LQ and data["ktok"] == ["\ufffd"] * LK


@pytest.mark.parametrize("option", ["add_bias_kv", "add_zero_attn"])
def test_a_mask_over_the_given_keys_leaves_the_appended_key_allowed(option):
    """The module appends a key after the Lk given ones, which the call's mask does not cover (once: "mask does
    not broadcast"); every query may attend to it, as the module's append_keys has it."""
    mha = MultiHeadAttention(E, H, rng=4, **{option: True})
    q, kv, mask = inputs(4)
    fmask = np.where(mask, 0.5, -np.inf)
    for m in (mask, fmask):
        _, cache = mha.forward(q, kv, kv, mask=m)
        data = explore_attention(mha, cache, mask=m, batch=1).data  # its neuron view's softmax is checked too
        blocked = np.array([c == "1" for c in data["masks"][0]]).reshape(LQ, LK + 1)
        assert blocked.tolist() == np.c_[~mask, np.zeros(LQ, dtype=bool)].tolist()
        attn = page_maps(data, "attn", 0, (LQ, LK + 1))
        assert attn[:, FULL_ROW, -1].tolist() == [1000] * H  # the row with every given key blocked reads it alone


def test_alibi_and_the_relative_bias_leave_the_appended_key_alone():
    """With both terms and add_bias_kv, the relative bias was read for Lk + 1 keys and ALiBi, the rest, took its
    negative on the appended key; neither term reaches that key (the module adds them before appending it)."""
    mha = MultiHeadAttention(E, H, rng=5, alibi=True, rel_pos_max_distance=2, add_bias_kv=True)
    q, kv, _ = inputs(5, B=1)
    _, cache = mha.forward(q, kv, kv)
    terms = {t["name"]: t for t in explore_attention(mha, cache).data["neuron"]["terms"]}
    alibi = np.array(
        [np.reshape(terms["ALiBi"]["maps"][terms["ALiBi"]["index"][0][h]], (LQ, LK + 1)) for h in range(H)]
    )
    rel = terms["relative bias"]
    rel = np.array([np.reshape(rel["maps"][rel["index"][0][h]], (LQ, LK + 1)) for h in range(H)])
    assert (alibi[..., -1] == 0).all() and (rel[..., -1] == 0).all()
    assert np.abs(alibi[..., :LK] - alibi_by_hand(H, LQ, LK)).max() <= 1e-7


def test_a_score_change_the_explorer_does_not_name_is_other_not_alibi(monkeypatch):
    """An option that changes the scores and that explore_attention does not know (here the soft-cap, its name taken
    away) is the term "other score changes": ALiBi stays ALiBi, and the neuron view's softmax is the weights."""
    from mha_numpy.viz import explorer_sources

    monkeypatch.setattr(explorer_sources, "SCORE_CHANGES", (), raising=False)
    mha = MultiHeadAttention(E, H, softcap=0.8, alibi=True, rng=6)
    q, kv, _ = inputs(6, B=1)
    _, cache = mha.forward(q, kv, kv)
    terms = {t["name"]: t for t in explore_attention(mha, cache).data["neuron"]["terms"]}
    assert list(terms) == ["ALiBi", "other score changes"]
    alibi = np.array([np.reshape(terms["ALiBi"]["maps"][terms["ALiBi"]["index"][0][h]], (LQ, LK)) for h in range(H)])
    assert np.abs(alibi - alibi_by_hand(H, LQ, LK)).max() <= 1e-7


def test_sinks_refuse_a_sentence_pair_naming_both():
    mha = MultiHeadAttention(E, H, sinks=True, rng=0)
    x = inputs(B=1)[0]
    _, cache = mha.forward(x, x, x)
    with pytest.raises(ValueError, match=r"^sentence_b_start with sinks is not supported"):
        explore_attention(mha, cache, sentence_b_start=2)
