"""mha_numpy.viz: every figure renders headless, and holds what it claims (panels, labels, 0..1, masked cells)."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mha_numpy import MultiHeadAttention, masks, viz
from mha_numpy.__main__ import main
from mha_numpy.gradcheck import GradcheckReport, check_mha

matplotlib.use("Agg")

B, LQ, LK = 2, 3, 5
QT = ["the", "cat", "sat"]
KT = ["a", "dog", "ran", "far", "away"]
LENGTHS = np.array([5, 3])  # the second sequence has 2 padding keys


def attention(H: int, mask=None):
    """Real attention weights (B, H, Lq, Lk) from a module, with Lq != Lk."""
    rng = np.random.default_rng(H)
    mha = MultiHeadAttention(8, H, rng=rng)
    q, kv = rng.standard_normal((B, LQ, 8)), rng.standard_normal((B, LK, 8))
    _, cache = mha.forward(q, kv, kv, mask=mask)
    return cache


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    data = buf.getvalue()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return data


def image_axes(fig: Figure):
    """The heatmap panels (colorbars hold no AxesImage)."""
    return [ax for ax in fig.axes if ax.images]


def texts(labels) -> list[str]:
    return [t.get_text() for t in labels]


def masked_cells(ax) -> set[tuple[int, int]]:
    """The (row, col) cells covered by the hatched 'masked' overlay of a panel."""
    cells = set()
    for coll in ax.collections:
        if coll.get_gid() != "masked":
            continue
        assert coll.get_hatch() == viz.MASKED_HATCH
        for path in coll.get_paths():
            x0, y0 = path.vertices.min(axis=0)
            cells.add((int(round(y0 + 0.5)), int(round(x0 + 0.5))))
    return cells


def pixel_rgb(fig: Figure, ax, row: int, col: int) -> np.ndarray:
    """Mean RGB of a small square around the centre of cell (row, col) as rendered by Agg."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    buf = np.asarray(canvas.buffer_rgba())[..., :3].astype(float)
    x, y = ax.transData.transform((col, row))
    px, py = int(round(x)), int(round(buf.shape[0] - y))
    return buf[py - 3 : py + 4, px - 3 : px + 4].reshape(-1, 3).mean(axis=0)


def colorbar_range(fig: Figure) -> tuple[float, float]:
    bars = [im.colorbar for ax in image_axes(fig) for im in ax.images if im.colorbar is not None]
    assert len(bars) == 1, "one shared colorbar"
    lo, hi = bars[0].ax.get_ylim()
    return lo, hi


@pytest.fixture(autouse=True)
def no_pyplot_figures_left():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    yield
    assert plt.get_fignums() == before, "viz must not leave figures open in pyplot"


# --------------------------------------------------------------------------- plot_attention


@pytest.mark.parametrize("H", [1, 2, 8])
def test_plot_attention_one_panel_per_head_tokens_colorbar_and_masked_cells(H):
    mask = masks.padding_mask(LENGTHS, LK)  # (B, 1, 1, Lk)
    w = attention(H, mask).attn_weights  # (B, H, Lq, Lk)
    fig = viz.plot_attention(w, QT, KT, batch=1, mask=mask)
    png_bytes(fig)
    axes = image_axes(fig)
    assert len(axes) == H
    blocked = {(i, j) for i in range(LQ) for j in range(LENGTHS[1], LK)}
    for h, ax in enumerate(axes):
        np.testing.assert_array_equal(ax.images[0].get_array(), w[1, h])
        assert ax.get_title() == f"head {h}"
        assert texts(ax.get_xticklabels()) == KT
        if h % 4 == 0:  # the first panel of each row of 4 carries the query labels
            assert texts(ax.get_yticklabels()) == QT
        assert masked_cells(ax) == blocked
        assert {tuple(c) for c in np.argwhere(w[1, h] == 0)} == blocked  # the marked cells are the zero weights
    assert colorbar_range(fig) == (0.0, 1.0)


