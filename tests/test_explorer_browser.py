"""The explorer page in a real browser (headless Chromium): what it draws, against mha_numpy's own arrays.

Pages: a real BERT sentence (6 layers x 12 heads); one MultiHeadAttention cross-attention with a mask that
blocks a padded key for every query and every key of one query (a fully masked row); modules whose scores
have more terms than q·k × scale (ALiBi, a relative-position bias, a finite float mask, all of them with
grouped-query heads and RoPE); and a page of hostile text (tokens, title, layer names).
Expected numbers come from the arrays mha_numpy computed (attention weights, Q, K, V, W_o) or from the
formulas written out in the test, never from the page.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from browser import Browser, console_errors, requested_urls
from helpers import alibi_by_hand, rel_bias_by_hand

from mha_numpy import MultiHeadAttention
from mha_numpy import functional as F
from mha_numpy.__main__ import main
from mha_numpy.latent import MultiHeadLatentAttention
from mha_numpy.viz import explore_attention, explore_bert, explorer_html, explorer_sets_html
from mha_numpy.viz.explorer_sources import bert_caches

try:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
except ImportError:  # the browser fixture then skips each test with the reason (a failure under CI)
    ActionChains = By = None

SENTENCE = "The cat sat on the mat because it was tired."
LQ, LK, FULL_ROW, PAD_KEY = 4, 5, 3, 4  # the MHA example: query 3 may attend to nothing, key 4 is padding


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


@pytest.fixture(scope="module")
def bert_page(tmp_path_factory):
    from mha_numpy.bert import BertModel

    model = BertModel.from_pretrained(dtype=np.float64)
    inputs = model.tokenize(SENTENCE)
    out, caches = bert_caches(model, inputs)
    path = tmp_path_factory.mktemp("bert") / "bert.html"
    explore_bert(model, SENTENCE).save(path)
    return {"path": path, "attn": np.stack([a[0] for a in out.attentions]), "tokens": inputs.tokens[0]}


@pytest.fixture(scope="module")
def mha_page(tmp_path_factory):
    rng = np.random.default_rng(3)
    mha = MultiHeadAttention(8, 2, rng=rng)
    for name in ("b_q", "b_k", "b_v"):
        mha.params[name][...] = rng.normal(0, 0.3, 8)
    q, kv = rng.standard_normal((1, LQ, 8)), rng.standard_normal((1, LK, 8))
    mask = np.ones((1, 1, LQ, LK), dtype=bool)
    mask[..., PAD_KEY] = False
    mask[0, 0, FULL_ROW, :] = False
    _, cache = mha.forward(q, kv, kv, mask=mask)
    path = tmp_path_factory.mktemp("mha") / "mha.html"
    explore_attention(mha, cache, mask=mask).save(path)
    return {"path": path, "mha": mha, "cache": cache, "mask": mask}


def lines(driver) -> set[tuple[int, int, int]]:
    """The (query, key, head) of every line the head view draws."""
    script = (
        "return [...document.querySelectorAll('#head-svg line.attn')]"
        ".map(l => [+l.dataset.q, +l.dataset.k, +l.dataset.h])"
    )
    return {tuple(x) for x in driver.execute_script(script)}


def expected_lines(attn: np.ndarray, heads, threshold: float, query=None) -> set[tuple[int, int, int]]:
    """attn (H, Lq, Lk): the pairs at or above the threshold, at the page's rounding (thousandths)."""
    thousandths = np.rint(attn / 1e-3)
    keep = (thousandths >= round(threshold * 1000)) & (thousandths > 0)
    return {(i, j, h) for h, i, j in zip(*np.nonzero(keep)) if h in heads and (query is None or i == query)}


def set_threshold(driver, value: float) -> None:
    box = driver.find_element(By.ID, "threshold")
    box.clear()
    box.send_keys(str(value))
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", box)


def select(driver, element_id: str, value) -> None:
    driver.execute_script(
        "const s = document.getElementById(arguments[0]); s.value = arguments[1]; s.dispatchEvent(new Event('change'))",
        element_id,
        str(value),
    )


def token(driver, side: str, index: int):
    return driver.find_element(By.CSS_SELECTOR, f"#head-svg text.tok.{side}[data-index='{index}']")


# --------------------------------------------------------------------------- the page stays offline and quiet


def test_request_detector_sees_a_request_to_the_network(browser, tmp_path):
    """The check below can fail: a page that loads an image from the network is caught."""
    leaky = tmp_path / "leaky.html"
    leaky.write_text("<!DOCTYPE html><img src='http://127.0.0.1:9/x.png'>")
    d = browser.open(leaky)
    assert any(u.startswith("http://127.0.0.1:9/") for u in requested_urls(d))


