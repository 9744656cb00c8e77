"""The picture of a gradient check: ``plot_gradcheck`` (a ``GradcheckReport`` on a log scale)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


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
