"""Slide-ready figures: a presentation style (larger fonts and lines) and a vector export.

    from mha_numpy import viz

    with viz.presentation():                   # figures made inside use larger default fonts and lines
        fig = viz.plot_attention(weights, tokens=tokens)
    viz.enlarge_fonts(fig, 1.6)                  # and text given an explicit size (as viz's) grows too
    viz.export_figure(fig, "slides/attention")   # writes slides/attention.svg and slides/attention.pdf

Figures are built without pyplot, so the style must be active when a figure is *created* (matplotlib reads
its rc parameters then). ``viz``'s own figures set some font sizes explicitly, which rc parameters do not
change: ``enlarge_fonts`` scales every text of a finished figure.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib as mpl
from matplotlib.text import Text

PRESENTATION_RC = {
    "font.size": 15,
    "axes.titlesize": 17,
    "axes.labelsize": 15,
    "xtick.labelsize": 13,
    "ytick.labelsize": 13,
    "legend.fontsize": 13,
    "figure.titlesize": 19,
    "lines.linewidth": 2.5,
    "lines.markersize": 9,
    "axes.linewidth": 1.2,
    "savefig.bbox": "tight",
    "svg.fonttype": "none",  # text stays text in the SVG (editable, searchable)
    "pdf.fonttype": 42,  # TrueType in the PDF, as slide software expects
}


@contextmanager
def presentation(scale: float = 1.0, **overrides) -> Iterator[dict]:
    """Within the block, figures use PRESENTATION_RC (font sizes multiplied by ``scale``) and ``overrides``."""
    rc = {k: v * scale if k.endswith("size") else v for k, v in PRESENTATION_RC.items()}
    rc.update(overrides)
    with mpl.rc_context(rc):
        yield rc


def enlarge_fonts(fig, factor: float = 1.6):
    """Multiply the size of every text in ``fig`` (titles, labels, ticks, annotations) by ``factor``; return fig."""
    for text in fig.findobj(Text):
        text.set_fontsize(text.get_fontsize() * factor)
    return fig


def export_figure(fig, path, formats: Sequence[str] = ("svg", "pdf")) -> list[Path]:
    """Save ``fig`` as ``path`` + "." + each format (vector by default); create the folder; return the paths."""
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        target = base.with_name(f"{base.name}.{fmt}")
        fig.savefig(target, format=fmt, bbox_inches="tight")
        written.append(target)
    return written