@pytest.mark.parametrize("page", ["bert_page", "mha_page"])
def test_no_console_errors_and_no_request_leaves_the_file(browser, page, request):
    path = request.getfixturevalue(page)["path"]
    d = browser.open(path)
    assert d.execute_script("return document.body.dataset.ready") == "1"
    for view in ("model", "neuron", "grad", "head"):
        d.find_element(By.ID, f"tab-{view}").click()
    ActionChains(d).move_to_element(token(d, "q", 1)).perform()
    d.find_element(By.ID, "tab-model").click()
    ActionChains(d).move_to_element(d.find_element(By.CSS_SELECTOR, "canvas.thumb")).perform()  # its tooltip
    d.find_element(By.CSS_SELECTOR, "canvas.thumb").click()  # back to the head view
    assert console_errors(d) == []
    assert [u for u in requested_urls(d) if u != path.resolve().as_uri()] == []
    assert d.execute_script("return performance.getEntriesByType('resource').length") == 0


# --------------------------------------------------------------------------- head view


def test_head_view_draws_one_line_per_visible_pair_above_the_threshold(browser, bert_page):
    d = browser.open(bert_page["path"])
    attn = bert_page["attn"]  # (layers, H, L, L)
    H = attn.shape[1]
    assert lines(d) == expected_lines(attn[0], {0}, 0.01)  # 12 heads: the first alone at first, not a hairball
    d.find_element(By.ID, "all-heads").click()
    got = lines(d)
    assert got == expected_lines(attn[0], range(H), 0.01)
    assert int(d.find_element(By.ID, "head-svg").get_attribute("data-lines")) == len(got)
    select(d, "layer", 2)
    set_threshold(d, 0.2)
    got = lines(d)
    assert got == expected_lines(attn[2], range(H), 0.2)
    assert 0 < len(got) < len(expected_lines(attn[2], range(H), 0.01))


def test_selecting_a_token_and_toggling_a_head(browser, bert_page):
    d = browser.open(bert_page["path"])
    attn = bert_page["attn"][0]  # layer 0: (H, L, L)
    H, L = attn.shape[0], attn.shape[1]
    all_heads = set(range(H))
    d.find_element(By.ID, "all-heads").click()
    ActionChains(d).move_to_element(token(d, "q", 3)).perform()  # hover: only token 3's lines
    assert lines(d) == expected_lines(attn, all_heads, 0.01, query=3)
    token(d, "q", 5).click()  # click pins token 5, the mouse stays on it
    pinned = expected_lines(attn, all_heads, 0.01, query=5)
    assert lines(d) == pinned and pinned
    d.find_element(By.CSS_SELECTOR, "#heads input[data-head='2']").click()  # head 2 off
    assert lines(d) == {x for x in pinned if x[2] != 2}
    ActionChains(d).move_to_element(token(d, "k", 1)).perform()  # hovering elsewhere keeps the pin
    assert lines(d) == {x for x in pinned if x[2] != 2}
    token(d, "q", 5).click()  # unpin: every query, head 2 still off
    ActionChains(d).move_to_element(d.find_element(By.TAG_NAME, "h1")).perform()
    assert lines(d) == expected_lines(attn, all_heads - {2}, 0.01)
    ActionChains(d).move_to_element(token(d, "k", L - 1)).perform()  # a key: only the lines into it
    assert lines(d) == {x for x in expected_lines(attn, all_heads - {2}, 0.01) if x[1] == L - 1}
    d.find_element(By.ID, "no-heads").click()
    assert lines(d) == set()


def blocks(driver) -> dict[tuple[int, int], float]:
    """{(key, head): weight} of the colour blocks beside the key tokens."""
    script = (
        "return [...document.querySelectorAll('#head-svg g.tokg.k rect.block')]"
        ".map(b => [+b.parentNode.parentNode.dataset.index, +b.dataset.h, +b.getAttribute('fill-opacity')])"
    )
    return {(j, h): w for j, h, w in driver.execute_script(script)}


def test_blocks_beside_the_keys_are_the_hovered_querys_weights_per_head(browser, bert_page):
    d = browser.open(bert_page["path"])
    attn = bert_page["attn"][0]  # layer 0: (H, L, L)
    L = attn.shape[1]
    ActionChains(d).double_click(d.find_element(By.CSS_SELECTOR, "#heads label:nth-of-type(8)")).perform()  # head 7
    assert lines(d) == expected_lines(attn, {7}, 0.01)  # double-click: that head alone
    d.find_element(By.CSS_SELECTOR, "#heads input[data-head='2']").click()  # and head 2
    assert set(blocks(d).values()) == {0.0}  # nothing hovered: no block shows
    ActionChains(d).move_to_element(token(d, "q", 8)).perform()
    got = blocks(d)
    assert set(got) == {(j, h) for j in range(L) for h in (2, 7)}
    for (j, h), w in got.items():
        assert w == pytest.approx(np.round(attn[h, 8, j], 3), abs=1e-9)
    width = "return [document.getElementById('head-svg').getBoundingClientRect().width, innerWidth]"
    svg_width, window_width = d.execute_script(width)
    assert 0.6 * window_width < svg_width < window_width  # the head view uses the window, and fits in it


# --------------------------------------------------------------------------- model view


def hover_cell(driver, canvas, i: int, j: int, Lq: int, Lk: int) -> str:
    """Move the mouse onto cell (query i, key j) of a map; -> the tooltip's text."""
    w, h = canvas.size["width"] - 2, canvas.size["height"] - 2  # minus the 1 px border
    x, y = (j + 0.5) * w / Lk - w / 2, (i + 0.5) * h / Lq - h / 2  # from the centre (selenium 4)
    ActionChains(driver).move_to_element_with_offset(canvas, round(x), round(y)).perform()
    assert driver.find_element(By.ID, "tooltip").is_displayed()
    return driver.find_element(By.ID, "tooltip").text


def test_model_view_has_a_colour_scale_token_labels_on_hover_and_no_layer_select(browser, bert_page):
    d = browser.open(bert_page["path"])
    attn, tokens = bert_page["attn"], bert_page["tokens"]
    L = len(tokens)
    assert d.find_element(By.ID, "layer").is_displayed()  # the head view has one layer at a time
    d.find_element(By.ID, "tab-model").click()
    assert not d.find_element(By.ID, "layer").is_displayed()  # the model view has them all
    assert d.find_element(By.ID, "model-scale").text.split() == ["attention", "weight", "0", "0.5", "1", "masked"]
    canvas = d.find_element(By.CSS_SELECTOR, "canvas.thumb[data-layer='4'][data-head='3']")
    for i, j in [(8, 1), (0, L - 1)]:
        text = hover_cell(d, canvas, i, j, L, L)
        assert text == f"layer 4, head 3: query {i} “{tokens[i]}” → key {j} “{tokens[j]}”: α = {attn[4, 3, i, j]:.3f}"
    grid_width = d.execute_script("return document.getElementById('model-grid').getBoundingClientRect().width")
    assert 800 < grid_width <= d.execute_script("return document.documentElement.clientWidth")  # fills, fits


def test_model_view_has_every_map_and_opens_the_clicked_head(browser, bert_page):
    d = browser.open(bert_page["path"])
    attn = bert_page["attn"]
    n_layers, H = attn.shape[:2]
    d.find_element(By.ID, "tab-model").click()
    assert len(d.find_elements(By.CSS_SELECTOR, "canvas.thumb")) == n_layers * H
    d.find_element(By.CSS_SELECTOR, "canvas.thumb[data-layer='3'][data-head='7']").click()
    assert d.execute_script("return document.body.dataset.view") == "head"
    assert d.find_element(By.ID, "layer").get_attribute("value") == "3"
    checked = d.execute_script("return [...document.querySelectorAll('#heads input')].filter(b => b.checked).length")
    assert checked == 1 and d.find_element(By.CSS_SELECTOR, "#heads input[data-head='7']").is_selected()
    assert lines(d) == expected_lines(attn[3], {7}, 0.01)


# --------------------------------------------------------------------------- neuron view


def neuron_rows(driver) -> list[dict]:
    script = """return [...document.querySelectorAll('#neuron-table tr[data-j]')].map(r => ({
        j: +r.dataset.j, masked: r.classList.contains('masked'),
        products: [...r.querySelectorAll('.strip.prod .cell')].map(c => +c.dataset.v),
        dot: +r.querySelector('td.dot').dataset.v, scaled: +r.querySelector('td.scaled').dataset.v,
        terms: [...r.querySelectorAll('td.term')].map(c => +c.dataset.v),
        mask: r.querySelector('td.mask') && r.querySelector('td.mask').dataset.v,
        score: r.querySelector('td.score').dataset.v,
        scoreText: r.querySelector('td.score').textContent, weight: +r.querySelector('td.weight').dataset.v}))"""
    return driver.execute_script(script)


def neuron_columns(driver) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('#neuron-table th')].map(t => t.title)")


def test_neuron_view_products_sum_to_the_score_mha_numpy_computed(browser, mha_page):
    mha, cache = mha_page["mha"], mha_page["cache"]
    d = browser.open(mha_page["path"])
    d.find_element(By.ID, "tab-neuron").click()
    h, i = 1, 2
    select(d, "neuron-head", h)
    select(d, "neuron-query", i)
    scale = 1 / np.sqrt(mha.head_dim)
    scores, _ = F.attention_scores_forward(cache.Q, cache.K, scale)  # (1, H, Lq, Lk)
    Q, K = cache.Q[0, h], cache.K[0, h]  # (Lq, d), (Lk, d)
    q_step, k_step = np.abs(Q).max() / 2047, np.abs(K).max() / 2047  # the page's rounding of q and k
    rows = neuron_rows(d)
    assert [r["j"] for r in rows] == list(range(LK))
    for r in rows:
        j = r["j"]
        assert len(r["products"]) == mha.head_dim
        assert sum(r["products"]) == pytest.approx(r["dot"], rel=1e-6, abs=1e-9)
        bound = scale * np.sum(np.abs(Q[i]) * k_step / 2 + np.abs(K[j]) * q_step / 2 + q_step * k_step / 4)
        if j == PAD_KEY:
            assert r["masked"] and r["score"] == "-inf" and "masked" in r["scoreText"] and r["weight"] == 0
        else:
            assert not r["masked"]
            assert abs(float(r["score"]) - scores[0, h, i, j]) <= bound
            assert abs(r["dot"] * scale - scores[0, h, i, j]) <= bound
            assert r["weight"] == pytest.approx(cache.attn_weights[0, h, i, j], abs=2e-3)


def test_neuron_view_value_weighted_switch(browser, mha_page):
    mha, cache = mha_page["mha"], mha_page["cache"]
    d = browser.open(mha_page["path"])
    d.find_element(By.ID, "tab-neuron").click()
    h, i, dh = 0, 1, mha.head_dim
    select(d, "neuron-query", i)
    d.find_element(By.ID, "value-weighted").click()
    W_o_h = mha.params["W_o"][:, h * dh : (h + 1) * dh]  # (E, d): the columns of W_o that read head h
    alpha = cache.attn_weights[0, h, i]  # (Lk,)
    norms = np.array([np.linalg.norm(alpha[j] * W_o_h @ cache.V[0, h, j]) for j in range(LK)])  # ||a_ij v_j W_o,hᵀ||
    expected = norms / norms.sum()
    got = np.array([r["weight"] for r in neuron_rows(d)])
    np.testing.assert_allclose(got, expected, atol=3e-3)
    assert np.abs(expected - alpha).max() > 0.01  # the switch shows something else than the weights


# --------------------------------------------------------------------------- gradient view, dark mode, one layer


def test_gradient_view_shows_dp_of_the_backward_and_masked_cells(browser, mha_page):
    mha, cache, mask = mha_page["mha"], mha_page["cache"], mha_page["mask"]
    G = np.random.default_rng(0).standard_normal((1, LQ, 8))  # explore_attention's upstream gradient: seed 0
    V, W = cache.V, mha.params["W_o"].reshape(8, 2, 4)  # (B, H, Lk, d), (E, H, d)
    dP = np.einsum("bie,ehc,bhjc->bhij", G, W, V)[0]  # d<G, output>/dP written out: (H, Lq, Lk)
    d = browser.open(mha_page["path"])
    assert not d.find_element(By.ID, "layer").is_displayed()  # one layer: no layer select
    d.find_element(By.ID, "tab-grad").click()
    assert "dL/dα for L = ⟨G, output⟩" in d.find_element(By.ID, "grad-note").text
    maps = d.find_elements(By.CSS_SELECTOR, "#grad-grid canvas.grad")
    assert len(maps) == 2
    for h, (i, j) in [(0, (1, 2)), (1, (2, 0))]:
        text = hover_cell(d, maps[h], i, j, LQ, LK)
        got = float(text.split("dL/dα = ")[1].split(",")[0])
        top = np.abs(np.where(mask[0, 0], dP[h], 0)).max()
        assert abs(got - dP[h, i, j]) <= top / 2047 + abs(dP[h, i, j]) * 5e-3  # 12 bits of the top, 3 digits
    assert hover_cell(d, maps[0], 0, PAD_KEY, LQ, LK).endswith("masked (α fixed at 0)")


def test_dark_mode_switches_every_colour(browser, mha_page):
    d = browser.open(mha_page["path"])
    background = "return getComputedStyle(document.body).backgroundColor"
    pixel = (
        "const c = document.querySelector('canvas.thumb'); const s = c.width / arguments[0];"
        "return [...c.getContext('2d').getImageData(0.5 * s, 0.5 * s, 1, 1).data]"
    )
    assert d.execute_script(background) == "rgb(255, 255, 255)"
    d.find_element(By.ID, "tab-model").click()
    light = d.execute_script(pixel, LK)
    d.find_element(By.ID, "theme").click()
    assert d.execute_script("return document.documentElement.dataset.theme") == "dark"
    assert d.execute_script(background) == "rgb(21, 22, 26)"
    dark = d.execute_script(pixel, LK)
    assert sum(dark[:3]) < sum(light[:3]) - 200  # the map is drawn again, darker
    for view in ("grad", "neuron", "head"):  # every view drawn in the dark theme
        d.find_element(By.ID, f"tab-{view}").click()
    d.find_element(By.ID, "theme").click()
    assert d.execute_script(background) == "rgb(255, 255, 255)"
    assert console_errors(d) == []


# --------------------------------------------------------------------------- filters and sentence pairs


@pytest.fixture(scope="module")
def pair_page(tmp_path_factory):
    rng = np.random.default_rng(9)
    A = F.softmax_forward(rng.normal(0, 2, (3, 6, 7, 7)))[0]  # 3 layers, 6 heads, 7 tokens
    tokens = ["[CLS]", "a", "b", "[SEP]", "c", "d", "[SEP]"]
    path = tmp_path_factory.mktemp("pair") / "pair.html"
    explorer_html(A, tokens, include_layers=[2, 0], include_heads=[4, 1], heads=[1], sentence_b_start=4).save(path)
    return {"path": path, "attn": A}


def test_filters_and_sentence_pair_views(browser, pair_page):
    A = pair_page["attn"]
    d = browser.open(pair_page["path"])
    texts = "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim())"
    assert d.execute_script(texts, "#layer option") == ["layer 2", "layer 0"]
    assert d.execute_script(texts, "#heads label") == ["4", "1"]
    assert [b.is_selected() for b in d.find_elements(By.CSS_SELECTOR, "#heads input")] == [False, True]
    as_model = {(i, j, 1 if h == 1 else 0): None for i, j, h in expected_lines(A[2], {1}, 0.01)}
    assert lines(d) == set(as_model)  # layer 2, head 1: position 1 on the page
    shown = "return [...document.querySelectorAll('#head-svg text.tok.' + arguments[0])].map(t => +t.dataset.index)"
    for pair, qs, ks in [
        ("AB", range(4), range(4, 7)),
        ("BA", range(4, 7), range(4)),
        ("BB", range(4, 7), range(4, 7)),
    ]:
        select(d, "pair", pair)
        assert d.execute_script(shown, "q") == list(qs) and d.execute_script(shown, "k") == list(ks)
        expected = {(i, j, 1) for i, j, _ in expected_lines(A[2], {1}, 0.01) if i in qs and j in ks}
        assert lines(d) == expected and expected
    select(d, "layer", 1)  # layer 0 of the model
    select(d, "pair", "all")
    d.find_element(By.ID, "all-heads").click()
    assert lines(d) == {(i, j, 0 if h == 4 else 1) for i, j, h in expected_lines(A[0], {4, 1}, 0.01)}
    assert console_errors(d) == []


def test_encoder_decoder_page_switches_between_its_attention_sets(browser, tmp_path):
    rng = np.random.default_rng(8)
    dec, cross = MultiHeadAttention(8, 2, rng=rng), MultiHeadAttention(8, 2, rng=rng)
    src, tgt = rng.standard_normal((1, 5, 8)), rng.standard_normal((1, 3, 8))
    causal = np.tril(np.ones((3, 3), bool))
    _, cd = dec.forward(tgt, tgt, tgt, mask=causal)
    _, cc = cross.forward(tgt, src, src)
    s, t = list("abcde"), ["<s>", "x", "y"]
    name = "<img src=x onerror=injected=5>"  # a set's name is text, never HTML
    sets = {name: explore_attention(dec, cd, t, t, mask=causal), "cross": explore_attention(cross, cc, t, s)}
    path = tmp_path / "seq2seq.html"
    explorer_sets_html(sets, title="an encoder-decoder </script>").save(path)
    d = browser.open(path)
    tokens = (
        "return [...document.querySelectorAll('#head-svg text.tok.' + arguments[0] + ' tspan')].map(t => t.textContent)"
    )
    assert d.find_element(By.ID, "set").is_displayed() and d.execute_script("return window.injected") is None
    options = "return [...document.querySelectorAll('#set option')].map(o => o.textContent)"
    assert d.execute_script(options) == [name, "cross"] and d.title == "an encoder-decoder </script>"
    assert d.execute_script(tokens, "q") == t and d.execute_script(tokens, "k") == t
    token(d, "q", 0).click()  # query 0 of the decoder sees key 0 only
    assert lines(d) == expected_lines(cd.attn_weights[0], {0, 1}, 0.01, query=0) == {(0, 0, 0), (0, 0, 1)}
    select(d, "set", 1)  # the cross-attention: the decoder's tokens attend to the encoder's
    ActionChains(d).move_to_element(d.find_element(By.TAG_NAME, "h1")).perform()  # the mouse off the tokens
    assert d.execute_script(tokens, "q") == t and d.execute_script(tokens, "k") == s
    assert lines(d) == expected_lines(cc.attn_weights[0], {0, 1}, 0.01)
    d.find_element(By.ID, "tab-neuron").click()
    assert len(neuron_rows(d)) == 5
    assert d.find_element(By.TAG_NAME, "h1").text == "an encoder-decoder </script>" and console_errors(d) == []


# --------------------------------------------------------------------------- masks


def test_fully_masked_row_and_padded_key_are_drawn_as_masked(browser, mha_page):
    d = browser.open(mha_page["path"])
    q_full = token(d, "q", FULL_ROW)
    assert "fully-masked" in q_full.get_attribute("class") and "⊘" in q_full.text
    assert all("fully-masked" not in token(d, "q", i).get_attribute("class") for i in range(LQ) if i != FULL_ROW)
    assert "masked" in token(d, "k", PAD_KEY).get_attribute("class").split()
    assert all(q != FULL_ROW and k != PAD_KEY for q, k, _ in lines(d))
    token(d, "q", FULL_ROW).click()  # its keys are all masked, and it has no line
    assert lines(d) == set()
    assert all("masked" in token(d, "k", j).get_attribute("class").split() for j in range(LK))
    d.find_element(By.ID, "tab-neuron").click()
    select(d, "neuron-query", FULL_ROW)
    rows = neuron_rows(d)
    assert all(r["masked"] and r["weight"] == 0 for r in rows)
    assert "Fully masked row" in d.find_element(By.ID, "neuron-caption").text


# --------------------------------------------------------------------------- every score term


TERMS = {  # module options, a finite float mask or not
    "alibi": (dict(alibi=True), False),
    "relative bias": (dict(rel_pos_max_distance=2), False),
    "float mask": ({}, True),
    "all, grouped-query, rope": (dict(alibi=True, rel_pos_max_distance=2, num_kv_heads=2, rope_theta=100.0), True),
}


