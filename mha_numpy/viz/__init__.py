"""Pictures of multi-head attention: attention maps, masks, intermediates, gradient checks.

Every function returns a ``matplotlib.figure.Figure`` built without pyplot: nothing is shown,
nothing stays open in pyplot's figure registry, and everything works headless (Agg). In a notebook
a returned Figure displays itself; elsewhere call ``fig.savefig("name.png")``.

Functions: ``plot_attention`` (one map per head), ``plot_model_view`` (layers x heads),
``plot_mask``, ``plot_step`` (any intermediate), ``plot_gradcheck`` (a ``GradcheckReport``),
the training figures of ``mha_numpy.train``, the presentation style for slides (``presentation``,
``enlarge_fonts``, ``export_figure``: ``mha_numpy.viz.style``), and
``explorer_html`` (the interactive HTML explorer, ``mha_numpy.viz.explorer``).

Conventions in every picture:
- Attention weights use one colour scale from 0 to 1 (a shared colorbar for all heads).
- Cells a mask blocks are drawn light grey and hatched (``///``), so that a blocked cell (weight
  exactly 0) never looks like a small weight. The hatched cells are one ``PatchCollection`` per
  panel with gid ``"masked"``, one square per blocked cell; a hatched swatch labelled "masked"
  sits under the colorbar.
- Masks follow mha_numpy's convention: bool ``True`` = may attend, float = added to the scores
  (``-inf`` = blocked). Shapes broadcast to (B, H, Lq, Lk).
"""

from .._optional import require

require("matplotlib", "mha_numpy.viz (figures)")  # missing: one message naming the extra, mha_numpy[viz]

from ._layout import (
    DIVERGING_CMAP,
    MASKED_EDGE,
    MASKED_FACE,
    MASKED_HATCH,
    WEIGHT_CMAP,
    blocked_cells,
)
from .checks import plot_gradcheck
from .explorer import ExplorerPage, explorer_html, explorer_sets_html, write_explorer
from .explorer_sources import explore_attention, explore_bert, explore_tiny
from .maps import plot_attention, plot_mask, plot_model_view, plot_step
from .style import enlarge_fonts, export_figure, presentation
from .training import plot_attention_over_training, plot_training_history

__all__ = [
    "DIVERGING_CMAP",
    "MASKED_EDGE",
    "MASKED_FACE",
    "MASKED_HATCH",
    "WEIGHT_CMAP",
    "ExplorerPage",
    "blocked_cells",
    "enlarge_fonts",
    "explore_attention",
    "explore_bert",
    "explore_tiny",
    "explorer_html",
    "explorer_sets_html",
    "export_figure",
    "plot_attention",
    "plot_attention_over_training",
    "plot_gradcheck",
    "plot_mask",
    "plot_model_view",
    "plot_step",
    "plot_training_history",
    "presentation",
    "write_explorer",
]