def test_plot_attention_masked_cell_is_drawn_grey_not_as_a_small_weight():
    mask = masks.padding_mask(LENGTHS, LK)
    w = attention(2, mask).attn_weights
    marked = viz.plot_attention(w, QT, KT, batch=1, mask=mask)
    plain = viz.plot_attention(w, QT, KT, batch=1)  # same weights, no mask given: a plain 0
    r, c = 0, LK - 1  # a padding key, weight exactly 0
    grey = pixel_rgb(marked, image_axes(marked)[0], r, c)
    zero = pixel_rgb(plain, image_axes(plain)[0], r, c)
    assert np.ptp(grey) < 25 and grey.mean() > 120, f"masked cell should be light grey, got {grey}"
    assert np.ptp(zero) > 40, f"an unmasked zero is drawn in colour (viridis), got {zero}"
    assert masked_cells(image_axes(plain)[0]) == set()


def test_plot_attention_head_subset_and_3d_input():
    w = attention(8).attn_weights
    fig = viz.plot_attention(w, heads=[0, 5], batch=1)
    axes = image_axes(fig)
    assert [ax.get_title() for ax in axes] == ["head 0", "head 5"]
    np.testing.assert_array_equal(axes[1].images[0].get_array(), w[1, 5])
    assert texts(axes[0].get_xticklabels()) == [str(j) for j in range(LK)]
    assert len(image_axes(viz.plot_attention(w[0]))) == 8  # (H, Lq, Lk)
    titled = viz.plot_attention(w[0, [1, 3]], panel_titles=["layer 0\nhead 1", "layer 5\nhead 3"])  # (2, Lq, Lk)
    assert [ax.get_title() for ax in image_axes(titled)] == ["layer 0\nhead 1", "layer 5\nhead 3"]
    with pytest.raises(ValueError, match="panel_titles"):
        viz.plot_attention(w, panel_titles=["only one"])


def test_plot_attention_bad_input():
    w = attention(2).attn_weights
    with pytest.raises(ValueError, match="key_tokens"):
        viz.plot_attention(w, QT, KT[:-1])
    with pytest.raises(ValueError, match="head 2"):
        viz.plot_attention(w, heads=[2])
    with pytest.raises(ValueError, match="batch"):
        viz.plot_attention(w, batch=2)


# --------------------------------------------------------------------------- plot_mask


def test_plot_mask_padding_batch_one_panel_per_sequence():
    mask = masks.padding_mask(LENGTHS, LK)  # (B, 1, 1, Lk)
    kt = [KT, KT[:3] + ["[PAD]", "[PAD]"]]
    fig = viz.plot_mask(mask, QT, kt)
    png_bytes(fig)
    axes = image_axes(fig)
    assert len(axes) == B
    assert texts(axes[1].get_xticklabels()) == kt[1]
    assert texts(axes[0].get_yticklabels()) == QT
    assert masked_cells(axes[0]) == set()
    assert masked_cells(axes[1]) == {(i, j) for i in range(LQ) for j in (3, 4)}


def test_plot_mask_causal_and_additive():
    causal = masks.causal_mask(LQ, LK)
    fig = viz.plot_mask(causal, QT, KT)
    (ax,) = image_axes(fig)
    assert masked_cells(ax) == {tuple(c) for c in np.argwhere(~causal)}
    additive = masks.combine_masks(causal, np.linspace(-1, 1, LQ * LK).reshape(LQ, LK))  # float, -inf where blocked
    fig = viz.plot_mask(additive, QT, KT)
    png_bytes(fig)
    (ax,) = image_axes(fig)
    assert masked_cells(ax) == {tuple(c) for c in np.argwhere(~causal)}
    assert "added" in fig.axes[-1].get_ylabel()


# --------------------------------------------------------------------------- plot_step


def test_plot_step_2d_3d_4d_and_shape_in_title():
    rng = np.random.default_rng(0)
    x2, x3 = rng.standard_normal((LQ, 4)), rng.standard_normal((B, LQ, 8))
    fig = viz.plot_step(x2, "W")
    assert "(3, 4)" in fig.get_suptitle() and len(image_axes(fig)) == 1
    fig = viz.plot_step(x3, "query", batch=1, row_tokens=QT)
    (ax,) = image_axes(fig)
    np.testing.assert_array_equal(ax.images[0].get_array(), x3[1])
    assert "(2, 3, 8)" in fig.get_suptitle() and "batch 1" in fig.get_suptitle()
    assert texts(ax.get_yticklabels()) == QT and ax.get_xlabel() and ax.get_ylabel()
    png_bytes(fig)