@pytest.fixture(scope="module", params=list(TERMS))
def terms_page(request, tmp_path_factory):
    options, float_mask = TERMS[request.param]
    rng = np.random.default_rng(5)
    Lq, Lk = 4, 6
    mha = MultiHeadAttention(16, 4, rng=rng, **options)
    q, kv = rng.standard_normal((1, Lq, 16)), rng.standard_normal((1, Lk, 16))
    mask = None
    if float_mask:
        mask = rng.normal(0, 1.5, (1, 1, Lq, Lk))  # added to the scores
        mask[..., 1, 2] = -np.inf  # one blocked pair
    _, cache = mha.forward(q, kv, kv, mask=mask)
    path = tmp_path_factory.mktemp("terms") / "terms.html"
    explore_attention(mha, cache, mask=mask).save(path)
    return {"path": path, "mha": mha, "cache": cache, "mask": mask}


def expected_terms(mha, Lq: int, Lk: int, mask) -> dict[str, np.ndarray]:
    """{column: (H, Lq, Lk)} every term the module adds to q·k × scale, written out (not read from the page)."""
    H, terms = mha.num_heads, {}
    if mha.alibi:
        terms["ALiBi"] = alibi_by_hand(H, Lq, Lk)
    if "rel_bias" in mha.params:
        terms["relative bias"] = rel_bias_by_hand(mha.params["rel_bias"], Lq, Lk)
    if mask is not None:
        terms["mask"] = np.broadcast_to(mask[0], (H, Lq, Lk))
    return terms


