"""The presentation style: larger fonts inside the block only, and SVG/PDF export."""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure

from mha_numpy import viz


def test_presentation_enlarges_fonts_inside_the_block_only():
    before = mpl.rcParams["font.size"]
    with viz.presentation(scale=1.5) as rc:
        assert mpl.rcParams["font.size"] == rc["font.size"] == 15 * 1.5 > before
        ax = Figure().add_subplot()
        ax.set_title("made inside")
    assert mpl.rcParams["font.size"] == before
    assert ax.title.get_fontsize() == 17 * 1.5  # a figure made inside keeps the style


def test_enlarge_fonts_scales_the_explicit_sizes_of_viz_figures():
    fig = viz.plot_attention(np.full((1, 2, 3, 3), 1 / 3))
    before = fig.axes[0].title.get_fontsize()
    assert viz.enlarge_fonts(fig, 2.0) is fig
    assert fig.axes[0].title.get_fontsize() == 2 * before


def test_export_figure_writes_svg_and_pdf(tmp_path):
    fig = viz.plot_attention(np.full((1, 1, 2, 2), 0.5))
    paths = viz.export_figure(fig, tmp_path / "slides" / "attn")
    assert [p.name for p in paths] == ["attn.svg", "attn.pdf"]
    assert paths[0].read_text().lstrip().startswith("<?xml") and paths[1].read_bytes().startswith(b"%PDF")