@pytest.mark.parametrize("H", [1, 2, 8])
def test_plot_step_heads_side_by_side_with_masked_scores(H):
    mask = masks.causal_mask(LQ, LK)
    cache = attention(H, mask)
    fig = viz.plot_step(cache.Q, "Q", batch=1)  # (B, H, Lq, d)
    assert len(image_axes(fig)) == H and str(cache.Q.shape) in fig.get_suptitle()
    fig = viz.plot_step(cache.attention.masked_scores, "masked scores", row_tokens=QT, col_tokens=KT)
    png_bytes(fig)
    axes = image_axes(fig)
    assert len(axes) == H
    assert texts(axes[-1].get_xticklabels()) == KT
    for ax in axes:
        assert masked_cells(ax) == {tuple(c) for c in np.argwhere(~mask)}  # the -inf scores


# --------------------------------------------------------------------------- plot_gradcheck


def test_plot_gradcheck_log_scale_tolerance_line_and_zero_gradient_rows():
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(4, 2, rng=rng)
    q, kv = rng.standard_normal((B, 2, 4)), rng.standard_normal((B, 3, 4))
    report = check_mha(mha, q, kv, kv)
    fig = viz.plot_gradcheck(report)
    png_bytes(fig)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == [r.name for r in report.rows]
    assert any(np.allclose(line.get_ydata(), report.rtol) for line in ax.get_lines())
    points = [c for c in ax.collections if len(c.get_offsets())]
    assert len(points) == len(report.rows)
    zero = [i for i, r in enumerate(report.rows) if r.zero_gradient]
    assert zero, "b_k has a zero true gradient (softmax ignores a shift shared by all keys)"
    for i in zero:  # drawn at the absolute error, with the atol line to read it against
        assert points[i].get_offsets()[0][1] == pytest.approx(max(report.rows[i].max_abs_err, 1e-18))
    assert any(np.allclose(line.get_ydata(), report.atol) for line in ax.get_lines())
    assert "all PASS" in ax.get_title()


def test_plot_gradcheck_shows_a_failure():
    report = GradcheckReport()
    report.add("good", np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    report.add("bad", np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    fig = viz.plot_gradcheck(report)
    (ax,) = fig.axes
    assert "1 of 2 FAIL" in ax.get_title()
    bad = [c for c in ax.collections if len(c.get_offsets())][1]
    assert bad.get_offsets()[0][1] == pytest.approx(0.5 / 2.5)
    assert tuple(bad.get_facecolor()[0][:3]) == pytest.approx(matplotlib.colors.to_rgb("#d62728"))


# --------------------------------------------------------------------------- plot_model_view


@pytest.mark.parametrize("H", [1, 2, 8])
def test_plot_model_view_layers_by_heads(H):
    rng = np.random.default_rng(H)
    L = 4
    layers = [rng.dirichlet(np.ones(L), size=(B, H, L)) for _ in range(2)]  # 2 layers of (B, H, L, L)
    tokens = ["[CLS]", "hi", "there", "[SEP]"]
    fig = viz.plot_model_view(layers, tokens, batch=1)
    png_bytes(fig)
    axes = image_axes(fig)
    assert len(axes) == 2 * H
    np.testing.assert_array_equal(axes[H + H - 1].images[0].get_array(), layers[1][1, H - 1])  # layer 1, last head
    assert texts(axes[0].get_yticklabels()) == tokens
    assert texts(axes[-1].get_xticklabels()) == tokens
    assert colorbar_range(fig) == (0.0, 1.0)
    stacked = viz.plot_model_view(np.stack(layers)[:, 0], tokens, heads=[0])  # (layers, H, L, L)
    assert len(image_axes(stacked)) == 2


# --------------------------------------------------------------------------- tour --out


def test_tour_out_writes_pngs_and_prints_their_paths(tmp_path, capsys):
    out = tmp_path / "new" / "figs"  # does not exist yet
    assert main(["tour", "--out", str(out)]) == 0
    printed = [line.removeprefix("wrote ").strip() for line in capsys.readouterr().out.splitlines() if "wrote " in line]
    written = sorted(str(p) for p in out.glob("*.png"))
    assert printed and sorted(printed) == written
    names = {p.rsplit("/", 1)[-1] for p in written}
    assert {"05_scores.png", "06_mask.png", "08_attention_batch0.png", "08_attention_batch1.png"} <= names
    for p in written:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