def test_neuron_view_weights_are_the_models_with_every_score_term(browser, terms_page):
    mha, cache, mask = terms_page["mha"], terms_page["cache"], terms_page["mask"]
    H, Lq, Lk = cache.attn_weights.shape[1:]
    scale, group = 1 / np.sqrt(mha.head_dim), H // mha.num_kv_heads
    Q, K = cache.Q[0], cache.K[0][[h // group for h in range(H)]]  # query head h reads kv head h // (H / Hkv)
    terms = expected_terms(mha, Lq, Lk, mask)
    scores = scale * Q @ K.swapaxes(-1, -2) + sum(terms.values())  # (H, Lq, Lk), -inf where blocked
    np.testing.assert_allclose(scores, cache.attention.masked_scores[0], rtol=1e-12, atol=1e-12)  # as written out
    only_qk = F.softmax_forward(np.where(np.isneginf(scores), -np.inf, scale * Q @ K.swapaxes(-1, -2)))[0]
    assert np.abs(only_qk - cache.attn_weights[0]).max() > 0.05  # the terms matter: q·k × scale alone is wrong

    d = browser.open(terms_page["path"])
    d.find_element(By.ID, "tab-neuron").click()
    bias_names = [n for n in terms if n != "mask"]
    assert json.loads(d.find_element(By.ID, "neuron-caption").get_attribute("data-terms")) == bias_names
    assert neuron_columns(d)[4:-2] == ["× scale", *(f"+ {n}" for n in terms)]
    caption = d.find_element(By.ID, "neuron-caption").text
    assert "score_j = " + " + ".join(["q·k × scale", *terms]) in caption
    for h in range(H):
        select(d, "neuron-head", h)
        q_step, k_step = np.abs(Q[h]).max() / 2047, np.abs(K[h]).max() / 2047  # the page's rounding of q and k
        for i in range(Lq):
            select(d, "neuron-query", i)
            rows = neuron_rows(d)
            assert [r["j"] for r in rows] == list(range(Lk))
            # the page's score differs from the model's by the rounding of q and k (and 8 digits of each term)
            eps = scale * np.sum(np.abs(Q[h, i]) * k_step / 2 + np.abs(K[h]) * q_step / 2 + q_step * k_step / 4, -1)
            eps = eps.max() + 1e-7 * sum(np.abs(np.where(np.isinf(t), 0, t[h, i])).max() for t in terms.values())
            for r in rows:
                j = r["j"]
                assert r["scaled"] == pytest.approx(r["dot"] * scale, rel=1e-7)
                for got, name in zip(r["terms"], bias_names):
                    assert got == pytest.approx(terms[name][h, i, j], rel=1e-7, abs=1e-12)
                if mask is None:
                    assert r["mask"] is None
                elif np.isneginf(mask[0, 0, i, j]):
                    assert r["mask"] == "-inf" and r["score"] == "-inf" and r["masked"]
                else:
                    assert float(r["mask"]) == pytest.approx(mask[0, 0, i, j], rel=1e-7)
                if r["score"] != "-inf":
                    assert float(r["score"]) == pytest.approx(r["scaled"] + sum(r["terms"]) + float(r["mask"] or 0))
                    assert abs(float(r["score"]) - scores[h, i, j]) <= eps
            weights = np.array([r["weight"] for r in rows])
            # softmax moves each weight by at most a factor exp(±2 eps) when every score moves by at most eps
            assert np.abs(weights - cache.attn_weights[0, h, i]).max() <= np.expm1(2 * eps) + 1e-7


# --------------------------------------------------------------------------- hostile text


HOSTILE = [
    "<!--<script>",
    "</script>",
    "<script>window.injected = 1</script>",
    "<img src=x onerror='window.injected = 2'>",
    "<svg onload='window.injected = 3'>",
    "]]>",
    "--><!--",
    "\u2028",
    "\u2029",
    "'single' \"double\"",
    "back\\slash\\",
    "${window.injected = 4}",
    "&amp; &lt;b&gt; &#x41;",
    "😀",
    "\ud800",  # a lone surrogate: JSON allows it as an escape
    "",
    "x" * 5000,
]
LABEL_MAX = 32  # explorer.js: a longer token or name is shown cut, ending in "…"


def text(t: str) -> str:
    return t.replace("\ud800", "\ufffd")  # the page's text: a lone surrogate, which is no character, as U+FFFD


def shown(t: str) -> str:
    t = text(t)
    return t if len(t) <= LABEL_MAX else t[: LABEL_MAX - 1] + "…"


def codes(text: str) -> list[int]:
    return [ord(c) for c in text]  # code points, as the page's Array.from(text) sees them


@pytest.fixture(scope="module")
def hostile_page(tmp_path_factory):
    rng = np.random.default_rng(7)
    L, d = len(HOSTILE), 4
    Q, K = rng.normal(0, 1, (2, 2, L, d)), rng.normal(0, 1, (2, 2, L, d))
    A = F.softmax_forward(Q @ K.swapaxes(-1, -2) / 2)[0]  # (2 layers, 2 heads, L, L)
    title = "".join(HOSTILE[:15]) + "x" * 300
    layers = [HOSTILE[0] + HOSTILE[4], HOSTILE[-1]]
    path = tmp_path_factory.mktemp("hostile") / "hostile.html"
    page = explorer_html(A, HOSTILE, queries=Q, keys=K, layer_names=layers, title=title)
    page.save(path)
    return {"path": path, "title": title, "layers": layers}


CODES = "const c = (s) => Array.from(s, (ch) => ch.codePointAt(0));"


def test_hostile_text_shows_literally_and_the_script_runs(browser, hostile_page):
    d = browser.open(hostile_page["path"])
    assert d.execute_script("return document.body.dataset.ready") == "1"  # the script ran to its end
    assert d.execute_script("return window.injected") is None  # and nothing in the text ran
    counts = d.execute_script(
        "return [document.scripts.length, document.querySelectorAll('img, iframe, object, embed').length,"
        " document.querySelectorAll('svg').length, document.body.children.length]"
    )
    assert counts == [2, 0, 1, 4]  # the two scripts, the head view's svg, #explorer, #tooltip: none from the text
    title, layers = hostile_page["title"], hostile_page["layers"]
    got = d.execute_script(
        CODES + "return {title: c(document.title), h1: c(document.querySelector('h1').textContent),"
        " layers: [...document.querySelectorAll('#layer option')].map(o => [c(o.textContent), c(o.title)]),"
        " q: [...document.querySelectorAll('#head-svg text.tok.q')].map(t =>"
        "   [c(t.querySelector('tspan').textContent), c(t.querySelector('title').textContent)]),"
        " k: [...document.querySelectorAll('#head-svg text.tok.k')].map(t => c(t.querySelector('tspan').textContent))}"
    )
    assert got["title"] == codes(text(title)) and got["h1"] == codes(text(title))
    assert got["layers"] == [[codes(shown(n)), codes(text(n))] for n in layers]
    assert got["q"] == [[codes(shown(t)), codes(text(t))] for t in HOSTILE]
    assert got["k"] == [codes(shown(t)) for t in HOSTILE]
    assert len(lines(d)) > 0  # the head view is drawn
    svg_box = d.execute_script("const r = document.getElementById('head-svg').getBBox(); return [r.x, r.width]")
    assert svg_box[0] >= 0  # no label is pushed out of the picture on the left

    d.find_element(By.ID, "tab-model").click()
    got = d.execute_script(
        CODES + "return {th: [...document.querySelectorAll('#model-grid tr th[title]')].map(t =>"
        "   [c(t.textContent), c(t.title)]),"
        " canvas: [...document.querySelectorAll('canvas.thumb')].map(t => c(t.title))}"
    )
    assert got["th"] == [[codes(shown(n)), codes(text(n))] for n in layers]
    assert got["canvas"] == [codes(f"{n}, head {h}: click to open in the head view") for n in layers for h in (0, 1)]

    d.find_element(By.ID, "tab-neuron").click()
    select(d, "neuron-query", 0)
    got = d.execute_script(
        CODES + "return {options: [...document.querySelectorAll('#neuron-query option')].map(o =>"
        "   [c(o.textContent), c(o.title)]),"
        " keys: [...document.querySelectorAll('#neuron-table tr[data-j] td.tok')].map(t =>"
        "   [c(t.textContent), c(t.title)]),"
        " q: c(document.querySelector('#q-vector td.tok').title), caption: c(document.getElementById('neuron-caption')"
        "   .textContent)}"
    )
    assert got["options"] == [[codes(f"{i}: {shown(t)}"), codes(text(t))] for i, t in enumerate(HOSTILE)]
    assert got["keys"] == [[codes(shown(t)), codes(text(t))] for t in HOSTILE]
    assert got["q"] == codes(HOSTILE[0])
    caption = codes(f"{shown(layers[0])}, head 0, query 0 “{shown(HOSTILE[0])}”: score_j")
    assert got["caption"][: len(caption)] == caption
    assert len(neuron_rows(d)) == len(HOSTILE)
    assert console_errors(d) == []
    assert [u for u in requested_urls(d) if u != hostile_page["path"].resolve().as_uri()] == []


def test_bert_html_of_a_hostile_sentence_runs(browser, tmp_path, monkeypatch):
    """The CLI's page of `bert 'a <!--<script> b'`: its title holds the sentence."""
    monkeypatch.chdir(tmp_path)
    text = "a <!--<script> b </script> c"
    assert main(["bert", text, "--html", "p.html"]) == 0
    d = browser.open(tmp_path / "p.html")
    assert d.execute_script("return document.body.dataset.ready") == "1"
    assert text in d.find_element(By.TAG_NAME, "h1").text and text in d.title
    assert console_errors(d) == []


# --------------------------------------------------------------------------- the newer modules (issue 35)


NEWER = {  # from 4 queries to 5 keys, but MLA: self-attention of the 4
    "sinks, soft-cap": lambda: MultiHeadAttention(8, 2, sinks=True, softcap=1.0, rng=0),
    "differential": lambda: MultiHeadAttention(8, 4, diff_attention=True, num_kv_heads=2, rng=0),
    "latent": lambda: MultiHeadLatentAttention(8, 2, 4, 2, 2, 3, rng=0),
}


@pytest.mark.parametrize("kind", list(NEWER))
def test_newer_modules_pages_run_and_draw_their_views(browser, tmp_path, kind):
    """A sinks page's "⟨sink⟩" column and its neuron row (score = the sink's logit, weight = what no key took);
    differential attention's two maps as two layers; MLA's per-head maps (no neuron view)."""
    mha = NEWER[kind]()
    rng = np.random.default_rng(8)
    x, kv = rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 5, 8))
    mask = np.ones((4, 5), dtype=bool)
    mask[3] = False  # a query with no key: with sinks, its whole weight goes to the sink
    if kind == "latent":
        mask = np.tril(np.ones((4, 4), dtype=bool))
        _, cache = mha.forward(x, mask=mask)
    else:
        if kind == "sinks, soft-cap":
            mha.params["sinks"][...] = [1.0, -1.0]
        _, cache = mha.forward(x, kv, kv, mask=mask)
    explore_attention(mha, cache, mask=mask).save(tmp_path / "p.html")
    d = browser.open(tmp_path / "p.html")
    assert d.execute_script("return document.body.dataset.ready") == "1"
    A = cache.attn_weights[0]  # (H, Lq, Lk)
    H, Lq, Lk = A.shape
    keys = d.execute_script("return [...document.querySelectorAll('text.tok.k tspan')].map(t => t.textContent)")
    layers = d.execute_script("return [...document.querySelectorAll('#layer option')].map(o => o.title)")
    d.find_element(By.ID, "tab-model").click()
    thumbs = len(d.find_elements(By.CSS_SELECTOR, "canvas.thumb"))
    d.find_element(By.ID, "tab-neuron").click()
    if kind == "sinks, soft-cap":
        assert keys == [f"k{j}" for j in range(Lk)] + ["⟨sink⟩"] and thumbs == H
        assert neuron_columns(d)[5:-2] == ["+ soft-cap", "+ sink logit", "+ mask"]
        for h in range(H):
            select(d, "neuron-head", h)
            for i in range(Lq):
                select(d, "neuron-query", i)
                rows = neuron_rows(d)
                sink = rows[-1]
                assert sink["j"] == Lk and sink["dot"] == 0 and sink["terms"] == [0, mha.params["sinks"][h]]
                weights = np.array([r["weight"] for r in rows])  # from q and k rounded to 12 bits
                assert np.abs(weights[:Lk] - A[h, i]).max() <= 2e-3
                assert abs(sink["weight"] - (1 - A[h, i].sum())) <= 2e-3
                if i == 3:  # every key blocked: the whole row went to the sink
                    assert sink["weight"] == 1 and weights[:Lk].max() == 0
    elif kind == "differential":
        assert layers == ["map 1: A_p", layers[1]] and layers[1].startswith("map 2: A_(p+H/2), subtracted × λ = ")
        assert thumbs == 2 * (H // 2) and len(neuron_rows(d)) == Lk  # two layers of the H/2 pairs
        d.find_element(By.ID, "tab-grad").click()
        assert len(d.find_elements(By.CSS_SELECTOR, "canvas.grad")) == H // 2
    else:
        assert thumbs == H and "needs queries and keys" in d.find_element(By.ID, "neuron-view").text
    assert console_errors(d) == []
