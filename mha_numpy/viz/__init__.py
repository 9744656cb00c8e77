"""Pictures of multi-head attention: attention maps, masks, intermediates, gradient checks.

Every function returns a ``matplotlib.figure.Figure`` built without pyplot: nothing is shown,
nothing stays open in pyplot's figure registry, and everything works headless (Agg). In a notebook
a returned Figure displays itself; elsewhere call ``fig.savefig("name.png")``.

Functions: ``plot_attention`` (one map per head), ``plot_model_view`` (layers x heads),
``plot_mask``, ``plot_step`` (any intermediate), ``plot_gradcheck`` (a ``GradcheckReport``),
``write_tour_figures`` (the PNGs of ``python -m mha_numpy tour --out DIR``), and the training
figures of ``mha_numpy.train``.

Conventions in every picture:
- Attention weights use one colour scale from 0 to 1 (a shared colorbar for all heads).
- Cells a mask blocks are drawn light grey and hatched (``///``), so that a blocked cell (weight
  exactly 0) never looks like a small weight. The hatched cells are one ``PatchCollection`` per
  panel with gid ``"masked"``, one square per blocked cell; a hatched swatch labelled "masked"
  sits under the colorbar.
- Masks follow mha_numpy's convention: bool ``True`` = may attend, float = added to the scores
  (``-inf`` = blocked). Shapes broadcast to (B, H, Lq, Lk).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.collections import PatchCollection
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .. import functional as F
from .style import enlarge_fonts, export_figure, presentation  # noqa: F401 - the presentation style

MASKED_FACE = "#d0d0d0"
MASKED_EDGE = "#707070"
MASKED_HATCH = "///"
WEIGHT_CMAP = "viridis"
DIVERGING_CMAP = "RdBu_r"

# --------------------------------------------------------------------------- helpers


def _labels(tokens: Sequence[str] | None, n: int, what: str) -> list[str]:
    """Tick labels: the tokens (checked against the axis length) or the indices 0 .. n-1."""
    if tokens is None:
        return [str(i) for i in range(n)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{what} has {len(tokens)} entries but the axis has length {n}")
    return tokens


def blocked_cells(mask, shape: tuple[int, ...]) -> np.ndarray:
    """Where ``mask`` blocks attention, as a bool array of ``shape`` (True = blocked).

    mask: bool (True = may attend) or float (added; ``-inf`` = blocked), broadcastable to ``shape``.
    """
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        blocked = ~m
    elif np.issubdtype(m.dtype, np.floating):
        blocked = np.isneginf(m)
    else:
        raise ValueError(f"mask must be bool (True = may attend) or float (added), got dtype {m.dtype} shape {m.shape}")
    try:
        return np.broadcast_to(blocked, shape)
    except ValueError:
        raise ValueError(f"mask with shape {m.shape} does not broadcast to {shape}") from None


def _mark_blocked(ax, blocked: np.ndarray) -> PatchCollection | None:
    """Draw a light-grey hatched square over every True cell of the 2-D ``blocked``."""
    rows, cols = np.nonzero(blocked)
    if rows.size == 0:
        return None
    squares = [Rectangle((c - 0.5, r - 0.5), 1.0, 1.0) for r, c in zip(rows, cols)]
    coll = PatchCollection(
        squares, facecolor=MASKED_FACE, edgecolor=MASKED_EDGE, hatch=MASKED_HATCH, linewidth=0.0, zorder=3
    )
    coll.set_gid("masked")
    ax.add_collection(coll)
    return coll


def _set_ticks(ax, xlabels, ylabels, *, show_x=True, show_y=True, fontsize=9, rotate=60) -> None:
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=rotate, ha="right" if rotate else "center", fontsize=fontsize)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=fontsize)
    ax.tick_params(labelbottom=show_x, labelleft=show_y, length=2)


def _annotate(ax, values: np.ndarray, blocked: np.ndarray | None, vmin: float, vmax: float, fmt: str) -> None:
    """Write each value in its cell, white on dark cells and black on light ones."""
    span = vmax - vmin if vmax > vmin else 1.0
    for (i, j), v in np.ndenumerate(values):
        if blocked is not None and blocked[i, j]:
            continue
        if not np.isfinite(v):
            continue
        dark = (v - vmin) / span < 0.55
        ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7, color="white" if dark else "black")


_CHAR_W = 0.075  # inches per character of a 9 pt tick label (DejaVu Sans, on average)


def _needs_rotation(labels: Sequence[str]) -> bool:
    return any(len(t) > 2 for t in labels)


def _panel_grid(
    n: int,
    ncols: int,
    rows: int,
    cols: int,
    cell: float,
    xlabels: Sequence[str],
    ylabels: Sequence[str],
    *,
    title: str,
    title_lines: int = 1,
    masked_key: bool = False,
) -> tuple[Figure, list, object]:
    """A figure of ``n`` heatmap panels (rows x cols cells each) in a grid, plus a colorbar axes.

    The layout is plain arithmetic in inches (tick-label room estimated from the label lengths):
    about twice as fast to draw as constrained layout, and the same figure for the same content.
    The grid is at most 12 inches wide (cells shrink to fit). ``title_lines``: lines of the panel
    titles (0 = none). With ``masked_key`` a small hatched
    swatch labelled "masked" sits under the colorbar. Returns (fig, axes, colorbar_axes).
    """
    nrows = math.ceil(n / ncols)
    rotated = _needs_rotation(xlabels)
    longest_x = max((len(t) for t in xlabels), default=1)
    longest_y = max((len(t) for t in ylabels), default=1)
    left = 0.35 + 0.1 + _CHAR_W * longest_y  # axis label + tick labels
    gap = 0.2  # between columns (only the first column carries tick labels)
    above = 0.12 + 0.19 * title_lines  # panel titles of that many lines
    below = 0.35 + (_CHAR_W * longest_x * 0.87 + 0.1 if rotated else 0.2)  # tick labels + axis label
    suptitle, right = 0.45, 1.15
    cell = min(cell, (12.0 - left - right - gap * (ncols - 1)) / (ncols * cols))
    pw, ph = cols * cell, rows * cell
    width = left + ncols * pw + (ncols - 1) * gap + right
    extra = max(0.0, 0.09 * len(title) + 0.4 - width)  # room for the title
    left, width = left + extra / 2, width + extra
    height = suptitle + nrows * (above + ph + below)

    fig = Figure(figsize=(width, height))
    axes = []
    for i in range(n):
        r, c = divmod(i, ncols)
        x0 = left + c * (pw + gap)
        y0 = height - suptitle - r * (above + ph + below) - above - ph
        axes.append(fig.add_axes((x0 / width, y0 / height, pw / width, ph / height)))
    top = height - suptitle - above
    bottom = top - (nrows - 1) * (above + ph + below) - ph
    if masked_key:
        swatch = fig.add_axes(((width - right + 0.25) / width, bottom / height, 0.15 / width, 0.15 / height))
        swatch.add_patch(
            Rectangle((0, 0), 1, 1, facecolor=MASKED_FACE, edgecolor=MASKED_EDGE, hatch=MASKED_HATCH, linewidth=0.5)
        )
        swatch.set_xlim(0, 1)
        swatch.set_ylim(0, 1)
        swatch.set_xticks([])
        swatch.set_yticks([])
        swatch.text(1.4, 0.5, "masked", transform=swatch.transAxes, va="center", fontsize=8)
        bottom += 0.35
    cax = fig.add_axes(((width - right + 0.25) / width, bottom / height, 0.15 / width, (top - bottom) / height))
    fig.suptitle(title, fontsize=11, y=1 - 0.22 / height, va="center")
    return fig, axes, cax


def _grid(n: int, ncols: int | None, max_cols: int = 4) -> tuple[int, int]:
    ncols = min(n, max_cols) if ncols is None else max(1, min(ncols, n))
    return math.ceil(n / ncols), ncols


def _pick_heads(num_heads: int, heads) -> list[int]:
    if heads is None:
        return list(range(num_heads))
    heads = [heads] if isinstance(heads, (int, np.integer)) else list(heads)
    for h in heads:
        if not 0 <= h < num_heads:
            raise ValueError(f"head {h} out of range: the weights have {num_heads} heads")
    return [int(h) for h in heads]


def _as_bhqk(x, name: str) -> np.ndarray:
    """(Lq, Lk) | (H, Lq, Lk) | (B, H, Lq, Lk) -> (B, H, Lq, Lk)."""
    a = np.asarray(x)
    if a.ndim not in (2, 3, 4):
        raise ValueError(f"{name} must be (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk), got shape {a.shape}")
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def _check_batch(batch: int, B: int, name: str) -> int:
    if not 0 <= batch < B:
        raise ValueError(f"batch={batch} out of range for {name} with batch size {B}")
    return int(batch)


# --------------------------------------------------------------------------- attention maps


def plot_attention(
    weights,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    heads: int | Sequence[int] | None = None,
    *,
    batch: int = 0,
    mask=None,
    title: str | None = None,
    ncols: int | None = None,
    annotate: bool = False,
    panel_size: float = 2.6,
    cmap: str = WEIGHT_CMAP,
    panel_titles: Sequence[str] | None = None,
) -> Figure:
    """One heatmap per head in a grid, sharing one colorbar from 0 to 1.

    weights: (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk) attention weights (rows sum to 1 or are 0);
        for a batch, ``batch`` picks the sequence.
    query_tokens / key_tokens: tick labels of the rows (queries) and columns (keys).
    heads: None = all heads, an int, or a list of head indices.
    mask: optional mask in our convention (bool True = may attend, or float with -inf = blocked),
        broadcastable to (B, H, Lq, Lk). Blocked cells (their weight is exactly 0) are drawn
        grey and hatched, so they never read as "a small weight".
    annotate: write each weight in its cell (for small maps).
    panel_titles: one title per panel shown instead of "head h" (may have several lines), e.g. to
        show heads of different layers side by side.
    Rows are queries ("who looks"), columns are keys ("at whom").
    """
    W = _as_bhqk(weights, "weights")
    B, H, Lq, Lk = W.shape
    b = _check_batch(batch, B, "weights")
    chosen = _pick_heads(H, heads)
    ylab = _labels(query_tokens, Lq, "query_tokens")
    xlab = _labels(key_tokens, Lk, "key_tokens")
    blocked = None if mask is None else blocked_cells(mask, (B, H, Lq, Lk))[b]
    names = [f"head {h}" for h in chosen] if panel_titles is None else [str(t) for t in panel_titles]
    if len(names) != len(chosen):
        raise ValueError(f"panel_titles has {len(names)} entries but {len(chosen)} heads are shown")

    nrows, ncols = _grid(len(chosen), ncols)
    cell = max(0.22, min(0.45, panel_size / max(Lq, Lk)))  # inches per cell, so labels stay readable
    where = f"batch {b}, " if B > 1 else ""
    fig, axes, cax = _panel_grid(
        len(chosen),
        ncols,
        Lq,
        Lk,
        cell,
        xlab,
        ylab,
        title=title or f"Attention weights ({where}{len(chosen)} of {H} heads)",
        title_lines=max(t.count("\n") + 1 for t in names),
        masked_key=blocked is not None,
    )
    im = None
    for i, (ax, h) in enumerate(zip(axes, chosen)):
        im = ax.imshow(W[b, h], vmin=0.0, vmax=1.0, cmap=cmap, aspect="equal", interpolation="nearest")
        if blocked is not None:
            _mark_blocked(ax, blocked[h])
        if annotate:
            _annotate(ax, W[b, h], None if blocked is None else blocked[h], 0.0, 1.0, ".2f")
        first_col = i % ncols == 0
        _set_ticks(ax, xlab, ylab, show_y=first_col, rotate=60 if _needs_rotation(xlab) else 0)
        ax.set_title(names[i], fontsize=10)
        ax.set_xlabel("key", fontsize=9)
        if first_col:
            ax.set_ylabel("query", fontsize=9)
    cbar = fig.colorbar(im, cax=cax)
    cbar.set_label("attention weight", fontsize=9)
    return fig


def plot_model_view(
    attentions,
    tokens: Sequence[str] | None = None,
    *,
    batch: int = 0,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    title: str | None = None,
    cell_size: float = 1.15,
    cmap: str = WEIGHT_CMAP,
) -> Figure:
    """A layers × heads grid of small attention maps (like bertviz's model view), colour range 0..1.

    attentions: a sequence with one (B, H, L, L) array per layer (as Hugging Face returns with
        ``output_attentions=True``), or one array (layers, H, L, L), or (layers, B, H, L, L).
    tokens: the L token strings; shown on the left column and the bottom row when L <= 24.
    batch: which sequence of the batch. layers / heads: subsets to show (default all).
    """
    if isinstance(attentions, np.ndarray):
        A = attentions
        if A.ndim == 4:
            A = A[:, None]  # (layers, 1, H, L, L)
            if batch != 0:
                raise ValueError(f"attentions with shape {attentions.shape} has no batch axis; batch must be 0")
    else:
        per_layer = [np.asarray(a) for a in attentions]
        if not per_layer:
            raise ValueError("attentions is empty")
        for i, a in enumerate(per_layer):
            if a.ndim != 4:
                raise ValueError(f"attentions[{i}] must be (B, H, L, L), got shape {a.shape}")
        A = np.stack(per_layer)  # (layers, B, H, L, L)
    if A.ndim != 5 or A.shape[-1] != A.shape[-2]:
        raise ValueError(
            f"attentions must be (layers, H, L, L), (layers, B, H, L, L) or a list of (B, H, L, L), got {A.shape}"
        )
    n_layers, B, H, L, _ = A.shape
    b = _check_batch(batch, B, "attentions")
    layer_ids = list(range(n_layers)) if layers is None else [int(i) for i in layers]
    head_ids = _pick_heads(H, heads)
    for i in layer_ids:
        if not 0 <= i < n_layers:
            raise ValueError(f"layer {i} out of range: attentions has {n_layers} layers")
    labels = _labels(tokens, L, "tokens")

    # A fixed layout in inches (constrained layout is slow with dozens of axes).
    nr, nc = len(layer_ids), len(head_ids)
    gap, right, top = 0.08, 1.0, 0.75
    cell = min(cell_size, (14.0 - 2.0 - gap * (nc - 1)) / nc)  # shrink the cells to fit 14 inches
    show_tokens = L * 0.09 <= cell  # at least ~6.5 pt per token label, else no tick labels
    left, bottom = (1.1, 0.9) if show_tokens else (0.5, 0.2)
    width = left + right + nc * cell + (nc - 1) * gap
    height = bottom + top + nr * cell + (nr - 1) * gap
    fig = Figure(figsize=(width, height))
    axs = fig.subplots(
        nr,
        nc,
        squeeze=False,
        gridspec_kw=dict(
            left=left / width,
            right=1 - right / width,
            bottom=bottom / height,
            top=1 - top / height,
            wspace=gap / cell,
            hspace=gap / cell,
        ),
    )
    im = None
    for r, layer in enumerate(layer_ids):
        for c, h in enumerate(head_ids):
            ax = axs[r, c]
            im = ax.imshow(A[layer, b, h], vmin=0.0, vmax=1.0, cmap=cmap, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if show_tokens and r == nr - 1:
                ax.set_xticks(range(L), labels, rotation=90, fontsize=6)
            if show_tokens and c == 0:
                ax.set_yticks(range(L), labels, fontsize=6)
            ax.tick_params(length=1.5, pad=1)
            if r == 0:
                ax.set_title(f"head {h}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
    cax = fig.add_axes((1 - (right - 0.2) / width, bottom / height, 0.14 / width, nr * cell / height * 0.98))
    cbar = fig.colorbar(im, cax=cax)
    cbar.set_label("attention weight", fontsize=9)
    fig.suptitle(title or "Attention of every layer and head (rows: queries, columns: keys)", fontsize=11)
    return fig


# --------------------------------------------------------------------------- masks


def plot_mask(
    mask,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | Sequence[Sequence[str]] | None = None,
    *,
    batch: int | None = None,
    head: int = 0,
    Lq: int | None = None,
    title: str | None = None,
) -> Figure:
    """A mask as a picture: which query (row) may attend to which key (column).

    mask: bool (True = may attend) or float (added to the scores, -inf = blocked), any shape that
        broadcasts to (B, H, Lq, Lk): (Lq, Lk), (B, 1, 1, Lk) padding masks, (B, H, Lq, Lk), ...
    Lq: the number of queries, to draw a (B, 1, 1, Lk) key padding mask as full rows
        (default: len(query_tokens), else 1).
    batch: None = one panel per sequence of the batch, or an int for one sequence.
    head: which head, when the mask differs per head.
    key_tokens: one list of tokens, or one list per sequence (padded batches have different tokens).
    A bool mask is drawn in two colours (may attend / blocked hatched grey); a float mask with its
    added values on a diverging scale, -inf cells hatched grey.
    """
    m = np.asarray(mask)
    if m.ndim < 2 or m.ndim > 4:
        raise ValueError(f"mask must have 2 to 4 dimensions (broadcastable to (B, H, Lq, Lk)), got shape {m.shape}")
    if m.dtype != np.bool_ and not np.issubdtype(m.dtype, np.floating):
        raise ValueError(f"mask must be bool (True = may attend) or float (added), got dtype {m.dtype} shape {m.shape}")
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)  # (B, H, Lq, Lk) up to broadcasting
    Lq = Lq if Lq is not None else (len(query_tokens) if query_tokens is not None else m.shape[2])
    if m.shape[2] not in (1, Lq):
        raise ValueError(f"mask with shape {np.shape(mask)} does not match Lq={Lq}")
    m = np.broadcast_to(m, (m.shape[0], m.shape[1], Lq, m.shape[3]))
    B, Hm, _, Lk = m.shape
    if not 0 <= head < Hm and Hm != 1:
        raise ValueError(f"head={head} out of range for a mask with {Hm} heads")
    m = m[:, head if Hm > 1 else 0]  # (B, Lq, Lk)
    batches = list(range(B)) if batch is None else [_check_batch(batch, B, "mask")]
    ylab = _labels(query_tokens, Lq, "query_tokens")
    per_seq = key_tokens is not None and len(key_tokens) > 0 and not isinstance(key_tokens[0], str)
    if per_seq and len(key_tokens) != B:
        raise ValueError(f"key_tokens has {len(key_tokens)} lists but the mask has batch size {B}")

    is_bool = m.dtype == np.bool_
    n = len(batches)
    nrows, ncols = _grid(n, None)
    cell = max(0.22, min(0.42, 2.6 / max(Lq, Lk)))
    xlabs = [_labels(key_tokens[bb] if per_seq else key_tokens, Lk, "key_tokens") for bb in batches]
    any_neginf = not is_bool and bool(np.isneginf(m[batches]).any())
    kind = "bool, True = may attend" if is_bool else "float, added to scores"
    fig, axes, cax = _panel_grid(
        n,
        ncols,
        Lq,
        Lk,
        cell,
        max(xlabs, key=lambda labs: max(len(t) for t in labs)),
        ylab,
        title=title or f"Mask {tuple(np.shape(mask))} ({kind})",
        title_lines=int(B > 1),
        masked_key=any_neginf,
    )
    im = None
    finite = m[np.isfinite(m)] if not is_bool else None
    vmax = float(np.abs(finite).max()) if finite is not None and finite.size else 1.0
    vmax = vmax if vmax > 0 else 1.0
    for i, (ax, bb) in enumerate(zip(axes, batches)):
        blocked = ~m[bb] if is_bool else np.isneginf(m[bb])
        if is_bool:
            cmap = ListedColormap([MASKED_FACE, "#2a788e"])
            im = ax.imshow(m[bb].astype(float), vmin=0, vmax=1, cmap=cmap, interpolation="nearest")
        else:
            shown = np.where(np.isfinite(m[bb]), m[bb], np.nan)
            im = ax.imshow(shown, vmin=-vmax, vmax=vmax, cmap=DIVERGING_CMAP, interpolation="nearest")
        _mark_blocked(ax, blocked)
        ax.set_xticks(np.arange(-0.5, Lk), minor=True)  # thin white lines between the cells
        ax.set_yticks(np.arange(-0.5, Lq), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.6)
        ax.tick_params(which="minor", length=0)
        _set_ticks(ax, xlabs[i], ylab, show_y=i % ncols == 0, rotate=60 if _needs_rotation(xlabs[i]) else 0)
        ax.set_xlabel("key", fontsize=9)
        if i % ncols == 0:
            ax.set_ylabel("query", fontsize=9)
        if B > 1:
            ax.set_title(f"sequence {bb}", fontsize=10)
    if is_bool:
        cbar = fig.colorbar(im, cax=cax, ticks=[0.25, 0.75])
        cbar.ax.set_yticklabels(["blocked\n(False)", "may\nattend\n(True)"], fontsize=8)
    else:
        cbar = fig.colorbar(im, cax=cax)
        cbar.set_label("added to the scores", fontsize=9)
    return fig


# --------------------------------------------------------------------------- any intermediate


def plot_step(
    array,
    title: str,
    *,
    batch: int = 0,
    row_tokens: Sequence[str] | None = None,
    col_tokens: Sequence[str] | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    heads: int | Sequence[int] | None = None,
    cmap: str | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar_label: str = "value",
) -> Figure:
    """Any intermediate as a labelled heatmap, with its full shape in the title.

    array: 1-D (N,), 2-D (rows, cols), 3-D (B, L, E) (``batch`` picks the sequence), or 4-D
        (B, H, L, d) or (B, H, Lq, Lk) (``batch`` picks the sequence; the heads side by side).
    row_tokens / col_tokens: tick labels of rows and columns (e.g. the tokens of a sequence).
    Colours: a diverging map centred on 0 when the array has negative entries, else viridis from 0;
        ``cmap`` / ``vmin`` / ``vmax`` override. ``-inf`` cells (masked scores) are hatched grey.
    """
    a = np.asarray(array)
    shape = a.shape
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim not in (2, 3, 4):
        raise ValueError(f"plot_step needs a 1-D to 4-D array, got shape {shape}")
    if a.ndim == 2:
        panels = [a]
        names = [None]
        default_x, default_y = "column", "row"
        where = ""
    elif a.ndim == 3:
        b = _check_batch(batch, a.shape[0], "array")
        panels, names = [a[b]], [None]
        default_x, default_y = "feature", "position"
        where = f", batch {b}" if a.shape[0] > 1 else ""
    else:
        b = _check_batch(batch, a.shape[0], "array")
        chosen = _pick_heads(a.shape[1], heads)
        panels = [a[b, h] for h in chosen]
        names = [f"head {h}" for h in chosen]
        default_x, default_y = "feature within the head", "position"
        where = f", batch {b}" if a.shape[0] > 1 else ""

    stacked = np.stack(panels).astype(np.float64)
    finite = stacked[np.isfinite(stacked)]
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    if cmap is None:
        cmap = DIVERGING_CMAP if lo < 0 else WEIGHT_CMAP
    if vmin is None and vmax is None and lo < 0:
        big = max(abs(lo), abs(hi)) or 1.0
        vmin, vmax = -big, big
    vmin = (0.0 if lo >= 0 else lo) if vmin is None else vmin
    vmax = (hi if hi > vmin else vmin + 1.0) if vmax is None else vmax

    rows, cols = stacked.shape[1:]
    ylab = _labels(row_tokens, rows, "row_tokens")
    xlab = _labels(col_tokens, cols, "col_tokens")
    n = len(panels)
    nrows, ncols = _grid(n, None)
    cell = max(0.16, min(0.42, 3.2 / max(rows, cols)))
    dense_x, dense_y = cols > 24 and col_tokens is None, rows > 24 and row_tokens is None
    any_blocked = bool(np.isneginf(stacked).any())
    fig, axes, cax = _panel_grid(
        n,
        ncols,
        rows,
        cols,
        cell,
        [] if dense_x else xlab,
        [] if dense_y else ylab,
        title=f"{title}  shape {shape}{where}",
        title_lines=int(any(names)),
        masked_key=any_blocked,
    )
    im = None
    for i, (ax, p, name) in enumerate(zip(axes, stacked, names)):
        shown = np.where(np.isfinite(p), p, np.nan)
        im = ax.imshow(shown, vmin=vmin, vmax=vmax, cmap=cmap, interpolation="nearest", aspect="equal")
        blocked = np.isneginf(p)
        if blocked.any():
            _mark_blocked(ax, blocked)
        if annotate:
            _annotate(ax, p, blocked, vmin, vmax, ".2f")
        _set_ticks(ax, xlab, ylab, show_y=i % ncols == 0, rotate=60 if _needs_rotation(xlab) else 0)
        if dense_x:
            ax.set_xticks([])
        if dense_y:
            ax.set_yticks([])
        if name:
            ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel or default_x, fontsize=9)
        if i % ncols == 0:
            ax.set_ylabel(ylabel or default_y, fontsize=9)
    cbar = fig.colorbar(im, cax=cax)
    cbar.set_label(colorbar_label, fontsize=9)
    return fig


# --------------------------------------------------------------------------- gradient check


def plot_gradcheck(report, title: str | None = None) -> Figure:
    """Per-tensor errors of a ``GradcheckReport`` on a log scale, against the tolerance lines.

    Each row is a dot at its ``max_rel_err`` (green = PASS, red = FAIL) with the ``rtol`` line.
    A row whose true gradient is zero (``zero_gradient``, e.g. b_k: softmax ignores a shift shared
    by all keys) has no scale for a relative error: it is drawn as a hollow square at its
    ``max_abs_err``, to be read against the ``atol`` line. Errors of exactly 0 sit at the bottom.
    """
    rows = list(report.rows)
    if not rows:
        raise ValueError("the report has no rows")
    floor = 1e-18
    names = [r.name for r in rows]
    x = np.arange(len(rows))
    fig = Figure(figsize=(max(6.0, min(12.0, 0.6 * len(rows) + 2.5)), 3.8), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(rows):
        color = "#2ca02c" if r.passed else "#d62728"
        if r.zero_gradient:
            y = max(r.max_abs_err, floor)
            ax.scatter([i], [y], marker="s", s=60, facecolor="white", edgecolor=color, linewidth=2, zorder=3)
            ax.annotate(
                "zero grad\n(abs err)", (i, y), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7
            )
        else:
            y = max(r.max_rel_err, floor)
            ax.scatter([i], [y], marker="o", s=50, color=color, zorder=3)
    ax.set_yscale("log")
    zero_rows = any(r.zero_gradient for r in rows)
    ax.axhline(report.rtol, color="#d62728", linestyle="--", linewidth=1.2, label=f"rtol = {report.rtol:g}")
    if zero_rows:
        ax.axhline(report.atol, color="#ff7f0e", linestyle=":", linewidth=1.2, label=f"atol = {report.atol:g}")
    ax.set_xticks(x, names, rotation=45 if len(rows) > 6 else 0, ha="right" if len(rows) > 6 else "center")
    ax.set_xlabel("gradient of")
    ax.set_ylabel("max relative error" + ("\n(□ zero grad: abs error)" if zero_rows else ""))
    ax.set_xlim(-0.6, len(rows) - 0.4)
    lo = min(min(max(r.max_rel_err if not r.zero_gradient else r.max_abs_err, floor) for r in rows), report.rtol)
    hi = max(max(r.max_rel_err if not r.zero_gradient else r.max_abs_err for r in rows), report.rtol)
    ax.set_ylim(lo / 30, hi * 30)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles += [
        ax.scatter([], [], marker="o", color="#2ca02c", label="PASS"),
        ax.scatter([], [], marker="o", color="#d62728", label="FAIL"),
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    n_fail = sum(not r.passed for r in rows)
    verdict = "all PASS" if n_fail == 0 else f"{n_fail} of {len(rows)} FAIL"
    ax.set_title(title or f"Finite-difference gradient check: {verdict}", fontsize=11)
    return fig


# --------------------------------------------------------------------------- the CLI tour


def write_tour_figures(out_dir, mha, query, key, value, mask, cache) -> list[Path]:
    """Write the step figures and the attention maps of one forward pass as PNG files.

    mha: the ``MultiHeadAttention``; query / key / value / mask: what was passed to ``forward``;
    cache: the ``MHACache`` it returned. ``out_dir`` is created when missing.
    Returns the written paths, in the order of the forward pass.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    P = mha.params
    merged, _ = F.merge_heads_forward(cache.context)  # (B, Lq, E)
    output, _ = F.linear_forward(merged, P["W_o"], P.get("b_o"))  # (B, Lq, E)
    B, H, Lq, Lk = cache.attn_weights.shape
    qt = [f"q{i}" for i in range(Lq)]
    kt = [f"k{j}" for j in range(Lk)]
    sc = dict(row_tokens=qt, col_tokens=kt, xlabel="key", ylabel="query")

    figures: list[tuple[str, Figure]] = [
        ("01_query.png", plot_step(query, "input query", row_tokens=qt, xlabel="feature (E)")),
        ("02_Q_heads.png", plot_step(cache.Q, "Q after projection and head split", row_tokens=qt)),
        ("03_K_heads.png", plot_step(cache.K, "K after projection and head split", row_tokens=kt)),
        ("04_V_heads.png", plot_step(cache.V, "V after projection and head split", row_tokens=kt)),
        ("05_scores.png", plot_step(cache.scores, "scores Q Kᵀ / sqrt(d)", **sc)),
    ]
    if mask is not None:
        figures.append(("06_mask.png", plot_mask(mask, qt, kt, Lq=Lq)))
        masked = cache.attention.masked_scores  # (B, H, Lq, Lk), -inf where blocked
        b_most = int(np.isneginf(masked).reshape(B, -1).sum(axis=1).argmax())  # the sequence the mask hits most
        figures.append(("07_masked_scores.png", plot_step(masked, "masked scores", batch=b_most, **sc)))
    for b in range(B):
        figures.append(
            (
                f"08_attention_batch{b}.png",
                plot_attention(cache.attn_weights, qt, kt, batch=b, mask=mask, annotate=Lk <= 8),
            )
        )
    figures += [
        ("09_context.png", plot_step(cache.context, "context = weights · V (per head)", row_tokens=qt)),
        ("10_merged.png", plot_step(merged, "heads merged", row_tokens=qt, xlabel="feature (E)")),
        ("11_output.png", plot_step(output, "output after W_o", row_tokens=qt, xlabel="feature (E)")),
    ]
    paths = []
    for name, fig in figures:
        path = out / name
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- training (mha_numpy.train)


def plot_training_history(history: dict, title: str | None = None) -> Figure:
    """Loss (log scale) and token accuracy against the training step, side by side.

    history: a dict with equal-length lists "step", "loss" and "accuracy" (as ``mha_numpy.train``
    records them: each value measured on that step's batch, before the update).
    """
    for key in ("step", "loss", "accuracy"):
        if key not in history:
            raise ValueError(f"history needs the key {key!r}, got keys {sorted(history)}")
    step = np.asarray(history["step"])
    loss = np.asarray(history["loss"], dtype=np.float64)
    acc = np.asarray(history["accuracy"], dtype=np.float64)
    fig = Figure(figsize=(9.0, 3.2), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(step, np.maximum(loss, 1e-12), color="#1f77b4", lw=1.2)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("cross-entropy loss (log scale)")
    ax_loss.set_title(f"loss: {loss[0]:.3g} at step {step[0]}, {loss[-1]:.2g} at step {step[-1]}", fontsize=10)
    ax_acc.plot(step, acc, color="#2ca02c", lw=1.2)
    ax_acc.axhline(1.0, color="0.6", lw=0.8, ls="--")
    ax_acc.set_ylim(0.0, 1.05)
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("token accuracy (batch)")
    ax_acc.set_title(f"accuracy: {acc[-1]:.3f} at step {step[-1]}", fontsize=10)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.suptitle(title or "Training", fontsize=11)
    return fig


def _position_ticks(ax, Lq: int, Lk: int, show_y: bool) -> None:
    """Position indices as ticks on short sequences, none on long ones (they would overlap)."""
    ax.set_xticks(range(Lk) if Lk <= 12 else [])
    ax.set_yticks(range(Lq) if Lq <= 12 else [])
    ax.tick_params(labelsize=7, length=2, labelleft=show_y)


def plot_attention_over_training(
    snapshots: dict,
    ideal: np.ndarray | None = None,
    title: str | None = None,
    panel_size: float = 1.9,
) -> Figure:
    """Attention maps at a few moments of training (columns), one row per head, the ideal map last.

    snapshots: {step: (H, Lq, Lk) weights} (e.g. averaged over a batch); one snapshot gives the
        "learned next to ideal" picture.
    ideal: optional (Lq, Lk) 0/1 map of where each query should look; each panel's title then says
        which share of the attention mass lands on it (1 = exactly the ideal pattern).
    """
    if not snapshots:
        raise ValueError("snapshots is empty: give at least one {step: (H, Lq, Lk) weights}")
    steps = sorted(snapshots)
    maps = [np.asarray(snapshots[s]) for s in steps]
    if any(m.ndim != 3 or m.shape != maps[0].shape for m in maps):
        raise ValueError(f"every snapshot must have the same (H, Lq, Lk) shape, got {[m.shape for m in maps]}")
    H, Lq, Lk = maps[0].shape
    if ideal is not None and np.shape(ideal) != (Lq, Lk):
        raise ValueError(f"ideal with shape {np.shape(ideal)} must be (Lq, Lk) = {(Lq, Lk)}")
    ncols = len(steps) + (ideal is not None)
    # per panel: the map plus room for its two-line title and tick labels
    fig = Figure(figsize=(panel_size * ncols + 1.2, (panel_size + 0.45) * H + 0.6), layout="constrained")
    axs = fig.subplots(H, ncols, squeeze=False)
    im = None
    for h in range(H):
        for c, (s, m) in enumerate(zip(steps, maps)):
            ax = axs[h, c]
            im = ax.imshow(m[h], vmin=0.0, vmax=1.0, cmap=WEIGHT_CMAP, interpolation="nearest")
            label = f"step {s}"
            if ideal is not None:
                share = float((m[h] * ideal).sum(axis=-1).mean())  # mass on the ideal keys, mean over queries
                label += f"\non ideal: {share:.0%}"
            ax.set_title(label if h == 0 or ideal is not None else "", fontsize=9)
            _position_ticks(ax, Lq, Lk, show_y=c == 0)
            if c == 0:
                ax.set_ylabel(f"head {h}\nquery", fontsize=9)
            if h == H - 1:
                ax.set_xlabel("key", fontsize=9)
        if ideal is not None:
            ax = axs[h, -1]
            ax.imshow(ideal, vmin=0.0, vmax=1.0, cmap=WEIGHT_CMAP, interpolation="nearest")
            ax.set_title("ideal" if h == 0 else "", fontsize=9, fontweight="bold")
            _position_ticks(ax, Lq, Lk, show_y=False)
            if h == H - 1:
                ax.set_xlabel("key", fontsize=9)
    cbar = fig.colorbar(im, ax=axs, shrink=0.9, aspect=25)
    cbar.set_label("attention weight", fontsize=9)
    fig.suptitle(title or "Attention during training (rows: queries, columns: keys)", fontsize=11)
    return fig
