"""The ring's schedule drawn: which block each rank holds at each step and which scores it computes.

``schedule_html(sharding, length, causal)`` -> one offline HTML page (a table, steps × ranks, and one L × L grid of
chunks per step coloured by the rank that computes each piece). ``schedule_figure`` -> the same grids as a
matplotlib figure (the ``viz`` extra; no pyplot: returned, never shown). Both read ``blocks.schedule``: what is
drawn is what the ring computes.
"""

from __future__ import annotations

import html

import numpy as np

from .._optional import require
from .blocks import schedule
from .shards import Sharding

COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


def owner_grid(sharding: Sharding, length: int, causal: bool, step: int) -> np.ndarray:
    """(C, C) over the sequence's C chunks: the rank that computes (query chunk, key chunk) at ``step``, or -1."""
    grid = np.full((sharding.n_chunks, sharding.n_chunks), -1)
    for rank, (owner, pieces) in enumerate(schedule(sharding, length, causal)[step]):
        for p in pieces:
            grid[sharding.chunk_ids(rank)[p.a], sharding.chunk_ids(owner)[p.b]] = rank
    return grid


def schedule_html(sharding: Sharding, length: int, causal: bool) -> str:
    """The schedule as one HTML page: what each rank holds and computes at each step, and each step's grid by rank."""
    P = sharding.size
    steps = schedule(sharding, length, causal)
    head = "".join(f"<th>step {s}</th>" for s in range(P))
    rows = []
    for r in range(P):
        cells = []
        for s in range(P):
            owner, pieces = steps[s][r]
            work = sum(p.entries for p in pieces)
            names = ", ".join(f"q{sharding.chunk_ids(r)[p.a]}·k{sharding.chunk_ids(owner)[p.b]}" for p in pieces)
            cells.append(f"<td>holds kv of rank {owner}<br><small>{names or 'nothing to compute'}<br>{work} scores"
                         "</small></td>")  # fmt: skip
        chunks = " ".join(f"[{a}, {b})" for a, b in sharding.chunks(r, length))
        rows.append(f"<tr><th style='color:{COLOURS[r % 8]}'>rank {r}<br><small>{chunks}</small></th>{''.join(cells)}"
                    "</tr>")  # fmt: skip
    grids = []
    for s in range(P):
        grid = owner_grid(sharding, length, causal, s)
        colours = [[COLOURS[x % 8] if x >= 0 else "#eee" for x in row] for row in grid]
        trs = "".join("<tr>" + "".join(f"<td class='g' style='background:{c}'></td>" for c in row) + "</tr>"
                      for row in colours)  # fmt: skip
        grids.append(f"<div class='grid'><b>step {s}</b><table>{trs}</table></div>")
    title = f"ring schedule: P = {P}, L = {length}, {sharding.layout}, {'causal' if causal else 'no mask'}"
    return f"""<!doctype html><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif}} td,th{{border:1px solid #ccc;padding:4px;vertical-align:top}}
table{{border-collapse:collapse}}
 td.g{{width:14px;height:14px;padding:0}} .grid{{display:inline-block;margin:8px}}</style>
<h1>{html.escape(title)}</h1>
<p>Forward: at step s rank r holds the keys and values of rank (r - s) mod P and sends them on to rank r + 1 while
it computes. Backward: the same walk once more, each block travelling with its dK, dV.</p>
<table><tr><th></th>{head}</tr>{"".join(rows)}</table>
<h2>Which rank computes each (query chunk, key chunk) piece</h2>
<p>Rows: query chunks, columns: key chunks, colour: the rank, grey: not computed (masked).</p>{"".join(grids)}
"""


def schedule_figure(sharding: Sharding, length: int, causal: bool):
    """A matplotlib figure: one (chunks × chunks) grid per step, each piece coloured by the rank computing it."""
    require("matplotlib", "ring --out (the schedule's figure)")
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    P = sharding.size
    cmap = ListedColormap(["#eeeeee", *[COLOURS[r % 8] for r in range(P)]])
    fig = Figure(figsize=(2.4 * P + 0.6, 2.8))
    axes = fig.subplots(1, P, squeeze=False)
    for s, ax in enumerate(axes[0]):
        ax.imshow(owner_grid(sharding, length, causal, s) + 1, cmap=cmap, vmin=0, vmax=P)
        ax.set_title(f"step {s}")
        ax.set_xlabel("key chunk")
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][0].set_ylabel("query chunk")
    handles = [Rectangle((0, 0), 1, 1, color=COLOURS[r % 8]) for r in range(P)]
    fig.legend(handles, [f"rank {r}" for r in range(P)], loc="lower center", ncol=min(P, 8), frameon=False)
    fig.suptitle(f"{sharding.layout}, {'causal' if causal else 'no mask'}: who computes which piece")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig
