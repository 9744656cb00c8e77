"""Screenshots of the explorer's views for the docs: docs/explorer_{head,masked,model,neuron,terms,grad,pair}.png.

Run from the repository root (needs chromium, chromium-driver and selenium, as the browser tests):
    PYTHONPATH=$PWD python scripts/explorer_screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the browser set-up the tests use

from browser import Browser  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from mha_numpy import MultiHeadAttention  # noqa: E402
from mha_numpy.bert import BertModel  # noqa: E402
from mha_numpy.commands._config import make_example  # noqa: E402
from mha_numpy.viz import explore_attention, explore_bert  # noqa: E402

SENTENCE = "The cat sat on the mat because it was tired."
PAIR = "The cat sat on the mat. It was tired."  # two sentences: B starts after the first "."


def run(driver, script: str, *args) -> None:
    driver.execute_script(script, *args)


def select(driver, element_id: str, value) -> None:
    run(driver, "const s = document.getElementById(arguments[0]); s.value = arguments[1];"
        "s.dispatchEvent(new Event('change'))", element_id, str(value))  # fmt: skip


def shot(driver, name: str) -> None:
    path = ROOT / "docs" / name
    driver.find_element(By.ID, "explorer").screenshot(str(path))  # the box's pixels: a tooltip over it too
    print(f"wrote {path.relative_to(ROOT)}")


def main() -> None:
    out = Path(tempfile.mkdtemp())
    model = BertModel.from_pretrained(dtype=np.float32)
    explore_bert(model, SENTENCE).save(out / "bert.html")
    tokens = model.tokenize(PAIR).tokens[0]
    b_start = tokens.index(".") + 1
    title = f"BERT on a sentence pair (B starts at token {b_start}), dark theme"
    explore_bert(model, PAIR, sentence_b_start=b_start, layer=2, heads=[0, 7, 11], title=title).save(out / "pair.html")
    args = type("Args", (), dict(embed_dim=8, heads=2, no_bias=False, kdim=None, vdim=None, seed=0, batch=1,
                                 lq=5, lk=6, mask="fully-masked-row"))()  # fmt: skip
    mha, q, k, v, mask = make_example(args)
    mask[..., 5] = False  # and the last key is padding
    _, cache = mha.forward(q, k, v, mask=mask)
    title = "One MultiHeadAttention: a padded key (k5) and a fully masked query (q4)"
    explore_attention(mha, cache, mask=mask, title=title).save(out / "mha.html")
    rng = np.random.default_rng(5)
    mha = MultiHeadAttention(16, 4, alibi=True, rel_pos_max_distance=2, rng=rng)
    q, kv = rng.standard_normal((1, 4, 16)), rng.standard_normal((1, 6, 16))
    mask = rng.normal(0, 1.5, (1, 1, 4, 6))  # a float mask: added to the scores
    mask[..., 1, 2] = -np.inf  # and one blocked pair
    _, cache = mha.forward(q, kv, kv, mask=mask)
    title = "MultiHeadAttention(alibi=True, rel_pos_max_distance=2) with a float mask"
    explore_attention(mha, cache, mask=mask, title=title).save(out / "terms.html")

    b = Browser()
    try:
        b.driver.set_window_size(1200, 1400)
        d = b.open(out / "bert.html")
        select(d, "layer", 2)
        d.find_element(By.ID, "no-heads").click()
        for h in (0, 7, 11):
            d.find_element(By.CSS_SELECTOR, f"#heads input[data-head='{h}']").click()
        d.find_element(By.CSS_SELECTOR, "#head-svg text.tok.q[data-index='8']").click()  # pin "it"
        shot(d, "explorer_head.png")
        d.find_element(By.ID, "tab-model").click()
        thumb = d.find_element(By.CSS_SELECTOR, "canvas.thumb[data-layer='1'][data-head='2']")
        ActionChains(d).move_to_element_with_offset(thumb, 6, -10).perform()  # a tooltip: the tokens and the weight
        shot(d, "explorer_model.png")
        d.find_element(By.ID, "tab-neuron").click()
        select(d, "neuron-head", 7)
        select(d, "neuron-query", 8)
        shot(d, "explorer_neuron.png")
        d.find_element(By.ID, "tab-grad").click()
        shot(d, "explorer_grad.png")
        d = b.open(out / "pair.html")
        d.find_element(By.ID, "theme").click()
        select(d, "pair", "BA")
        d.find_element(By.CSS_SELECTOR, "#head-svg text.tok.q[data-index='8']").click()  # pin "it"
        shot(d, "explorer_pair.png")
        d = b.open(out / "mha.html")
        shot(d, "explorer_masked.png")
        d = b.open(out / "terms.html")
        d.find_element(By.ID, "tab-neuron").click()
        select(d, "neuron-query", 1)
        shot(d, "explorer_terms.png")
    finally:
        b.close()


if __name__ == "__main__":
    main()
